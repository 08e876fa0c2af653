// A running fill is polled (native/fill_job.h says why): rarely while it is far from its end, and
// often near it, so that the path to READY does not wait up to a whole poll for a fill that ended.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { nextPollMs } from '../../src/native/deviceHandle.js';

const GB = 1e9;
const at = (bytes: number, seconds: number, waitingForGroup = false) => ({ bytes, totalBytes: 8 * GB, seconds, waitingForGroup });

test('far from its end, a fill is polled every 20 ms; before its first byte, every 5 (a small one may end soon)', () => {
  assert.is(nextPollMs(at(0.8 * GB, 0.02)), 20); // 180 ms left at this rate
  assert.is(nextPollMs(at(0, 0.05)), 5);
  assert.is(nextPollMs(at(0, 0)), 5);
});

test('near its end, half the time its rate so far says is left', () => {
  assert.ok(Math.abs(nextPollMs(at(7.6 * GB, 0.19)) - 5) < 1e-9); // 10 ms left
  assert.ok(Math.abs(nextPollMs(at(7.2 * GB, 0.18)) - 10) < 1e-9); // 20 ms left
});

test('once its bytes have landed (its digests may still run), every millisecond', () => {
  assert.is(nextPollMs(at(8 * GB, 0.2)), 1);
  assert.is(nextPollMs(at(7.99 * GB, 0.2)), 1);
});

test('a fill that waits for its group keeps the slow poll, whatever its bytes say', () => {
  assert.is(nextPollMs(at(8 * GB, 0.2, true)), 20);
});

test.run();
