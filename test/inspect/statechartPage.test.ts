// The live state-chart page in headless Chromium (Debian's chromium, driven by playwright-core):
// it draws the chart, and its highlight follows a real node from rendezvous through loading to
// ready. The node is node 0 of a two-node group, so it waits in rendezvous, with the page
// already open, until node 1 (a daemon process) joins; every later state then arrives live.
// Screenshots go to test/artifacts/. Without chromium the test is skipped, saying why.
import { existsSync, mkdirSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import pino from 'pino';
import { chromium, type Browser, type Page } from 'playwright-core';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { createMachine } from 'xstate';
import { machineToMermaid } from '../../src/inspect/machineToMermaid.js';
import { startNode } from '../../src/index.js';
import { startDaemon } from '../helpers/daemon.js';
import { exampleModel, freshShmDir, freshSocketDir, repoRoot } from '../helpers/paths.js';

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

/** The text of the chart's highlighted state, and the value the page says it highlights. */
function highlighted(page: Page): Promise<{ attr: string | undefined; text: string[] }> {
  return page.evaluate(`({
    attr: document.getElementById('chart').dataset.highlighted,
    text: [...document.querySelectorAll('#chart g.wd-current')].map((g) => g.textContent),
  })`);
}

function highlightIs(page: Page, state: string): Promise<unknown> {
  return page.waitForFunction(`document.getElementById('chart').dataset.highlighted === ${JSON.stringify(state)}`, undefined, { timeout: 10_000 });
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

  test('the page draws the chart and its highlight follows a node from rendezvous to ready', async () => {
    const shmDir = freshShmDir();
    const port = await freePort();
    // Node 0 lives in this process; its one host device must differ from node 1's.
    process.env.WEIGHTD_HOST_DEVICES = `page-${process.pid}-0`;
    const node = await startNode({
      model: exampleModel, tensorParallelSize: 2, nnodes: 2, nodeRank: 0, weightCacheMasterPort: port,
      device: 'host', shmDir, socketDir: freshSocketDir(), logger: pino({ level: 'silent' }), inspect: { port: 0 },
    });
    const page = await browser.newPage({ viewport: { width: 1500, height: 1000 } });
    const problems: string[] = [];
    page.on('console', (m) => m.type() === 'error' && problems.push(`console: ${m.text()}`));
    page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
    let peer: Awaited<ReturnType<typeof startDaemon>> | undefined;
    try {
      await waitFor('rendezvous', () => node.status().state === 'rendezvous');
      await page.goto(`${node.inspectUrl}/statechart`);
      await page.waitForSelector('#chart svg g.node', { timeout: 20_000 });
      await highlightIs(page, 'rendezvous');
      assert.equal(await highlighted(page), { attr: 'rendezvous', text: ['rendezvousentry / joinGroup'] });
      const states: string[] = await page.evaluate(`[...document.querySelectorAll('#chart g.node')].map((g) => g.id).filter((id) => id.startsWith('wd-chart-state-'))`);
      for (const s of ['init', 'rendezvous', 'loading', 'serving', 'ready', 'stopping', 'stopped', 'failed']) {
        assert.ok(states.some((id) => id.startsWith(`wd-chart-state-${s}-`)), `state ${s} drawn (${states})`);
      }
      await page.screenshot({ path: join(ARTIFACTS, 'statechart-rendezvous.png'), fullPage: true });

      // Every value the highlight takes from now on, in order, however quickly they follow.
      await page.evaluate(`{
        const chart = document.getElementById('chart');
        window.seen = [];
        new MutationObserver((records) => {
          for (const r of records) window.seen.push(r.oldValue ?? '');
          window.seen.push(chart.dataset.highlighted ?? '');
        }).observe(chart, { attributes: true, attributeFilter: ['data-highlighted'], attributeOldValue: true });
      }`);
      peer = await startDaemon({
        model: exampleModel, tp: 2, devices: [`page-${process.pid}-1`], socketDir: freshSocketDir(),
        extraArgs: ['--nnodes', '2', '--node-rank', '1', '--weight-cache-master-port', String(port)],
      });
      await node.ready;
      await highlightIs(page, 'ready');
      const seen = (await page.evaluate<string[]>('window.seen')).filter((v, i, a) => v !== '' && v !== a[i - 1]);
      assert.equal(seen, ['rendezvous', 'loading', 'serving', 'ready'], 'the highlight went through every state the node did');
      const now = await highlighted(page);
      assert.is(now.attr, 'ready');
      assert.is(now.text.length, 1);
      assert.ok(now.text[0]!.startsWith('readyentry / announceReady'), now.text[0]);

      const ranks = await page.evaluate(`[...document.querySelectorAll('#ranks tbody tr')].map((r) => [r.dataset.rank, r.dataset.state])`);
      assert.equal(ranks, [['0', 'serving']]);
      const events: string[] = await page.evaluate(`[...document.querySelectorAll('#events li code')].map((c) => c.textContent)`);
      for (const t of ['GROUP_JOINED', 'RANK_LOADED', 'RANK_SERVING']) assert.ok(events.includes(t), `${t} listed: ${events}`);
      const times: Array<string | null> = await page.evaluate(`[...document.querySelectorAll('#events li time')].map((t) => t.getAttribute('datetime'))`);
      assert.ok(times.length > 0 && times.every((t) => t !== null && !Number.isNaN(Date.parse(t))), 'each event has its timestamp');
      await page.waitForFunction(`/node 1 \\(.*\\): up/.test(document.getElementById('peers').textContent)`, undefined, { timeout: 10_000 });
      await page.screenshot({ path: join(ARTIFACTS, 'statechart-ready.png'), fullPage: true });
      assert.ok(existsSync(join(ARTIFACTS, 'statechart-ready.png')));
      assert.equal(problems, [], 'no script errors, no blocked resources');
    } finally {
      await page.close();
      await peer?.stop();
      await node.stop();
      delete process.env.WEIGHTD_HOST_DEVICES;
      rmSync(shmDir, { recursive: true, force: true });
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
    } finally {
      await page.close();
    }
  });
}

test.run();
