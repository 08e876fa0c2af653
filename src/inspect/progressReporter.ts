// Says how the load goes while it goes: a log line every few seconds with the node's bytes,
// rate and ETA (and each rank's in its fields), a summary line per rank as it becomes resident
// and one for the node, and, when stderr is a terminal, a progress bar redrawn in place.
import type { Logger } from '../log.js';
import type { NodeStatus } from '../nodeStatus.js';
import type { EventFeed, NodeEvent } from './eventFeed.js';
import { formatBytes, formatRate, formatSeconds, nodeProgress, percent, rankProgress, type LoadProgress } from './loadProgress.js';

const BAR_REDRAW_MS = 200;
/** Narrower than this, the bar says nothing the log lines do not. */
const MIN_BAR_COLUMNS = 20;

/** A terminal to draw the bar on (process.stderr when it is a TTY). */
export interface BarStream {
  write(text: string): unknown;
  columns?: number;
}

export interface ProgressReporterOptions {
  log: Logger;
  status: () => NodeStatus;
  feed: EventFeed;
  /** The model actor whose ranks are the node's (its own model's: FIRST_MODEL_ID), whose ranks' loads it reports. */
  model: string;
  intervalMs: number;
  bar?: BarStream;
}

/**
 * Whether a bar can be drawn on `stream` now. A terminal with no size set reports 0 columns (a
 * serial console, some CI ptys): a bar cut to that width is one character redrawn forever, so
 * such a terminal gets the log lines only.
 */
export function canDrawBar(stream: BarStream): boolean {
  return typeof stream.columns === 'number' && stream.columns >= MIN_BAR_COLUMNS;
}

/** One line, at most `columns - 1` wide so the terminal never wraps it (a wrapped line cannot be redrawn with \r). */
export function renderProgressBar(p: LoadProgress, columns = 80): string {
  const pct = percent(p);
  const tail = ` ${pct.toFixed(0).padStart(3)}%  ${formatBytes(p.bytes)} / ${formatBytes(p.totalBytes)}  ${formatRate(p.bytesPerSecond)}  eta ${formatSeconds(p.etaSeconds)}`;
  const width = Math.max(10, Math.min(40, columns - 1 - 'loading []'.length - tail.length));
  const filled = Math.round((width * pct) / 100);
  return `loading [${'█'.repeat(filled)}${'░'.repeat(width - filled)}]${tail}`.slice(0, Math.max(1, columns - 1));
}

export class ProgressReporter {
  readonly #o: ProgressReporterOptions;
  readonly #timers: NodeJS.Timeout[] = [];
  readonly #unsubscribe: () => void;
  #barShown = false;

  constructor(o: ProgressReporterOptions) {
    this.#o = o;
    this.#unsubscribe = o.feed.subscribe((e) => this.#onEvent(e));
    this.#timers.push(setInterval(() => this.#tick(), o.intervalMs));
    if (o.bar) this.#timers.push(setInterval(() => this.#drawBar(), BAR_REDRAW_MS));
    // Progress must never keep a process alive that has nothing else to do.
    for (const t of this.#timers) t.unref();
  }

  stop(): void {
    for (const t of this.#timers) clearInterval(t);
    this.#unsubscribe();
    this.#clearBar();
  }

  #loading(status: NodeStatus): boolean {
    return status.state === 'loading' && status.ranks.some((r) => r.state === 'loading');
  }

  #tick(): void {
    const status = this.#o.status();
    if (!this.#loading(status)) return;
    const node = nodeProgress(status.ranks);
    const ranks = status.ranks.map((r) => ({ globalRank: r.globalRank, localRank: r.localRank, state: r.state, ...rankProgress(r), ...(r.waitingForGroup && r.state === 'loading' ? { waitingForGroup: true } : {}) }));
    let msg = `loading ${percent(node).toFixed(1)}%: ${formatBytes(node.bytes)} of ${formatBytes(node.totalBytes)} at ${formatRate(node.bytesPerSecond)}, eta ${formatSeconds(node.etaSeconds)}`;
    const behind = ranks.filter((r) => r.state === 'loading');
    if (ranks.length > 1 && behind.length > 0) {
      const slowest = behind.reduce((a, b) => (percent(b) < percent(a) ? b : a));
      msg += `; slowest rank ${slowest.globalRank} at ${percent(slowest).toFixed(1)}%`;
    }
    // A rank whose bytes stand still because it waits for the others of its fill group, not stuck.
    const waiting = ranks.filter((r) => r.waitingForGroup);
    if (waiting.length > 0) msg += `; rank${waiting.length > 1 ? 's' : ''} ${waiting.map((r) => r.globalRank).join(', ')} waiting for the node's other ranks`;
    this.#logInfo({ ...node, ranks }, msg);
  }

  #onEvent(e: NodeEvent): void {
    // The node's ranks are its first model's: what its model actor heard.
    if (e.type === 'RANK_LOADED' && e.to === undefined && e.model === this.#o.model) {
      const r = this.#o.status().ranks.find((x) => x.localRank === e.data.localRank);
      if (!r) return;
      const p = rankProgress(r);
      const source = r.source ?? { from: 'checkpoint' };
      // Adopted bytes were not copied: a rate would be the keeper's hand-over, not a load.
      this.#logInfo(
        { globalRank: r.globalRank, localRank: r.localRank, bytes: p.bytes, seconds: p.seconds, bytesPerSecond: p.bytesPerSecond, source: source.from, ...(source.from === 'keeper' || source.from === 'writer' ? { adoptedOn: source.thread } : {}) },
        source.from === 'keeper'
          ? `rank ${r.globalRank} adopted ${formatBytes(p.bytes)} from the keeper in ${formatSeconds(p.seconds)} (kept ${formatSeconds(source.ageMs / 1000)} ago)`
          : `rank ${r.globalRank} loaded ${formatBytes(p.bytes)} in ${formatSeconds(p.seconds)} (${formatRate(p.bytesPerSecond)})`,
      );
    }
    if (e.model === undefined && !e.registry && e.from === 'loading') {
      const status = this.#o.status();
      if (e.state === 'starting') {
        const p = nodeProgress(status.ranks);
        const adopted = status.ranks.filter((r) => r.source?.from === 'keeper').length;
        this.#logInfo(
          { bytes: p.bytes, seconds: p.seconds, bytesPerSecond: p.bytesPerSecond, ranks: status.ranks.length, adoptedRanks: adopted },
          `all ${status.ranks.length} local ranks loaded: ${formatBytes(p.bytes)} in ${formatSeconds(p.seconds)} (${adopted === status.ranks.length ? 'adopted from the keeper' : formatRate(p.bytesPerSecond)})`,
        );
      }
      this.#clearBar();
    }
  }

  /** The bar is taken off the terminal around a log line, so the line is not written into it. */
  #logInfo(fields: object, msg: string): void {
    const shown = this.#barShown;
    this.#clearBar();
    this.#o.log.info(fields, msg);
    if (shown) this.#drawBar();
  }

  #drawBar(): void {
    const bar = this.#o.bar;
    const status = this.#o.status();
    if (!bar || !canDrawBar(bar) || !this.#loading(status)) return;
    // Ends in \r: a log line written by anyone else then starts over the bar, not after it.
    bar.write(`\r\x1b[K${renderProgressBar(nodeProgress(status.ranks), bar.columns)}\r`);
    this.#barShown = true;
  }

  #clearBar(): void {
    if (!this.#barShown) return;
    this.#o.bar!.write('\r\x1b[K');
    this.#barShown = false;
  }
}
