// A token bucket: `burst` requests at once, then `perSecond` on average. Time is read from the
// monotonic clock at each take, so it holds no timer.
export class TokenBucket {
  readonly #burst: number;
  readonly #perMs: number;
  #tokens: number;
  #at = performance.now();

  constructor(burst: number, perSecond: number) {
    this.#burst = burst;
    this.#perMs = perSecond / 1000;
    this.#tokens = burst;
  }

  /** Takes a token; false when none is left. */
  take(): boolean {
    const now = performance.now();
    this.#tokens = Math.min(this.#burst, this.#tokens + (now - this.#at) * this.#perMs);
    this.#at = now;
    if (this.#tokens < 1) return false;
    this.#tokens -= 1;
    return true;
  }
}
