// The live state-chart page served at /statechart: the supervisor machine, on a group the
// rendezvous coordinator's, and the ranks' serving lifecycle (lit where each local rank is), drawn by mermaid (served from node_modules, so the page works with
// no internet), each one's current state highlighted, each local rank's state and progress,
// who has joined during rendezvous, and the recent events, all kept live over
// /events (server-sent events). The script is a separate asset so the page's
// Content-Security-Policy can forbid inline script. It uses the server's own number formatting
// (loadProgress.js, which has no imports at run time).

export const STATECHART_HTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>weightd state chart</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/assets/statechart.css">
<link rel="icon" href="data:,">
</head>
<body>
<header>
  <h1>weightd</h1>
  <span id="node">connecting…</span>
  <span>state <b id="state">?</b></span>
  <span id="conn" class="conn">connecting</span>
</header>
<div id="failure" hidden></div>
<main>
  <div id="charts"><p id="chart-status">drawing the charts…</p></div>
  <aside>
    <h2>Local ranks</h2>
    <table id="ranks"><thead><tr><th>rank</th><th>device</th><th>state</th><th>loaded</th><th>rate</th><th>eta</th><th>clients</th><th>leases</th></tr></thead><tbody></tbody></table>
    <p id="load"></p>
    <h2>Peers</h2>
    <ul id="peers"><li>none</li></ul>
    <h2>Recent events</h2>
    <ol id="events" reversed></ol>
  </aside>
</main>
<script src="/assets/mermaid.min.js"></script>
<script type="module" src="/assets/statechart.js"></script>
</body>
</html>
`;

export const STATECHART_CSS = `
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #222; }
header { display: flex; gap: 1.5em; align-items: baseline; padding: .6em 1em; background: #263238; color: #eceff1; }
header h1 { font-size: 1.1em; margin: 0; }
.conn { margin-left: auto; font-size: .9em; }
.conn.live { color: #a5d6a7; } .conn.down { color: #ef9a9a; }
main { display: flex; flex-wrap: wrap; gap: 1em; padding: 1em; align-items: flex-start; }
#charts { flex: 1 1 55%; min-width: 320px; display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
.chart { flex: 1 1 320px; overflow: auto; }
.chart h2 { margin-top: 0; }
.chart .note { color: #607d8b; font-size: .9em; margin: 0 0 .5em; }
aside { flex: 1 1 45%; min-width: 320px; }
h2 { font-size: 1em; margin: 1em 0 .3em; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .2em .5em; border-bottom: 1px solid #ddd; font-variant-numeric: tabular-nums; white-space: nowrap; }
.badge { padding: .05em .5em; border-radius: .8em; background: #cfd8dc; }
.badge.loading { background: #90caf9; } .badge.loaded { background: #80cbc4; } .badge.serving { background: #a5d6a7; }
.badge.failed { background: #ef9a9a; }
.bar { display: inline-block; width: 6em; height: .6em; background: #eceff1; margin-right: .4em; vertical-align: middle; }
.bar > span { display: block; height: 100%; background: #42a5f5; }
#failure { margin: 1em; padding: .6em 1em; background: #ffebee; border-left: 4px solid #c62828; white-space: pre-wrap; }
#events { font-size: .9em; max-height: 50vh; overflow: auto; padding-left: 3em; margin: 0; }
#events time { color: #607d8b; margin-right: .5em; }
#events .to { color: #6a1b9a; }
#events .move { color: #e65100; }
#peers .missing { color: #c62828; }
.chart g.wd-current rect, .chart g.wd-current path, .chart g.wd-current polygon { fill: #ffd54f !important; stroke: #e65100 !important; stroke-width: 3px !important; }
body.failed #chart-supervisor g.wd-current rect, body.failed #chart-supervisor g.wd-current path { fill: #ef9a9a !important; stroke: #b71c1c !important; }
`;

export const STATECHART_JS = `
import { formatBytes, formatRate, formatSeconds, percent } from '/assets/loadProgress.js';

const $ = (id) => document.getElementById(id);
const MAX_EVENTS = 200;
const TITLES = {
  supervisor: 'This node',
  coordinator: 'Rendezvous coordinator',
  groupMember: "This node's membership of the group: its join, the ready barrier, and rejoining node 0",
  rankService: "Each local rank's serving lifecycle",
  rankWorker: "Each rank's worker thread: its load, its keeper calls, its release and stop",
  modelRegistry: "The node's models: their list, loads and unloads, swaps across the group",
  model: 'Each model the node serves, its first included',
  modelGroup: "Each model across the group: node 0's all-or-nothing commit",
};
/** Per machine id: its section, the mermaid id of each state, the drawn state groups. */
const charts = new Map();
/** Per machine id: its states now (one per local rank for the rank service), none where not known here. */
const current = {};

const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]);

function highlight(machine, states) {
  current[machine] = [].concat(states ?? []);
  const c = charts.get(machine);
  if (!c) return;
  const shown = current[machine].filter((s, i, all) => all.indexOf(s) === i && c.nodes.has(c.ids[s]));
  const ids = new Set(shown.map((s) => c.ids[s]));
  for (const [mid, g] of c.nodes) g.classList.toggle('wd-current', ids.has(mid));
  // What is highlighted in the drawing right now, space-separated (automation and tests read it).
  c.el.dataset.highlighted = shown.join(' ');
}

async function drawCharts() {
  const res = await fetch('/statechart.json');
  if (!res.ok) throw new Error('GET /statechart.json: HTTP ' + res.status);
  const { machines } = await res.json();
  mermaid.initialize({ startOnLoad: false, securityLevel: 'strict' });
  const host = $('charts');
  for (const m of machines) {
    const id = m.chart.id;
    const el = document.createElement('section');
    el.className = 'chart';
    el.id = 'chart-' + id;
    el.setAttribute('aria-label', id + ' state chart');
    el.innerHTML = '<h2>' + esc(TITLES[id] ?? id) + '</h2><p class="note"></p>';
    const { svg } = await mermaid.render('wd-' + id, m.mermaid);
    el.insertAdjacentHTML('beforeend', svg);
    host.append(el);
    // mermaid names each state's group "<render id>-state-<state id>-<n>".
    const nodes = new Map();
    const name = new RegExp('^wd-' + id + '-state-(.+)-\\\\d+$');
    for (const g of el.querySelectorAll('g.node')) {
      const found = name.exec(g.id);
      if (found) nodes.set(found[1], g);
    }
    charts.set(id, { el, ids: m.mermaidIds, nodes });
    if (id in current) highlight(id, current[id]);
  }
}

/** During rendezvous: every node rank, joined or missing, as node 0 last said. */
function renderPeers(s) {
  const peers = $('peers');
  if (s.formation) {
    peers.innerHTML = Array.from({ length: s.nnodes }, (_, r) => {
      const state = s.formation.joined.includes(r) ? 'joined' : 'missing';
      return '<li data-node="' + r + '" data-state="' + state + '" class="' + state + '">node ' + r + (r === s.nodeRank ? ' (this node)' : '') + ': <b>' + state + '</b></li>';
    }).join('');
  } else if (s.state === 'rendezvous' && s.nnodes > 1) {
    peers.innerHTML = '<li>waiting for node 0 to answer</li>';
  } else {
    peers.innerHTML = s.peers.length === 0 ? '<li>none</li>' : s.peers.map((p) =>
      '<li data-node="' + p.nodeRank + '" data-state="' + esc(p.state) + '">node ' + p.nodeRank + ' (' + esc(p.hostName ?? '?') + '): <b>' + esc(p.state) + '</b>' + (p.reason ? ' – ' + esc(p.reason) : '') + '</li>').join('');
  }
}

/** A model's processed layouts (what engines published beside its ranks), when it has any. */
function processedNote(m) {
  const layouts = m.ranks.flatMap((r) => r.processed ?? []);
  return layouts.length === 0 ? '' : ', ' + layouts.length + ' processed layout' + (layouts.length === 1 ? '' : 's') + ' (' + formatBytes(m.processedBytes) + ', ' + layouts.reduce((n, p) => n + p.leases, 0) + ' mapped)';
}

function renderStatus(s) {
  document.body.classList.toggle('failed', s.failure !== null);
  $('node').textContent = 'node ' + s.nodeRank + '/' + s.nnodes + ' · tp ' + s.tpSize + ' · ' + (s.architecture ?? '?') + ' · ' + s.model + ' · pid ' + s.pid;
  $('state').textContent = s.state;
  highlight('supervisor', s.state);
  highlight('coordinator', s.coordinatorState);
  const note = document.querySelector('#chart-coordinator .note');
  if (note) note.textContent = s.coordinatorState === null ? "it runs on node 0: its state shows on node 0's page" : 'state ' + s.coordinatorState;
  highlight('rankService', s.ranks.map((r) => r.serve).filter((v) => v !== null));
  const ranksNote = document.querySelector('#chart-rankService .note');
  if (ranksNote) ranksNote.textContent = s.ranks.map((r) => 'rank ' + r.globalRank + ': ' + (r.serve ?? 'no socket yet')).join(' · ');
  const groupNote = document.querySelector('#chart-modelGroup .note');
  const waiting = s.models.filter((m) => m.state === 'resident').map((m) => m.name);
  if (groupNote) groupNote.textContent = "node 0's coordinator runs one per model that spans the group, while it loads; resident here and waiting for its commit: " + (waiting.join(', ') || 'none');
  highlight('modelRegistry', s.registryState);
  // Every model is one of these, the node's first included (in the node's state until its actor exists).
  highlight('model', s.models.map((m) => m.state));
  const modelsNote = document.querySelector('#chart-model .note');
  if (modelsNote) modelsNote.textContent = s.models.map((m) => m.name + (m.own ? ' (own)' : '') + ' v' + m.version + (m.state === 'serving' && !m.current ? ' (retained)' : '') + ' (tp ' + m.tpSize + '): ' + m.state + ', ' + m.leases + ' leases' + processedNote(m)).join(' · ');
  $('ranks').tBodies[0].innerHTML = s.ranks.map((r) =>
    '<tr data-rank="' + r.globalRank + '" data-state="' + esc(r.state) + '">' +
    '<td>' + r.globalRank + ' <small>(local ' + r.localRank + ')</small></td>' +
    '<td>' + (r.device ? esc(r.device.backend + ' ' + r.device.uuid) : '–') + '</td>' +
    '<td><span class="badge ' + esc(r.state) + '">' + esc(r.state) + '</span>' + (r.waitingForGroup ? ' <small>waiting for the other ranks of its node</small>' : '') + '</td>' +
    '<td><span class="bar"><span style="width:' + percent(r).toFixed(1) + '%"></span></span>' + formatBytes(r.bytes) + ' / ' + formatBytes(r.totalBytes) + '</td>' +
    '<td>' + formatRate(r.bytesPerSecond) + '</td>' +
    '<td>' + formatSeconds(r.etaSeconds) + '</td>' +
    '<td>' + (r.clients ?? '–') + '</td><td>' + (r.leases ?? '–') + '</td></tr>').join('');
  $('load').textContent = s.ranks.length === 0 ? '' :
    'node: ' + formatBytes(s.load.bytes) + ' of ' + formatBytes(s.load.totalBytes) + ' (' + percent(s.load).toFixed(1) + '%) at ' + formatRate(s.load.bytesPerSecond) + ', eta ' + formatSeconds(s.load.etaSeconds);
  renderPeers(s);
  const f = $('failure');
  f.hidden = s.failure === null;
  if (s.failure) f.textContent = s.failure.code + ': ' + s.failure.message;
}

function addEvent(e) {
  const li = document.createElement('li');
  li.value = e.seq;
  const t = new Date(e.time);
  const details = Object.entries(e.data).map(([k, v]) => k + '=' + (typeof v === 'object' ? JSON.stringify(v) : v)).join(' ');
  li.innerHTML = '<time datetime="' + t.toISOString() + '">' + t.toLocaleTimeString([], { hour12: false }) + '.' + String(t.getMilliseconds()).padStart(3, '0') + '</time>' +
    // A child's label already names it ("start rank-0"); a command says where it went.
    // A model actor's events name it, the model registry's say so; the supervisor's do not.
    (e.model || e.registry ? '<span class="to">' + esc(e.model || 'models') + ':</span> ' : '') +
    '<code>' + esc(e.label) + '</code>' + (e.to && e.type !== 'xstate.init' ? ' <span class="to">→ ' + esc(e.to) + '</span>' : '') +
    (e.from ? ' <span class="move">' + esc(e.from) + ' → ' + esc(e.state) + '</span>' : '') +
    (details ? ' <small>' + esc(details) + '</small>' : '');
  const list = $('events');
  list.prepend(li);
  while (list.children.length > MAX_EVENTS) list.lastElementChild.remove();
}

function connect() {
  const source = new EventSource('/events');
  const conn = $('conn');
  source.onopen = () => { conn.textContent = 'live'; conn.className = 'conn live'; };
  source.onerror = () => { conn.textContent = 'disconnected (node ended or unreachable); retrying'; conn.className = 'conn down'; };
  source.addEventListener('hello', (m) => {
    const { status, events } = JSON.parse(m.data);
    $('events').innerHTML = '';
    for (const e of events) addEvent(e);
    renderStatus(status);
  });
  source.addEventListener('node-event', (m) => {
    const { event, status } = JSON.parse(m.data);
    addEvent(event);
    renderStatus(status);
  });
  source.addEventListener('status', (m) => renderStatus(JSON.parse(m.data)));
}

connect();
drawCharts().then(
  () => $('chart-status')?.remove(),
  (err) => { $('chart-status').textContent = 'cannot draw the charts: ' + (err.message ?? err); },
);
`;
