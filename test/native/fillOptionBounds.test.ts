// --load-threads and --staging-mb are bounded when the options are resolved, with the flag's
// name in the error; zero used to pass (and threads past 2^32 to wrap in the addon).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { UsageError } from '../../src/errors.js';
import { MAX_LOAD_THREADS, MAX_STAGING_MIB, resolveNodeOptions } from '../../src/nodeOptions.js';
import { exampleModel } from '../helpers/paths.js';

const MiB = 2 ** 20;
const resolve = (fill: { threads?: number; stagingBytes?: number }) => resolveNodeOptions({ model: exampleModel, fill });

for (const [flag, fill] of [
  ['--load-threads', { threads: 0 }],
  ['--load-threads', { threads: MAX_LOAD_THREADS + 1 }],
  ['--load-threads', { threads: 2 ** 32 }],
  ['--load-threads', { threads: 1.5 }],
  ['--staging-mb', { stagingBytes: 0 }],
  ['--staging-mb', { stagingBytes: (MAX_STAGING_MIB + 1) * MiB }],
  ['--staging-mb', { stagingBytes: -MiB }],
] as const) {
  test(`${flag} ${JSON.stringify(fill)} is a usage error naming the flag and the range`, async () => {
    try {
      await resolve(fill);
      assert.unreachable('accepted');
    } catch (err) {
      assert.instance(err, UsageError);
      assert.is((err as UsageError).code, 'E_USAGE');
      assert.match((err as Error).message, new RegExp(`^${flag} .*must be an integer from 1 to \\d+`));
    }
  });
}

test('fill.digestOn other than gpu or cpu is a usage error naming the option, before any fill, commit or publish hashes with it', async () => {
  const refused = await resolveNodeOptions({ model: exampleModel, fill: { digestOn: 'tpu' as 'cpu' } }).then(() => undefined, (e: unknown) => e);
  assert.instance(refused, UsageError);
  assert.is((refused as Error).message, `fill.digestOn "tpu": is not where digests are hashed; pass 'gpu' or 'cpu', or leave it out for WEIGHTD_FILL_DIGESTS_ON (default gpu)`);
  assert.equal((await resolveNodeOptions({ model: exampleModel, fill: { digestOn: 'cpu' } })).fill, { digestOn: 'cpu' });
});

test('values inside the bounds pass unchanged', async () => {
  const c = await resolve({ threads: MAX_LOAD_THREADS, stagingBytes: 64 * MiB });
  assert.equal(c.fill, { threads: MAX_LOAD_THREADS, stagingBytes: 64 * MiB });
});

test.run();
