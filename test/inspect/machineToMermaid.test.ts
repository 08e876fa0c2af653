// The chart is drawn from the machine's own definition: every state, initial state, event,
// guard, delay and invoked actor of the supervisor (and of its model registry) appears, and a machine with nested and
// parallel states (a parallel root too) and combined guards is drawn as well. `weightd statechart` prints the same.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { and, createMachine, not, setup } from 'xstate';
import { chartStates, chartToMermaid, machineToChart, machineToMermaid, mermaidStateId } from '../../src/inspect/machineToMermaid.js';
import { supervisorMachine } from '../../src/machines/supervisor.js';
import { modelRegistryMachine } from '../../src/models/modelRegistryMachine.js';
import { runCli } from '../helpers/runCli.js';

const chart = machineToChart(supervisorMachine);

test('every supervisor state, with its type, initial state and final states', () => {
  const byKey = Object.fromEntries(chart.states.map((s) => [s.key, s]));
  assert.equal(Object.keys(byKey), Object.keys(supervisorMachine.root.states));
  assert.is(chart.initial, 'supervisor.init');
  assert.is(byKey.stopped!.type, 'final');
  assert.is(byKey.failed!.type, 'final');
  assert.is(byKey.loading!.type, 'atomic');
  assert.equal(byKey.loading!.entry, ['spawnModelRegistry']);
  assert.equal(byKey.init!.invoke, [{ id: 'prepare', src: 'prepareNode' }]);
  assert.equal(byKey.stopping!.entry, ['stopModels']);
  // xstate's own timer action behind `after` is not a user action.
  assert.equal(machineToChart(modelRegistryMachine).states.find((s) => s.key === 'stopping')!.entry, ['stopModels']);
});

test('transitions carry their events, guards, delays, actions and targets', () => {
  const find = (source: string, label: string) => chart.transitions.find((t) => t.source === `supervisor.${source}` && t.label === label);
  const registry = machineToChart(modelRegistryMachine);
  const findInRegistry = (source: string, label: string) => registry.transitions.find((t) => t.source === `modelRegistry.${source}` && t.label === label);
  assert.equal(findInRegistry('startup', 'always'), {
    source: 'modelRegistry.startup', event: '', kind: 'always', label: 'always', targets: ['modelRegistry.running'], guard: 'startupModelsServing', actions: ['tellNodeServing'],
  });
  assert.equal(find('init', 'prepareNode done')?.targets, ['supervisor.rendezvous']);
  assert.is(find('init', 'prepareNode done')?.kind, 'done');
  assert.is(find('init', 'prepareNode error')?.event, 'xstate.error.actor.prepare');
  const timeout = findInRegistry('stopping', 'after stopTimeout');
  assert.is(timeout?.kind, 'after');
  assert.is(timeout?.delay, 'stopTimeout');
  assert.equal(timeout?.targets, ['modelRegistry.stopTimedOut']);
  assert.equal(find('stopping', 'MODELS_STOP_TIMED_OUT')?.actions, ['recordStopTimeout']);
  assert.equal(find('loading', 'MODEL_FAILS_NODE')?.actions, ['recordModelFailure', 'notifyGroupOfFailure']);
  assert.equal(find('ready', 'MODELS_LISTED')?.targets, [], 'handled in place');
  const root = chart.transitions.find((t) => t.source === 'supervisor');
  assert.equal(root?.event, 'GROUP_FAILED');
  assert.equal(root?.targets, ['supervisor.failed']);
});

test('mermaid text: states, descriptions, merged edges, the root transition in every non-final state', () => {
  const text = machineToMermaid(supervisorMachine);
  const lines = text.trim().split('\n');
  assert.is(lines[0], 'stateDiagram-v2');
  for (const l of [
    '  [*] --> init',
    '  state "loading" as loading',
    '  loading : entry / spawnModelRegistry',
    '  ready : MODELS_LISTED / republishManifest',
    '  ready : invoke publishNodeManifest',
    '  stopped --> [*]',
    '  failed --> [*]',
    '  loading --> starting : GROUP_MODEL_STARTING',
    '  starting --> ready : STARTUP_MODELS_SERVING',
    '  init --> rendezvous : prepareNode done',
    '  stopping --> failed : MODELS_STOP_TIMED_OUT<br/>GROUP_FAILED',
    '  rendezvous --> failed : GROUP_FAILED',
  ]) {
    assert.ok(lines.includes(l), `missing line ${JSON.stringify(l)} in\n${text}`);
  }
  assert.not.ok(lines.some((l) => l.startsWith('  stopped --> failed') || l.startsWith('  failed --> failed')), 'final states take no transitions');
  assert.is(new Set(lines.filter((l) => l.includes(' --> ') && !l.includes('[*]')).map((l) => l.split(' : ')[0])).size, lines.filter((l) => l.includes(' --> ') && !l.includes('[*]')).length, 'one edge per pair of states');
});

test('nested and parallel states, combined guards, numeric delays, keyword-named states', () => {
  const m = setup({ guards: { ok: () => true, fresh: () => true } }).createMachine({
    id: 'demo',
    initial: 'outer',
    states: {
      outer: {
        initial: 'note',
        states: {
          note: { on: { GO: { target: 'end', guard: and(['ok', not('fresh')]) } } },
          end: { type: 'final' },
        },
        onDone: 'both',
      },
      both: {
        type: 'parallel',
        states: {
          a: { initial: 'a1', states: { a1: { after: { 500: 'a2' } }, a2: {} } },
          b: { initial: 'b1', states: { b1: {} } },
        },
      },
    },
  });
  const c = machineToChart(m);
  assert.equal(chartStates(c).map((s) => s.path.join('.')), ['outer', 'outer.note', 'outer.end', 'both', 'both.a', 'both.a.a1', 'both.a.a2', 'both.b', 'both.b.b1']);
  assert.is(mermaidStateId(['note']), 'state_note', 'a grammar keyword is renamed');
  const go = c.transitions.find((t) => t.event === 'GO');
  assert.is(go?.guard, '(ok && !fresh)');
  assert.is(c.transitions.find((t) => t.kind === 'after')?.label, 'after 500 ms');
  const text = chartToMermaid(c);
  assert.match(text, /state "outer" as outer \{\n {4}\[\*\] --> outer__note\n/);
  // Each region is drawn as its states alone, named on its initial arrow, between separators.
  assert.match(text, /state "both" as both \{\n {4}\[\*\] --> both__a__a1 : a\n {4}state "a1" as both__a__a1\n {4}state "a2" as both__a__a2\n {4}--\n {4}\[\*\] --> both__b__b1 : b\n/);
  assert.match(text, /outer__note --> outer__end : GO \[\(ok && !fresh\)\]/);
  assert.match(text, /both__a__a1 --> both__a__a2 : after 500 ms/);
});

test('a parallel root draws its regions as concurrent regions of one box, which carries the root\'s transitions', () => {
  const m = createMachine({
    id: 'worker',
    type: 'parallel',
    on: { RESET: '.a.a1' },
    states: {
      a: { initial: 'a1', states: { a1: { on: { GO: 'a2' } }, a2: { type: 'final' } } },
      // A region with transitions and an actor of its own: drawn from each of its states that is not final.
      b: { initial: 'b1', invoke: { src: 'poll' }, on: { POKE: '.b2', AGAIN: 'b' }, states: { b1: {}, b2: {} } },
      c: {},
    },
  });
  const c = machineToChart(m);
  assert.is(c.type, 'parallel');
  assert.is(
    chartToMermaid(c),
    [
      'stateDiagram-v2',
      '  state "worker" as worker {',
      '    [*] --> a__a1 : a',
      '    state "a1" as a__a1',
      '    state "a2" as a__a2',
      '    a__a2 --> [*]',
      '    --',
      '    [*] --> b__b1 : b<br/>invoke poll',
      '    state "b1" as b__b1',
      '    state "b2" as b__b2',
      '    --',
      '    c',
      '  }',
      '  a__a1 --> a__a2 : GO',
      '  b__b1 --> b__b2 : POKE',
      '  b__b2 --> b__b2 : POKE',
      '  b__b1 --> b__b1 : AGAIN',
      '  b__b2 --> b__b1 : AGAIN',
      '  worker --> a__a1 : RESET',
      '',
    ].join('\n'),
  );
  assert.is(machineToChart(supervisorMachine).type, 'compound');
});

test('a machine with no transitions at all still draws', () => {
  const text = machineToMermaid(createMachine({ id: 'one', initial: 'only', states: { only: {} } }));
  assert.is(text, 'stateDiagram-v2\n  [*] --> only\n  only\n');
});

test('weightd statechart prints both forms without starting a node', async () => {
  const json = await runCli(['statechart', '--format', 'json']);
  assert.is(json.code, 0, json.stderr);
  assert.equal(JSON.parse(json.stdout), chart);
  assert.is(json.stderr, '', 'no node started, nothing logged');
  const mermaid = await runCli(['statechart']);
  assert.is(mermaid.code, 0, mermaid.stderr);
  assert.is(mermaid.stdout, machineToMermaid(supervisorMachine));
  const bad = await runCli(['statechart', '--format', 'svg']);
  assert.is(bad.code, 2);
  assert.match(bad.stderr, /argument 'svg' is invalid/);
  const help = await runCli(['--help']);
  assert.match(help.stdout, /statechart/);
  assert.match(help.stdout, /--inspect-port/);
});

test.run();
