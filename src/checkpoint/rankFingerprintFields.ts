// The per-field hashes a rank is compared on. The checkpoint's fields (fingerprint.ts) are the
// same on every rank, so the rank itself is one more field: a client that asks the wrong socket
// for its rank is then told "tpRank" differs instead of an unexplained "fingerprint".
// Both the daemon (building a rank's ServedRankData) and clients (expectedFingerprint) use this.
import { sha256Hex } from './fingerprint.js';

export function rankFingerprintFields(checkpointFields: Record<string, string>, tpRank: number): Record<string, string> {
  return { ...checkpointFields, tpRank: sha256Hex(String(tpRank)) };
}
