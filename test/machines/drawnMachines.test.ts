// Which machines a node's state-chart page draws, and that the model group (node 0's commit of a
// model across the nodes) is one of them on a group: drawn from its own definition, served in
// /statechart.json by a group node's inspect server, and printed by `weightd statechart`.
import pino from 'pino';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { drawnChart, pageMachinesFor } from '../../src/machines/drawnMachines.js';
import { DRAWN_MACHINE_NAMES } from '../../src/machines/drawnMachineNames.js';
import { EventFeed } from '../../src/inspect/eventFeed.js';
import { InspectServer } from '../../src/inspect/inspectServer.js';
import { chartStates, machineToMermaid } from '../../src/inspect/machineToMermaid.js';
import { NodeMetrics } from '../../src/inspect/nodeMetrics.js';
import { groupMemberMachine } from '../../src/machines/groupMemberMachine.js';
import { modelGroupMachine } from '../../src/models/modelGroupMachine.js';
import { modelRegistryMachine } from '../../src/models/modelRegistryMachine.js';
import { rankWorkerMachine } from '../../src/machines/rankWorkerMachine.js';
import type { NodeStatus } from '../../src/nodeStatus.js';
import { runCli } from '../helpers/runCli.js';
import { httpGet } from '../inspect/httpGet.js';

test('a node of one draws no group machine; a group node draws the coordinator and the model group too, every one a drawn machine', () => {
  assert.equal(pageMachinesFor(1), ['supervisor', 'rankService', 'rankWorker', 'modelRegistry', 'model']);
  assert.equal(pageMachinesFor(2), ['supervisor', 'coordinator', 'groupMember', 'rankService', 'rankWorker', 'modelRegistry', 'model', 'modelGroup']);
  for (const m of pageMachinesFor(2)) assert.ok(DRAWN_MACHINE_NAMES.includes(m), m);
});

test("the model group's chart has every state, and its votes and losses as transitions", () => {
  const chart = drawnChart('modelGroup');
  assert.is(chart.id, 'modelGroup');
  assert.is(chart.initial, 'modelGroup.gathering');
  assert.equal(chart.states.map((s) => [s.key, s.type]), [
    ['gathering', 'atomic'],
    ['loading', 'atomic'],
    ['committed', 'final'],
    ['aborted', 'final'],
  ]);
  const events = new Set(chart.transitions.map((t) => t.event));
  for (const e of ['JOIN', 'RESIDENT', 'FAILED', 'NODE_LOST']) assert.ok(events.has(e), `${e} drawn (${[...events]})`);
  assert.ok(chart.transitions.some((t) => t.kind === 'after'), 'the rendezvous deadline is drawn');
});

test("a rank's worker thread is drawn: its three regions, every phase, and the messages it takes out of order", async () => {
  const chart = drawnChart('rankWorker');
  assert.is(chart.id, 'rankWorker');
  const keys = new Set(chartStates(chart).map((s) => s.key));
  for (const s of ['rank', 'permission', 'keeper', 'opening', 'admitting', 'adopting', 'allocating', 'filling', 'verifying', 'exporting', 'serving', 'releasing', 'released', 'stopping', 'stopped', 'failed', 'keeping', 'dropping', 'withdrawn']) {
    assert.ok(keys.has(s), `${s} drawn`);
  }
  const events = new Set(chart.transitions.map((t) => t.event));
  for (const e of ['ADMIT', 'KEEP', 'UNKEEP', 'KEEP_AGAIN', 'RELEASE', 'STOP', 'EXPORTED']) assert.ok(events.has(e), `${e} drawn`);
  const printed = await runCli(['statechart', '--machine', 'rankWorker']);
  assert.is(printed.code, 0, printed.stderr);
  assert.is(printed.stdout, machineToMermaid(rankWorkerMachine));
});

test("a node's membership of its group is drawn on a group node's page, mirroring the coordinator's phases", async () => {
  const chart = drawnChart('groupMember');
  assert.is(chart.id, 'groupMember');
  assert.equal(chart.states.map((s) => [s.key, s.type]), [
    ['starting', 'compound'],
    ['loading', 'atomic'],
    ['serving', 'compound'],
    ['failed', 'final'],
    ['closed', 'final'],
  ]);
  const keys = new Set(chartStates(chart).map((s) => s.path.join('.')));
  for (const s of ['starting.connecting', 'starting.joining', 'starting.waiting', 'starting.retrying', 'serving.inGroup', 'serving.retrying', 'serving.connecting', 'serving.rejoining']) assert.ok(keys.has(s), `${s} drawn`);
  const events = new Set(chart.transitions.map((t) => t.event));
  for (const e of ['HELLO', 'WAITING', 'JOINED', 'GROUP_READY', 'REJECTED', 'LINK_CLOSED', 'NODE_READY', 'NODE_FAILED', 'MODEL_JOIN', 'CLOSE']) assert.ok(events.has(e), `${e} drawn`);
  assert.ok(chart.transitions.some((t) => t.kind === 'after' && t.label.includes('rendezvousDeadline')), 'the rendezvous deadline is drawn');
  const printed = await runCli(['statechart', '--machine', 'groupMember']);
  assert.is(printed.code, 0, printed.stderr);
  assert.is(printed.stdout, machineToMermaid(groupMemberMachine));
});

test("the model registry is drawn, and weightd statechart prints it: the node's models, apart from its life", async () => {
  const chart = drawnChart('modelRegistry');
  assert.equal(chart.states.map((s) => s.key), ['startup', 'running', 'stopping', 'stopped', 'stopTimedOut', 'halted']);
  const events = new Set(chart.transitions.map((t) => t.event));
  for (const e of ['MODEL_LOAD', 'MODEL_UNLOAD', 'MODEL_SERVING', 'MODEL_FAILED', 'MODEL_GROUP_COMMIT', 'MODEL_GROUP_ABORT', 'MODELS_STOP']) assert.ok(events.has(e), `${e} drawn`);
  const supervisor = new Set(drawnChart('supervisor').transitions.map((t) => t.event));
  for (const e of ['MODEL_SERVING', 'MODEL_FAILED', 'MODEL_GONE']) assert.not.ok(supervisor.has(e), `the supervisor no longer takes ${e}`);
  const printed = await runCli(['statechart', '--machine', 'modelRegistry']);
  assert.is(printed.code, 0, printed.stderr);
  assert.is(printed.stdout, machineToMermaid(modelRegistryMachine));
});

test('a returning keeper is drawn: the supervisor, the model registry and the model take KEEPER_BACK', () => {
  for (const m of ['supervisor', 'modelRegistry', 'model'] as const) assert.ok(drawnChart(m).transitions.some((t) => t.event === 'KEEPER_BACK'), `${m} draws KEEPER_BACK`);
});

test("a group node's inspect server serves the model group's chart, and weightd statechart prints it", async () => {
  const log = pino({ level: 'silent' });
  const feed = new EventFeed();
  const status = () => ({ state: 'ready', nnodes: 2, nodeRank: 0, ranks: [], models: [], peers: [] }) as unknown as NodeStatus;
  const metrics = new NodeMetrics({ status, feed, states: () => drawnChart('supervisor').states.map((s) => s.key) });
  const server = await InspectServer.listen({ host: '127.0.0.1', port: 0, log, status, feed, metrics, charts: pageMachinesFor(2).map(drawnChart) });
  try {
    const json = JSON.parse((await httpGet(`${server.url}/statechart.json`)).body) as { machines: Array<{ chart: { id: string }; mermaid: string; mermaidIds: Record<string, string> }> };
    assert.equal(json.machines.map((m) => m.chart.id), ['supervisor', 'coordinator', 'groupMember', 'rankService', 'rankWorker', 'modelRegistry', 'model', 'modelGroup']);
    const group = json.machines.at(-1)!;
    assert.is(group.mermaid, machineToMermaid(modelGroupMachine));
    assert.equal(Object.keys(group.mermaidIds), ['gathering', 'loading', 'committed', 'aborted']);
  } finally {
    await server.close();
    metrics.close();
  }
  const printed = await runCli(['statechart', '--machine', 'modelGroup']);
  assert.is(printed.code, 0, printed.stderr);
  assert.is(printed.stdout, machineToMermaid(modelGroupMachine));
});

test.run();
