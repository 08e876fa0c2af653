// Whether a model's checkpoint files are still the ones it was planned from: same inode, size and
// modification time. Checked once its ranks are resident, before it serves, so that a directory
// rewritten while it loaded fails that load alone instead of serving a mix of two checkpoints.
import { statSync } from 'node:fs';
import { fromPromise } from 'xstate';
import { CheckpointError } from '../errors.js';

export interface FileIdentity {
  path: string;
  ino: number;
  size: number;
  mtimeMs: number;
}

export function fileIdentities(paths: readonly string[]): FileIdentity[] {
  return [...new Set(paths)].map((path) => {
    const st = statSync(path);
    return { path, ino: st.ino, size: st.size, mtimeMs: st.mtimeMs };
  });
}

/** Throws E_FILE_CHANGED naming the first file that differs from when the model was planned. */
export function checkFileIdentities(files: readonly FileIdentity[]): void {
  for (const f of files) {
    let now: FileIdentity | undefined;
    try {
      [now] = fileIdentities([f.path]);
    } catch {
      now = undefined;
    }
    if (now && now.ino === f.ino && now.size === f.size && now.mtimeMs === f.mtimeMs) continue;
    const what = now === undefined ? 'is gone' : now.ino !== f.ino ? 'was replaced' : now.size !== f.size ? `is ${now.size} bytes now, ${f.size} when it was planned` : 'was modified';
    throw new CheckpointError('E_FILE_CHANGED', `checkpoint file ${f.path} ${what} while the model loaded; the load is dropped. Load it again once the directory is complete`, { path: f.path });
  }
}

export const checkFiles = fromPromise<void, { files: FileIdentity[] }>(async ({ input }) => checkFileIdentities(input.files));
