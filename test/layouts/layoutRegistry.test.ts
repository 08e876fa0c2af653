// A second engine layout is one EngineLayout plus one registration: this test registers a trivial
// one ("flat": every loaded tensor a parameter of its own, renamed) and finds it planned and
// served in a rank's plan, accepted by --layouts, a --models file and `weightd ctl load`'s
// request, and listed in the one error every place gives for a layout nobody registered.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { EngineLayout } from '../../src/checkpoint/layouts/engineLayout.js';
import { layoutNames, registerLayout } from '../../src/checkpoint/layouts/layoutRegistry.js';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { parseArgs } from '../../src/cli/parseArgs.js';
import { LoadControl } from '../../src/control/controlProtocol.js';
import { ShardingError, UsageError } from '../../src/errors.js';
import { resolveNodeOptions } from '../../src/nodeOptions.js';
import { exampleModel, freshTempDir } from '../helpers/paths.js';

const flat: EngineLayout = {
  name: 'flat',
  engine: 'Flat',
  params: (_architecture, names) => names.map((name) => ({ name: `flat.${name}`, members: [name], experts: 0 })),
};
registerLayout(flat);

async function refusal(p: Promise<unknown> | (() => unknown)): Promise<Error> {
  try {
    await (typeof p === 'function' ? p() : p);
  } catch (err) {
    return err as Error;
  }
  throw new Error('expected a refusal');
}

test('the registry lists checkpoint, the built-in vllm, then the registered one; a name twice or unfit for --layouts is refused', async () => {
  assert.equal(layoutNames(), ['checkpoint', 'vllm', 'flat']);
  assert.match((await refusal(() => registerLayout(flat))).message, /"flat" is registered already/);
  assert.match((await refusal(() => registerLayout({ ...flat, name: 'checkpoint' }))).message, /"checkpoint" is registered already/);
  assert.match((await refusal(() => registerLayout({ ...flat, name: 'a,b' }))).message, /"a,b" is not 1-64 lower-case letters/);
});

test('a registered layout is planned: each rank serves its views over the same bytes as the checkpoint\'s', async () => {
  const plan = await planCheckpoint(exampleModel, { tpSize: 2, layouts: ['flat'] });
  assert.equal(plan.layouts, ['checkpoint', 'flat']);
  assert.equal(plan.refusedLayouts, {});
  for (const rank of plan.ranks) {
    const views = rank.layouts.flat!.tensors;
    assert.equal(views.map((v) => v.name), rank.tensors.map((t) => `flat.${t.name}`));
    for (const [i, v] of views.entries()) {
      const t = rank.tensors[i]!;
      assert.equal({ dtype: v.dtype, shape: v.shape, offset: v.offset, bytes: v.bytes }, { dtype: t.dtype, shape: t.shape, offset: t.offset, bytes: t.bytes }, t.name);
    }
  }
});

test('a second engine layout beside the first is refused alone (E_LAYOUT_COMBINATION); the first is served', async () => {
  const plan = await planCheckpoint(exampleModel, { tpSize: 1, layouts: ['flat', 'vllm'] });
  assert.equal(plan.layouts, ['checkpoint', 'vllm']);
  assert.is(plan.refusedLayouts.flat?.code, 'E_LAYOUT_COMBINATION');
  assert.match(plan.refusedLayouts.flat!.message, /"flat" cannot be planned beside "vllm"/);
});

test('--layouts, a --models file and a ctl load request accept it through the registry', async () => {
  const config = await resolveNodeOptions(parseArgs(['--model', exampleModel, '--layouts', 'checkpoint,flat']));
  assert.equal(config.models[0]!.layouts, ['checkpoint', 'flat']);
  const file = join(freshTempDir(), 'models.json');
  writeFileSync(file, JSON.stringify({ models: [{ dir: exampleModel, layouts: ['flat'] }] }));
  assert.equal((await resolveNodeOptions(parseArgs(['--models', file]))).models[0]!.layouts, ['flat']);
  assert.ok(LoadControl.safeParse({ cmd: 'load', model: exampleModel, layouts: ['flat'] }).success);
});

test('an unknown layout: each place refuses it naming every registered layout', async () => {
  const usage = await refusal(resolveNodeOptions(parseArgs(['--model', exampleModel, '--layouts', 'checkpoint,sglang'])));
  assert.instance(usage, UsageError);
  assert.match(usage.message, /--layouts .*sglang.*: names a layout weightd does not plan; use a comma-separated list of checkpoint, vllm, flat/);

  const file = join(freshTempDir(), 'models.json');
  writeFileSync(file, JSON.stringify({ models: [{ dir: exampleModel, layouts: ['sglang'] }] }));
  assert.match((await refusal(resolveNodeOptions(parseArgs(['--models', file])))).message, /layout "sglang" is not one weightd plans; the layouts are checkpoint, vllm, flat/);

  const load = LoadControl.safeParse({ cmd: 'load', model: exampleModel, layouts: ['sglang'] });
  assert.ok(!load.success && load.error.issues[0]!.message === 'layout "sglang" is not one weightd plans; the layouts are checkpoint, vllm, flat', JSON.stringify(load.error?.issues));

  const planned = await refusal(planCheckpoint(exampleModel, { tpSize: 1, layouts: ['sglang'] }));
  assert.instance(planned, ShardingError);
  assert.is((planned as ShardingError).code, 'E_LAYOUT_UNKNOWN');
  assert.match(planned.message, /layout "sglang" is not one weightd plans; the layouts are checkpoint, vllm, flat/);
});

test.run();
