// The live state-chart page in headless Chromium (Debian's chromium, driven by playwright-core):
// it draws the supervisor's and the rendezvous coordinator's charts, and their highlights follow
// a real node from rendezvous through loading to ready. The node is node 0 of a two-node group,
// so it hosts the coordinator and waits in rendezvous, with the page already open and showing
// node 1 missing, until node 1 (a daemon process) joins; every later state then arrives live.
// Screenshots go to test/artifacts/. Without chromium the test is skipped, saying why.
import { existsSync, mkdirSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import pino from 'pino';
import { chromium, type Browser, type Page } from 'playwright-core';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createMachine } from 'xstate';
import { machineToMermaid } from '../../src/inspect/machineToMermaid.js';
import { rankWorkerMachine } from '../../src/machines/rankWorkerMachine.js';
import { startNode } from '../../src/index.js';
import { WeightdClient } from '../../src/client/index.js';
import { startDaemon } from '../helpers/daemon.js';
import { exampleModel, freshSocketDir, repoRoot } from '../helpers/paths.js';

const CHROMIUM = process.env.WEIGHTD_CHROMIUM ?? '/usr/bin/chromium';
// The flags that work in containers without a GPU or network (docs: toolchain.md).
const FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--no-first-run', '--disable-sync'];
const ARTIFACTS = join(repoRoot, 'test/artifacts');

async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()));
  const { port } = srv.address() as { port: number };
  await new Promise((r) => srv.close(r));
  return port;
}

async function waitFor(what: string, check: () => boolean, ms = 20_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

// Code that runs in the page is passed as text: this project compiles without the DOM types.
// Waits are the exception: a text predicate that is false at first is polled through eval in the
// page, which the page's Content-Security-Policy forbids (a wait that was not already true failed),
// so waits pass functions, which read the page's document through globalThis.


/** The text of a chart's highlighted state, and the value the page says it highlights. */
function highlighted(page: Page, machine = 'supervisor'): Promise<{ attr: string | undefined; text: string[] }> {
  return page.evaluate(`({
    attr: document.getElementById('chart-${machine}').dataset.highlighted,
    text: [...document.querySelectorAll('#chart-${machine} g.wd-current')].map((g) => g.textContent),
  })`);
}

function highlightIs(page: Page, state: string, machine = 'supervisor'): Promise<unknown> {
  return page.waitForFunction(({ machine, state }) => (globalThis as any).document.getElementById(`chart-${machine}`)?.dataset.highlighted === state, { machine, state }, { timeout: 10_000 });
}

/** Records every value a chart's highlight takes from now on, in order, however quickly they follow. */
function watchHighlight(page: Page, machine: string): Promise<unknown> {
  return page.evaluate(`{
    const chart = document.getElementById('chart-${machine}');
    window.seen = window.seen ?? {};
    const seen = (window.seen['${machine}'] = []);
    new MutationObserver((records) => {
      for (const r of records) seen.push(r.oldValue ?? '');
      seen.push(chart.dataset.highlighted ?? '');
    }).observe(chart, { attributes: true, attributeFilter: ['data-highlighted'], attributeOldValue: true });
  }`);
}

async function highlightsSeen(page: Page, machine: string): Promise<string[]> {
  return (await page.evaluate<string[]>(`window.seen['${machine}']`)).filter((v, i, a) => v !== '' && v !== a[i - 1]);
}

if (!existsSync(CHROMIUM)) {
  console.log(`SKIPPED: no Chromium at ${CHROMIUM}. Install Debian's (apt-get install -y chromium) or set WEIGHTD_CHROMIUM to a Chromium binary to run the state-chart page in a browser.`);
  test.skip('the state-chart page in headless Chromium', () => {});
} else {
  let browser: Browser;
  test.before(async () => {
    browser = await chromium.launch({ executablePath: CHROMIUM, args: FLAGS });
    mkdirSync(ARTIFACTS, { recursive: true });
  });
  test.after(async () => {
    await browser?.close();
  });

  test('the page draws both charts; their highlights follow node 0 from rendezvous to ready; it shows who is missing', async () => {
    const port = await freePort();
    // Node 0 lives in this process; its one host device must differ from node 1's.
    process.env.WEIGHTD_HOST_DEVICES = `page-${process.pid}-0`;
    const node = await startNode({
      model: exampleModel, tensorParallelSize: 2, nnodes: 2, nodeRank: 0, weightCacheMasterPort: port,
      device: 'host', socketDir: freshSocketDir(), logger: pino({ level: 'silent' }), inspect: { port: 0 },
    });
    const page = await browser.newPage({ viewport: { width: 1500, height: 1000 } });
    const problems: string[] = [];
    page.on('console', (m) => m.type() === 'error' && problems.push(`console: ${m.text()}`));
    page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
    let peer: Awaited<ReturnType<typeof startDaemon>> | undefined;
    try {
      await waitFor('rendezvous', () => node.status().state === 'rendezvous');
      await page.goto(`${node.inspectUrl}/statechart`);
      await page.waitForSelector('#chart-coordinator svg g.node', { timeout: 20_000 });
      await highlightIs(page, 'rendezvous');
      assert.equal(await highlighted(page), { attr: 'rendezvous', text: ['rendezvousentry / joinGroupGROUP_WAITING / recordFormation'] });
      const drawn = (machine: string): Promise<string[]> =>
        page.evaluate(`[...document.querySelectorAll('#chart-${machine} g.node')].map((g) => g.id).filter((id) => id.startsWith('wd-${machine}-state-'))`);
      const states = await drawn('supervisor');
      for (const s of ['init', 'rendezvous', 'loading', 'starting', 'ready', 'stopping', 'stopped', 'failed']) {
        assert.ok(states.some((id) => id.startsWith(`wd-supervisor-state-${s}-`)), `state ${s} drawn (${states})`);
      }
      const coordinatorStates = await drawn('coordinator');
      for (const s of ['gathering', 'loading', 'serving', 'failed__informing', 'failed__pastDeadline', 'failed__delivered', 'closed']) {
        assert.ok(coordinatorStates.some((id) => id.startsWith(`wd-coordinator-state-${s}-`)), `coordinator state ${s} drawn (${coordinatorStates})`);
      }
      await highlightIs(page, 'gathering', 'coordinator');
      // Node 0 joined its own coordinator; node 1 has not started yet.
      await page.waitForFunction(() => (globalThis as any).document.querySelectorAll('#peers li[data-state]').length === 2, undefined, { timeout: 10_000 });
      const formation = await page.evaluate(`[...document.querySelectorAll('#peers li')].map((li) => [li.dataset.node, li.dataset.state, li.textContent])`);
      assert.equal(formation, [['0', 'joined', 'node 0 (this node): joined'], ['1', 'missing', 'node 1: missing']]);
      await page.screenshot({ path: join(ARTIFACTS, 'statechart-rendezvous.png'), fullPage: true });

      await watchHighlight(page, 'supervisor');
      await watchHighlight(page, 'coordinator');
      peer = await startDaemon({
        model: exampleModel, tp: 2, devices: [`page-${process.pid}-1`], socketDir: freshSocketDir(),
        extraArgs: ['--nnodes', '2', '--node-rank', '1', '--weight-cache-master-port', String(port)],
      });
      await node.ready;
      await highlightIs(page, 'ready');
      await highlightIs(page, 'serving', 'coordinator');
      await highlightIs(page, 'running', 'modelRegistry');
      assert.equal(await highlightsSeen(page, 'supervisor'), ['rendezvous', 'loading', 'starting', 'ready'], 'the highlight went through every state the node did');
      assert.equal(await highlightsSeen(page, 'coordinator'), ['gathering', 'loading', 'serving'], 'and the coordinator through formation and the ready barrier');
      const now = await highlighted(page);
      assert.is(now.attr, 'ready');
      assert.is(now.text.length, 1);
      assert.ok(now.text[0]!.startsWith('readyentry / announceReady'), now.text[0]);

      const ranks = await page.evaluate(`[...document.querySelectorAll('#ranks tbody tr')].map((r) => [r.dataset.rank, r.dataset.state])`);
      assert.equal(ranks, [['0', 'serving']]);
      const events: string[] = await page.evaluate(`[...document.querySelectorAll('#events li code')].map((c) => c.textContent)`);
      for (const t of ['GROUP_JOINED', 'RANK_LOADED', 'RANK_SERVING']) assert.ok(events.includes(t), `${t} listed: ${events}`);
      assert.ok(events.includes('prepare done') && events.includes('start group'), `operator names: ${events}`);
      assert.equal(events.filter((t) => /xstate\.|^\d+\./.test(t)), [], 'no internal names');
      // Newest first: going down the list, sequence numbers and timestamps both go back.
      const rows: Array<[number, string | null]> = await page.evaluate(`[...document.querySelectorAll('#events li')].map((li) => [li.value, li.querySelector('time').getAttribute('datetime')])`);
      assert.ok(rows.length > 0 && rows.every(([, t]) => t !== null && !Number.isNaN(Date.parse(t))), 'each event has its timestamp');
      for (let i = 1; i < rows.length; i++) {
        assert.ok(rows[i]![0] < rows[i - 1]![0] && Date.parse(rows[i]![1]!) <= Date.parse(rows[i - 1]![1]!), `row ${i}: ${JSON.stringify(rows.slice(i - 1, i + 1))}`);
      }
      await page.waitForFunction(() => /node 1 \(.*\): up/.test((globalThis as any).document.getElementById('peers').textContent), undefined, { timeout: 10_000 });
      assert.match(await page.evaluate<string>(`document.querySelector('#chart-coordinator .note').textContent`), /^state serving$/);
      await page.screenshot({ path: join(ARTIFACTS, 'statechart-ready.png'), fullPage: true });
      assert.ok(existsSync(join(ARTIFACTS, 'statechart-ready.png')));

      // The ranks' serving lifecycle: drawn, lit where rank 0 is, and following a client's release.
      const serviceStates = await drawn('rankService');
      for (const s of ['serving', 'releasing', 'released']) {
        assert.ok(serviceStates.some((id) => id.startsWith(`wd-rankService-state-${s}-`)), `rank service state ${s} drawn (${serviceStates})`);
      }
      await highlightIs(page, 'serving', 'rankService');
      assert.is(await page.evaluate<string>(`document.querySelector('#chart-rankService .note').textContent`), 'rank 0: serving');
      await watchHighlight(page, 'rankService');
      const client = await WeightdClient.connect(node.status().ranks[0]!.socketPath!);
      try {
        assert.is((await client.release()).alreadyReleased, false);
      } finally {
        client.close();
      }
      await highlightIs(page, 'released', 'rankService');
      const lifecycle = await highlightsSeen(page, 'rankService');
      // releasing may pass between two status updates; serving and released cannot.
      assert.equal(lifecycle.filter((s) => s !== 'releasing'), ['serving', 'released'], `the highlight went from serving to released (${lifecycle})`);
      await page.waitForFunction(() => (globalThis as any).document.querySelector('#ranks tbody tr[data-rank="0"]')?.dataset.state === 'released', undefined, { timeout: 10_000 });
      assert.equal(problems, [], 'no script errors, no blocked resources');
    } finally {
      await page.close();
      await peer?.stop();
      await node.stop();
      delete process.env.WEIGHTD_HOST_DEVICES;
    }
  });

  test('mermaid accepts the text of nested and parallel machines too', async () => {
    const text = machineToMermaid(
      createMachine({
        id: 'demo',
        initial: 'a',
        states: {
          a: { initial: 'a1', states: { a1: { on: { NEXT: 'a2' } }, a2: { type: 'final' } }, onDone: 'b' },
          b: { type: 'parallel', states: { x: { initial: 'x1', states: { x1: {} } }, y: { initial: 'y1', states: { y1: { after: { 100: 'y2' } }, y2: {} } } } },
        },
      }),
    );
    const page = await browser.newPage();
    try {
      await page.setContent('<div id="out"></div>');
      await page.addScriptTag({ path: join(repoRoot, 'node_modules/mermaid/dist/mermaid.min.js') });
      const svg: string = await page.evaluate(`(async () => {
        mermaid.initialize({ startOnLoad: false });
        return (await mermaid.render('demo', ${JSON.stringify(text)})).svg;
      })()`);
      for (const s of ['a__a1', 'a__a2', 'b__x__x1', 'b__y__y2']) assert.match(svg, new RegExp(`demo-state-${s}-\\d+`), `${s} drawn`);
      // The rank worker's root is parallel: mermaid draws its three regions (as clusters of their own), and their states.
      const worker: string = await page.evaluate(`(async () => (await mermaid.render('worker', ${JSON.stringify(machineToMermaid(rankWorkerMachine))})).svg)()`);
      for (const s of ['rank__opening__admitted', 'rank__adopting', 'permission__allowed', 'keeper__keeping__again']) assert.match(worker, new RegExp(`worker-state-${s}-\\d+`), `${s} drawn`);
      assert.is((worker.match(/<g class="[^"]*statediagram-cluster-alt[^"]*"/g) ?? []).length, 3, 'three concurrent regions');
    } finally {
      await page.close();
    }
  });
}

test.run();
