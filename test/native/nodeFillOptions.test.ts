// Which fills share one pass over the files: several GPUs of one node do, host devices and a
// lone GPU fill alone.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { nodeFillOptions, type DeviceSlot } from '../../src/native/devices.js';

const gpu = (index: number): DeviceSlot => ({ backend: 'cuda', index, uuid: `GPU-${index}` });
const host = (index: number): DeviceSlot => ({ backend: 'host', index, uuid: `host-${index}` });

test('two or more GPUs get one group with a fresh id and the rank count as its size', () => {
  const a = nodeFillOptions({ threads: 12 }, [gpu(0), gpu(1)], 2);
  const b = nodeFillOptions({ threads: 12 }, [gpu(0), gpu(1)], 2);
  assert.is(a.threads, 12);
  assert.is(a.group?.size, 2);
  assert.match(a.group!.id, /^[0-9a-f-]{36}$/);
  assert.is.not(a.group!.id, b.group!.id, 'each load is its own group');
});

test('one GPU, or host devices, fill alone with the options unchanged', () => {
  const options = { chunkBytes: 4 << 20 };
  assert.is(nodeFillOptions(options, [gpu(0)], 1), options);
  assert.is(nodeFillOptions(options, [host(0), host(1)], 2), options);
});

test.run();
