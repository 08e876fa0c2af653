import type { TensorEntry } from '../checkpoint/types.js';
import type { Backend, DeviceInfo, SegmentExport } from '../native/addon.js';

/** Everything the serving layer needs to know about one resident rank. Plain data. */
export interface ServedRank {
  nodeRank: number;
  nnodes: number;
  localRank: number;
  globalRank: number;
  tpSize: number;
  backend: Backend;
  device: DeviceInfo;
  model: string;
  architecture: string;
  /** This rank's fingerprint (checkpoint fingerprint + rank). */
  fingerprint: string;
  /** Each fingerprinted field's own hash, so a mismatch can name the fields that differ. */
  fingerprintFields: Record<string, string>;
  tensors: TensorEntry[];
  aliases: Record<string, string>;
  segments: SegmentExport[];
}
