// A corpus of broken safetensors files: each must be rejected with the CheckpointError code of
// the rule it breaks, a message naming the file (and the tensor, where there is one), and no
// other kind of failure.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import { parseSafetensors } from '../../src/checkpoint/parseSafetensors.js';
import { CheckpointError } from '../../src/errors.js';
import { makeTempDir, rejectsWith, removeDir, writeRawSafetensors } from '../helpers/checkpoints.js';

interface Case {
  name: string;
  code: string;
  write: (path: string) => Promise<void> | void;
  /** Words the message must contain besides the file path. */
  mentions?: string[];
}

const entry = (dtype: unknown, shape: unknown, offsets: unknown): string => JSON.stringify({ dtype, shape, data_offsets: offsets });
/** A header with one tensor "w" and `data` bytes after it. */
const one = (e: string, data = 16) => (p: string) => writeRawSafetensors(p, `{"w":${e}}`, data);

const cases: Case[] = [
  { name: 'empty file', code: 'E_ST_TOO_SMALL', write: (p) => writeFileSync(p, '') },
  { name: '7-byte file', code: 'E_ST_TOO_SMALL', write: (p) => writeFileSync(p, Buffer.alloc(7)) },
  { name: 'header length just over 100 MB', code: 'E_ST_HEADER_TOO_LARGE', write: (p) => writeRawSafetensors(p, '{}', 0, 100_000_001n) },
  { name: 'header length 2^64-1', code: 'E_ST_HEADER_TOO_LARGE', write: (p) => writeRawSafetensors(p, '{}', 0, (1n << 64n) - 1n) },
  { name: 'header length 2^63 (negative as i64)', code: 'E_ST_HEADER_TOO_LARGE', write: (p) => writeRawSafetensors(p, '{}', 0, 1n << 63n) },
  { name: 'header length past end of file', code: 'E_ST_HEADER_TRUNCATED', write: (p) => writeRawSafetensors(p, '{}', 0, 100n) },
  { name: 'only the length field', code: 'E_ST_HEADER_TRUNCATED', write: (p) => writeRawSafetensors(p, '', 0, 1n) },
  { name: 'invalid UTF-8 byte', code: 'E_ST_HEADER_UTF8', write: (p) => writeRawSafetensors(p, Buffer.from([0x7b, 0xff, 0x7d])) },
  { name: 'UTF-8 encoded surrogate', code: 'E_ST_HEADER_UTF8', write: (p) => writeRawSafetensors(p, Buffer.from([0x7b, 0x22, 0xed, 0xa0, 0x80, 0x22, 0x7d])) },
  { name: 'byte-order mark before the JSON', code: 'E_ST_HEADER_JSON', write: (p) => writeRawSafetensors(p, '\ufeff{}') },
  { name: 'unterminated JSON', code: 'E_ST_HEADER_JSON', write: (p) => writeRawSafetensors(p, '{"w":') },
  { name: 'garbage after the object', code: 'E_ST_HEADER_JSON', write: (p) => writeRawSafetensors(p, '{}x') },
  { name: 'NUL padding instead of spaces', code: 'E_ST_HEADER_JSON', write: (p) => writeRawSafetensors(p, '{}\0\0\0\0\0\0') },
  { name: 'header is an array', code: 'E_ST_HEADER_NOT_OBJECT', write: (p) => writeRawSafetensors(p, '[]') },
  { name: 'header is a string', code: 'E_ST_HEADER_NOT_OBJECT', write: (p) => writeRawSafetensors(p, '"w"') },
  { name: 'header is null', code: 'E_ST_HEADER_NOT_OBJECT', write: (p) => writeRawSafetensors(p, 'null') },
  {
    name: 'duplicate tensor name', code: 'E_ST_DUPLICATE_TENSOR', mentions: ['"w"'],
    write: (p) => writeRawSafetensors(p, `{"w":${entry('U8', [4], [0, 4])},"w":${entry('U8', [4], [4, 8])}}`, 8),
  },
  {
    name: 'duplicate tensor name spelled with an escape', code: 'E_ST_DUPLICATE_TENSOR', mentions: ['"w"'],
    write: (p) => writeRawSafetensors(p, `{"w":${entry('U8', [4], [0, 4])},"\\u0077":${entry('U8', [4], [4, 8])}}`, 8),
  },
  { name: 'duplicate key inside an entry', code: 'E_ST_DUPLICATE_KEY', write: (p) => writeRawSafetensors(p, '{"w":{"dtype":"U8","dtype":"I8","shape":[4],"data_offsets":[0,4]}}', 4) },
  { name: 'duplicate metadata key', code: 'E_ST_DUPLICATE_KEY', write: (p) => writeRawSafetensors(p, '{"__metadata__":{"a":"1","a":"2"}}') },
  { name: 'entry is a number', code: 'E_ST_BAD_ENTRY', mentions: ['"w"'], write: one('5') },
  { name: 'entry without dtype', code: 'E_ST_BAD_ENTRY', mentions: ['"w"'], write: one('{"shape":[4],"data_offsets":[0,4]}', 4) },
  { name: 'dtype is a number', code: 'E_ST_BAD_ENTRY', mentions: ['"w"'], write: one(entry(1, [4], [0, 4]), 4) },
  { name: 'unknown dtype', code: 'E_ST_UNKNOWN_DTYPE', mentions: ['"w"', 'F128'], write: one(entry('F128', [1], [0, 16])) },
  { name: 'lower-case dtype', code: 'E_ST_UNKNOWN_DTYPE', mentions: ['bf16'], write: one(entry('bf16', [8], [0, 16])) },
  { name: 'shape is not an array', code: 'E_ST_BAD_SHAPE', mentions: ['"w"'], write: one(entry('U8', 16, [0, 16])) },
  { name: 'negative dimension', code: 'E_ST_BAD_SHAPE', mentions: ['"w"'], write: one(entry('U8', [-16], [0, 16])) },
  { name: 'fractional dimension', code: 'E_ST_BAD_SHAPE', write: one(entry('U8', [1.5], [0, 16])) },
  { name: 'dimension as a string', code: 'E_ST_BAD_SHAPE', write: one(entry('U8', ['16'], [0, 16])) },
  { name: 'dimension beyond 2^53', code: 'E_ST_OVERFLOW', mentions: ['"w"'], write: one('{"dtype":"I32","shape":[2,18446744073709551614],"data_offsets":[0,16]}') },
  { name: 'shape product wraps 2^64', code: 'E_ST_OVERFLOW', mentions: ['"w"'], write: one(entry('U8', [2 ** 32, 2 ** 32], [0, 16])) },
  { name: 'bit count wraps 2^64', code: 'E_ST_OVERFLOW', write: one(entry('F64', [2 ** 26, 2 ** 26, 2 ** 10], [0, 16])) },
  { name: 'data_offsets missing', code: 'E_ST_BAD_OFFSETS', mentions: ['"w"'], write: one('{"dtype":"U8","shape":[16]}') },
  { name: 'data_offsets with three numbers', code: 'E_ST_BAD_OFFSETS', write: one(entry('U8', [16], [0, 8, 16])) },
  { name: 'negative data offset', code: 'E_ST_BAD_OFFSETS', write: one(entry('U8', [16], [-1, 15])) },
  { name: 'offset end before begin', code: 'E_ST_OFFSETS', mentions: ['"w"', 'ends before it begins'], write: one(entry('U8', [0], [4, 0])) },
  { name: 'gap before the first tensor', code: 'E_ST_OFFSETS', mentions: ['gap'], write: one(entry('U8', [12], [4, 16])) },
  {
    name: 'overlapping tensors', code: 'E_ST_OFFSETS', mentions: ['overlaps'],
    write: (p) => writeRawSafetensors(p, `{"a":${entry('U8', [16], [0, 16])},"b":${entry('U8', [16], [8, 24])}}`, 24),
  },
  {
    name: 'two tensors sharing one byte range', code: 'E_ST_OFFSETS',
    write: (p) => writeRawSafetensors(p, `{"a":${entry('U8', [16], [0, 16])},"b":${entry('U8', [16], [0, 16])}}`, 16),
  },
  { name: 'shape does not match the byte range', code: 'E_ST_SIZE_MISMATCH', mentions: ['"w"', '[2,2]'], write: one(entry('I32', [2, 2], [0, 8]), 8) },
  { name: 'F4 tensor ending mid-byte', code: 'E_ST_MISALIGNED', mentions: ['F4'], write: one(entry('F4', [3], [0, 2]), 2) },
  { name: 'F6 tensor ending mid-byte', code: 'E_ST_MISALIGNED', write: one(entry('F6_E2M3', [2], [0, 2]), 2) },
  { name: 'offsets past the end of the file', code: 'E_ST_DATA_TRUNCATED', mentions: ['"w"'], write: one(entry('U8', [16], [0, 16]), 8) },
  { name: 'huge tensor in a small file', code: 'E_ST_DATA_TRUNCATED', write: one(entry('U8', [1e12], [0, 1e12]), 8) },
  { name: 'bytes after the last tensor', code: 'E_ST_TRAILING_BYTES', write: one(entry('U8', [16], [0, 16]), 20) },
  { name: 'metadata is a number', code: 'E_ST_BAD_METADATA', write: (p) => writeRawSafetensors(p, '{"__metadata__":5}') },
  { name: 'metadata is an array', code: 'E_ST_BAD_METADATA', write: (p) => writeRawSafetensors(p, '{"__metadata__":["a"]}') },
  { name: 'metadata value is a number', code: 'E_ST_BAD_METADATA', mentions: ['"format"'], write: (p) => writeRawSafetensors(p, '{"__metadata__":{"format":1}}') },
  { name: 'metadata value is an object', code: 'E_ST_BAD_METADATA', write: (p) => writeRawSafetensors(p, '{"__metadata__":{"format":{"pt":"1"}}}') },
  { name: 'file does not exist', code: 'E_ST_IO', write: () => {} },
  { name: 'a directory', code: 'E_FILE_NOT_REGULAR', write: (p) => { mkdirSync(p); } },
];

test('the corpus covers at least 30 malformed files', () => {
  if (cases.length < 30) throw new Error(`only ${cases.length} cases`);
});

for (const [i, c] of cases.entries()) {
  test(`rejects ${c.name} with ${c.code}`, async () => {
    const dir = makeTempDir('bad-st');
    try {
      const path = join(dir, `case-${i}.safetensors`);
      await c.write(path);
      const err = await rejectsWith(() => parseSafetensors(path), CheckpointError, c.code, path, ...(c.mentions ?? []));
      if (err.details.file !== path) throw new Error(`details.file should be ${path}, got ${String(err.details.file)}`);
    } finally {
      removeDir(dir);
    }
  });
}

test.run();
