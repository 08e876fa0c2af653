// Rate limit for log lines a hostile peer can cause (protocol errors, refused connections): at
// most `burst` lines per window, then one summary with the count left out. The summary is
// written when the window ends, by a timer, not when the next line arrives: otherwise the count
// of the last burst would never be logged.

export class LogLimiter {
  readonly #burst: number;
  readonly #windowMs: number;
  readonly #summary: (dropped: number) => void;
  #windowStart = 0;
  #count = 0;
  #dropped = 0;
  #flush: NodeJS.Timeout | undefined;

  constructor(burst: number, windowMs: number, summary: (dropped: number) => void) {
    this.#burst = burst;
    this.#windowMs = windowMs;
    this.#summary = summary;
  }

  /** Runs `log` unless this window's burst is spent; then it is counted for the summary. */
  allow(log: () => void): void {
    const now = performance.now();
    if (now - this.#windowStart >= this.#windowMs) {
      this.flush();
    }
    if (this.#count++ < this.#burst) {
      log();
      return;
    }
    this.#dropped++;
    if (!this.#flush) {
      this.#flush = setTimeout(() => this.flush(), Math.max(0, this.#windowStart + this.#windowMs - now));
      // A pending summary must not keep a stopping daemon alive; close() flushes it instead.
      this.#flush.unref();
    }
  }

  /** Writes the summary of what was left out, if anything, and starts a fresh window. */
  flush(): void {
    clearTimeout(this.#flush);
    this.#flush = undefined;
    const dropped = this.#dropped;
    this.#count = 0;
    this.#dropped = 0;
    this.#windowStart = performance.now();
    if (dropped > 0) this.#summary(dropped);
  }
}
