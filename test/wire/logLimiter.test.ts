// The peer-caused log lines are limited per window, and the count of what was left out is
// logged when the window ends, even when nothing comes after the burst.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { LogLimiter } from '../../src/wire/logLimiter.js';

test('the count of the last burst is logged when its window ends, with no later line', async () => {
  const lines: string[] = [];
  // The limiter's timer is unref'd (it must not hold a stopping daemon); this test holds the loop.
  const hold = setInterval(() => {}, 1000);
  const summarized = new Promise<number>((resolve) => {
    const limiter = new LogLimiter(3, 50, resolve);
    for (let i = 0; i < 10; i++) limiter.allow(() => lines.push(`line ${i}`));
  });
  assert.is(await summarized, 7);
  clearInterval(hold);
  assert.equal(lines, ['line 0', 'line 1', 'line 2']);
});

test('flush logs the pending count at once (on close) and starts a fresh window', () => {
  const summaries: number[] = [];
  const lines: number[] = [];
  const limiter = new LogLimiter(2, 60_000, (n) => summaries.push(n));
  for (let i = 0; i < 5; i++) limiter.allow(() => lines.push(i));
  limiter.flush();
  assert.equal(summaries, [3]);
  limiter.allow(() => lines.push(5));
  assert.equal(lines, [0, 1, 5], 'a fresh window after the flush');
  limiter.flush();
  assert.equal(summaries, [3], 'nothing left out, nothing to say');
});

test.run();
