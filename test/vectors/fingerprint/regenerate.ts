// Rewrites the `expected` of every case in cases.json from the TypeScript implementation. Run
// it only when the specification changes on purpose (with PROTOCOL_VERSION bumped), and review
// the diff: the Python test then holds the other implementation to the new values.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { diskDigests } from '../../../src/native/diskDigests.js';
import { fullContentFingerprint, rankFingerprint } from '../../../src/checkpoint/fingerprint.js';
import { planCheckpoint } from '../../../src/checkpoint/planCheckpoint.js';
import { rankFingerprintFields } from '../../../src/checkpoint/rankFingerprintFields.js';
import { makeTempDir, removeDir } from '../../helpers/checkpoints.js';
import { materialize, readVectors, VECTORS_DIR } from './vectorCases.js';

const vectors = readVectors();
for (const c of vectors.cases) {
  const root = makeTempDir('vectors');
  try {
    const { modelDir, planFile } = materialize(vectors, c, root);
    if (c.error) continue;
    const plan = await planCheckpoint(modelDir, { tpSize: c.tpSize, planFile });
    const digests = await diskDigests(plan);
    const full = fullContentFingerprint(plan.fingerprintFields, digests);
    c.expected = {
      checkpointFingerprint: plan.fingerprint,
      fields: plan.fingerprintFields,
      ranks: plan.ranks.map((r, rank) => ({ fingerprint: r.fingerprint, tpRank: rankFingerprintFields(plan.fingerprintFields, rank).tpRank! })),
      full: {
        tensorDigests: Object.fromEntries(plan.ranks[0]!.contentTensors.names.map((n, i) => [n, digests[i]!])),
        content: full.fields.content!,
        checkpointFingerprint: full.fingerprint,
        rank0: rankFingerprint(full.fingerprint, 0),
      },
    };
  } finally {
    removeDir(root);
  }
}
writeFileSync(join(VECTORS_DIR, 'cases.json'), `${JSON.stringify(vectors, null, 2)}\n`);
