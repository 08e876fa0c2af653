// The node's HTTP window for operators and developers (opt-in: --inspect-port):
//   /healthz      200 while the node's own model serves, else 503 (readiness probes; statusView.ts serves())
//   /status       the node's status as JSON (statusView.ts)
//   /metrics      Prometheus text (nodeMetrics.ts)
//   /statechart   the live state-chart page; /statechart.json its charts; /events its SSE feed
// Bound to loopback unless asked otherwise. Read-only: nothing here changes the node.
// Loopback TCP has no uid check, so any local user may connect: the server holds at most its own
// share of the process's descriptors (descriptorBudget.ts; none of the reserve the device and
// control sockets keep), answers a connection over it 503 and closes it at once, and bounds how
// long a connection may take to send its request and how long it may sit idle.
import { createReadStream } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { isIP, type Socket } from 'node:net';
import { fileURLToPath } from 'node:url';
import { UsageError } from '../errors.js';
import type { Logger } from '../log.js';
import type { NodeStatus } from '../nodeStatus.js';
import { descriptorBudget, type ListenerShare } from '../wire/descriptorBudget.js';
import { LogLimiter } from '../wire/logLimiter.js';
import type { EventFeed, NodeEvent } from './eventFeed.js';
import { chartStates, chartToMermaid, type MachineChart } from './machineToMermaid.js';
import type { NodeMetrics } from './nodeMetrics.js';
import { STATECHART_CSS, STATECHART_HTML, STATECHART_JS } from './statechartPage.js';
import { ownModelState, serves, toStatusView } from './statusView.js';

/** How often connected pages get the status when it changed between events (load progress). */
const STATUS_PUSH_MS = 500;
/** A comment line this often keeps proxies (kubectl port-forward, nginx) from closing a quiet stream. */
const KEEPALIVE_MS = 15_000;
const MAX_STREAMS = 32;

/** The bounds of the server's connections (docs/operations.md, "The inspect server"). */
export interface InspectLimits {
  /** Connections held at once: room for probes and scrapers beside MAX_STREAMS open pages. */
  maxConnections: number;
  /** From connecting to the end of a request's headers. */
  headersTimeoutMs: number;
  /** From connecting to the end of a request. */
  requestTimeoutMs: number;
  /** A kept-alive connection with no request. */
  keepAliveTimeoutMs: number;
  /**
   * A connection on which nothing moves: a reply its client does not read. Above KEEPALIVE_MS, so
   * an event stream whose page reads it never meets it.
   */
  idleTimeoutMs: number;
}

export const DEFAULT_INSPECT_LIMITS: InspectLimits = { maxConnections: 64, headersTimeoutMs: 5_000, requestTimeoutMs: 10_000, keepAliveTimeoutMs: 5_000, idleTimeoutMs: 30_000 };

const BUSY_BODY = 'the inspect server holds as many connections as it may; try again shortly\n';
const BUSY_RESPONSE = `HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: ${BUSY_BODY.length}\r\nConnection: close\r\n\r\n${BUSY_BODY}`;

export interface InspectServerOptions {
  host: string;
  /** 0 picks a free port (see `url`). */
  port: number;
  log: Logger;
  status: () => NodeStatus;
  feed: EventFeed;
  metrics: NodeMetrics;
  /** The machines the page draws: the supervisor first, then (on a group) the coordinator, then the ranks' serving lifecycle. */
  charts: MachineChart[];
  limits?: Partial<InspectLimits>;
}

/** Whether `host` (a bind address or a Host header's name) only reaches this machine. */
export function isLoopback(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '').toLowerCase();
  if (h === 'localhost' || h.endsWith('.localhost') || h === '::1') return true;
  if (isIP(h) === 4) return h.startsWith('127.');
  return h.startsWith('::ffff:127.');
}

/** The host name of a Host header ("[::1]:9464" -> "::1"). */
function hostHeaderName(header: string): string {
  const m = /^\[([^\]]+)\](?::\d+)?$/.exec(header) ?? /^([^:]+)(?::\d+)?$/.exec(header);
  return m ? m[1]! : header;
}

function asset(specifier: string): string | undefined {
  try {
    return fileURLToPath(import.meta.resolve(specifier));
  } catch {
    return undefined;
  }
}

export class InspectServer {
  readonly #o: InspectServerOptions;
  readonly #server: Server;
  readonly #streams = new Set<ServerResponse>();
  readonly #chartJson: string;
  readonly #mermaidJs = asset('mermaid/dist/mermaid.min.js');
  readonly #loadProgressJs = fileURLToPath(new URL('./loadProgress.js', import.meta.url));
  readonly #unsubscribe: () => void;
  readonly #share: ListenerShare;
  readonly #refusedLog: LogLimiter;
  #timer: NodeJS.Timeout | undefined;
  #lastPushed = '';
  #lastWrite = 0;
  #url = '';

  private constructor(o: InspectServerOptions) {
    this.#o = o;
    this.#chartJson = JSON.stringify({
      machines: o.charts.map((chart) => ({
        chart,
        mermaid: chartToMermaid(chart),
        mermaidIds: Object.fromEntries(chartStates(chart).map((s) => [s.path.join('.'), s.mermaidId])),
      })),
    });
    const limits = { ...DEFAULT_INSPECT_LIMITS, ...o.limits };
    this.#server = createServer(
      {
        headersTimeout: limits.headersTimeoutMs,
        requestTimeout: limits.requestTimeoutMs,
        keepAliveTimeout: limits.keepAliveTimeoutMs,
        // How often the two timeouts above are checked: they are met within this much.
        connectionsCheckingInterval: Math.min(1_000, limits.headersTimeoutMs),
      },
      (req, res) => this.#handle(req, res),
    );
    this.#server.setTimeout(limits.idleTimeoutMs);
    this.#share = descriptorBudget().share({ name: 'inspect server', cap: limits.maxConnections, guaranteed: limits.maxConnections, trusted: false });
    this.#refusedLog = new LogLimiter(20, 10_000, (dropped) => o.log.warn({ dropped }, `${dropped} more inspect connections over its share were not logged`));
    // Before the HTTP server's own listener: a connection over the share is never parsed.
    this.#server.prependListener('connection', (socket: Socket) => this.#admit(socket));
    this.#unsubscribe = o.feed.subscribe((e) => this.#onEvent(e));
  }

  /** Binds; throws UsageError (naming the flag) when the address cannot be used. */
  static async listen(o: InspectServerOptions): Promise<InspectServer> {
    const s = new InspectServer(o);
    await new Promise<void>((resolve, reject) => {
      s.#server.once('error', (err: NodeJS.ErrnoException) => {
        s.#unsubscribe();
        s.#share.close();
        const why = err.code === 'EADDRINUSE' ? 'is in use' : err.code === 'EADDRNOTAVAIL' ? 'is not an address of this machine' : `cannot be bound (${err.code ?? err.message})`;
        reject(new UsageError('E_INSPECT_BIND', `--inspect-host ${o.host} --inspect-port ${o.port}: ${why}; choose another port or address`, { host: o.host, port: o.port }, { cause: err }));
      });
      s.#server.listen(o.port, o.host, () => resolve());
    });
    const { port } = s.#server.address() as { port: number };
    o.log.debug({ maxConnections: s.#share.cap }, 'inspect server connections');
    s.#url = `http://${isIP(o.host) === 6 ? `[${o.host}]` : o.host}:${port}`;
    s.#server.on('error', (err) => o.log.error({ err }, 'inspect server error'));
    if (isLoopback(o.host)) {
      o.log.info({ url: s.#url }, `inspect server listening: ${s.#url}/statechart`);
    } else {
      o.log.warn(
        { url: s.#url, host: o.host },
        `inspect server listening beyond loopback on ${o.host}: anyone who can reach this port reads the node's status, metrics and events (no authentication); bind 127.0.0.1 unless a firewall or network policy limits who can`,
      );
    }
    return s;
  }

  /** Base URL, e.g. http://127.0.0.1:9464 (the port actually bound, also for port 0). */
  get url(): string {
    return this.#url;
  }

  /** Ends the event streams (after what they were sent), stops listening, closes every connection. */
  async close(): Promise<void> {
    this.#unsubscribe();
    clearInterval(this.#timer);
    for (const res of this.#streams) res.end();
    this.#streams.clear();
    const closed = new Promise<void>((resolve) => this.#server.close(() => resolve()));
    this.#server.closeIdleConnections();
    // A request still being answered gets a moment, then its connection is cut.
    const cut = setTimeout(() => this.#server.closeAllConnections(), 1000);
    await closed;
    clearTimeout(cut);
    this.#refusedLog.flush();
    this.#share.close();
  }

  /** Takes a descriptor of the share for a new connection, or answers 503 and closes it. */
  #admit(socket: Socket): void {
    const refused = this.#share.take(socket);
    if (!refused) return;
    this.#refusedLog.allow(() => this.#o.log.warn({ remote: socket.remoteAddress, limit: refused.limit }, `refused an inspect connection: ${refused.message}`));
    socket.on('error', () => {});
    // A short reply on a fresh socket is in the kernel at once; the descriptor is closed now,
    // not after the peer, who may be the flood, closes its side.
    socket.write(BUSY_RESPONSE);
    socket.destroy();
  }

  #handle(req: IncomingMessage, res: ServerResponse): void {
    res.setHeader('X-Content-Type-Options', 'nosniff');
    // A web page the operator visits could otherwise make their browser read this server
    // through a DNS name rebound to 127.0.0.1; on loopback only loopback names are served.
    const hostName = hostHeaderName(req.headers.host ?? '');
    if (isLoopback(this.#o.host) && !isLoopback(hostName)) {
      this.#send(res, 403, 'text/plain', `Host ${JSON.stringify(req.headers.host ?? '')} refused: this server is bound to loopback and answers loopback names only\n`);
      return;
    }
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.setHeader('Allow', 'GET, HEAD');
      this.#send(res, 405, 'text/plain', `${req.method} not allowed: this server is read-only\n`);
      return;
    }
    const path = new URL(req.url ?? '/', 'http://x').pathname;
    switch (path) {
      case '/':
        this.#send(res, 200, 'text/plain', 'weightd inspect server\n  /healthz\n  /status\n  /metrics\n  /statechart\n  /statechart.json\n  /events\n');
        return;
      case '/healthz': {
        const status = this.#o.status();
        const ready = serves(status);
        // Once the node is ready, its own model's state says why it may not serve (draining, released).
        const model = ownModelState(status);
        this.#send(res, ready ? 200 : 503, 'application/json', `${JSON.stringify({ ready, state: status.state, ...(model ? { model } : {}) })}\n`);
        return;
      }
      case '/status':
        this.#send(res, 200, 'application/json', `${JSON.stringify(toStatusView(this.#o.status()), null, 2)}\n`);
        return;
      case '/metrics':
        this.#o.metrics.text().then(
          (text) => this.#send(res, 200, this.#o.metrics.contentType, text),
          (err: Error) => this.#send(res, 500, 'text/plain', `metrics failed: ${err.message}\n`),
        );
        return;
      case '/statechart':
        res.setHeader('Content-Security-Policy', "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; font-src 'self' data:");
        this.#send(res, 200, 'text/html; charset=utf-8', STATECHART_HTML);
        return;
      case '/statechart.json':
        this.#send(res, 200, 'application/json', this.#chartJson);
        return;
      case '/events':
        this.#openStream(req, res);
        return;
      case '/assets/statechart.js':
        this.#send(res, 200, 'text/javascript; charset=utf-8', STATECHART_JS);
        return;
      case '/assets/statechart.css':
        this.#send(res, 200, 'text/css; charset=utf-8', STATECHART_CSS);
        return;
      case '/assets/loadProgress.js':
        this.#sendFile(res, this.#loadProgressJs, 'text/javascript; charset=utf-8');
        return;
      case '/assets/mermaid.min.js':
        if (this.#mermaidJs === undefined) {
          this.#send(res, 404, 'text/plain', 'mermaid is not installed next to weightd (npm install mermaid@11): the chart cannot be drawn\n');
          return;
        }
        this.#sendFile(res, this.#mermaidJs, 'text/javascript; charset=utf-8');
        return;
      default:
        this.#send(res, 404, 'text/plain', `${path}: not found; see /\n`);
    }
  }

  #send(res: ServerResponse, code: number, type: string, body: string): void {
    res.writeHead(code, { 'Content-Type': type, 'Cache-Control': 'no-store', 'Content-Length': Buffer.byteLength(body) });
    res.end(res.req.method === 'HEAD' ? undefined : body);
  }

  #sendFile(res: ServerResponse, file: string, type: string): void {
    const stream = createReadStream(file);
    stream.once('open', () => {
      res.writeHead(200, { 'Content-Type': type, 'Cache-Control': 'max-age=3600' });
      if (res.req.method === 'HEAD') {
        stream.destroy();
        res.end();
      } else {
        stream.pipe(res);
      }
    });
    stream.once('error', (err) => {
      if (res.headersSent) res.destroy(err);
      else this.#send(res, 500, 'text/plain', `cannot read ${file}: ${err.message}\n`);
    });
  }

  #openStream(req: IncomingMessage, res: ServerResponse): void {
    if (this.#streams.size >= MAX_STREAMS) {
      this.#send(res, 503, 'text/plain', `too many open event streams (${MAX_STREAMS}); close a page\n`);
      return;
    }
    res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-store', 'X-Accel-Buffering': 'no' });
    this.#streams.add(res);
    req.on('close', () => this.#streams.delete(res));
    const status = toStatusView(this.#o.status());
    this.#write([res], 'hello', { status, events: this.#o.feed.recent() });
    this.#timer ??= setInterval(() => this.#tick(), STATUS_PUSH_MS).unref();
  }

  #write(to: Iterable<ServerResponse>, event: string, data: unknown): void {
    const frame = `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;
    for (const res of to) res.write(frame);
    this.#lastWrite = Date.now();
  }

  #onEvent(event: NodeEvent): void {
    if (this.#streams.size === 0) return;
    const status = toStatusView(this.#o.status());
    this.#lastPushed = JSON.stringify({ ...status, time: '' });
    this.#write(this.#streams, 'node-event', { event, status });
  }

  #tick(): void {
    if (this.#streams.size === 0) return;
    const status = toStatusView(this.#o.status());
    const key = JSON.stringify({ ...status, time: '' });
    if (key !== this.#lastPushed) {
      this.#lastPushed = key;
      this.#write(this.#streams, 'status', status);
    } else if (Date.now() - this.#lastWrite >= KEEPALIVE_MS) {
      for (const res of this.#streams) res.write(': keepalive\n\n');
      this.#lastWrite = Date.now();
    }
  }
}
