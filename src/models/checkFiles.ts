// Whether a model's checkpoint files are still the ones it was planned from (the identity rule:
// src/files/fileIdentity.ts). Checked once its ranks are resident, before it serves, so that a
// directory rewritten while it loaded fails that load alone instead of serving a mix of two
// checkpoints.
import { fromPromise } from 'xstate';
import { checkFileIdentities, type FileIdentity } from '../files/fileIdentity.js';

export const checkFiles = fromPromise<void, { files: FileIdentity[] }>(({ input }) =>
  checkFileIdentities(input.files, 'while the model loaded', 'the load is dropped. Load it again once the directory is complete'),
);
