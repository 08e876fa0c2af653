// A plain HTTP client for the inspect tests: fetch() cannot set the Host header, and the event
// stream is read frame by frame.
import { request, type IncomingMessage } from 'node:http';

export interface HttpResult {
  status: number;
  headers: IncomingMessage['headers'];
  body: string;
}

export function httpGet(url: string, opts: { headers?: Record<string, string>; method?: string } = {}): Promise<HttpResult> {
  return new Promise((resolve, reject) => {
    // A fresh connection each time: a pooled one would hide whether the server still listens.
    const req = request(url, { method: opts.method ?? 'GET', headers: opts.headers, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

export interface SseFrame {
  event: string;
  data: any;
}

/** An open /events stream: the frames so far, a way to wait for one, and whether it ended. */
export class SseStream {
  readonly frames: SseFrame[] = [];
  ended = false;
  #buffer = '';
  #waiters: Array<() => void> = [];

  static open(url: string): Promise<SseStream> {
    const s = new SseStream();
    return new Promise((resolve, reject) => {
      const req = request(url, { agent: false }, (res) => {
        res.setEncoding('utf8');
        res.on('data', (d: string) => s.#onData(d));
        res.on('end', () => {
          s.ended = true;
          s.#wake();
        });
        resolve(s);
      });
      req.on('error', reject);
      req.end();
    });
  }

  #onData(d: string): void {
    this.#buffer += d;
    let cut;
    while ((cut = this.#buffer.indexOf('\n\n')) >= 0) {
      const block = this.#buffer.slice(0, cut);
      this.#buffer = this.#buffer.slice(cut + 2);
      const event = /^event: (.*)$/m.exec(block)?.[1];
      const data = /^data: (.*)$/m.exec(block)?.[1];
      if (event !== undefined && data !== undefined) this.frames.push({ event, data: JSON.parse(data) });
    }
    this.#wake();
  }

  #wake(): void {
    for (const w of this.#waiters.splice(0)) w();
  }

  /** Resolves with the first frame matching `pred`; rejects after `ms`, listing what came. */
  async next(pred: (f: SseFrame) => boolean, ms = 5000): Promise<SseFrame> {
    const deadline = Date.now() + ms;
    for (;;) {
      const hit = this.frames.find(pred);
      if (hit) return hit;
      if (this.ended || Date.now() > deadline) {
        throw new Error(`no such frame${this.ended ? ' (stream ended)' : ''}; got ${this.frames.map((f) => `${f.event}:${f.data?.event?.type ?? ''}`).join(', ')}`);
      }
      await new Promise<void>((r) => {
        this.#waiters.push(r);
        setTimeout(r, 50);
      });
    }
  }

  /** Resolves once the server ended the stream. */
  async end(ms = 5000): Promise<void> {
    const deadline = Date.now() + ms;
    while (!this.ended) {
      if (Date.now() > deadline) throw new Error('the stream did not end');
      await new Promise((r) => setTimeout(r, 20));
    }
  }
}
