// Every file weightd reads is opened here: the checkpoint's (weights, config.json, the index, a
// plan file), and node.json and the device locks of the socket directory, which anyone with
// write access to it could replace. The one rule in TypeScript (native/file_reader.cpp's
// openRegularFile is its twin for the copy engine, which opens the shards again in C++). open(2) of a FIFO blocks until a writer
// appears, in a libuv thread that nothing can interrupt, and a character device such as
// /dev/zero reads forever: so the file is opened with O_NONBLOCK (which does not change reads of
// regular files) and its type checked with fstat on the descriptor itself, before any read, so
// a path swapped between a stat and the open cannot slip through.

import { closeSync, constants, fstatSync, openSync, readSync, type Stats } from 'node:fs';
import { open, stat, type FileHandle } from 'node:fs/promises';
import { CheckpointError } from '../errors.js';

/** What a file that is not a regular one is, for error messages. */
export function fileTypeName(s: Stats): string {
  if (s.isFIFO()) return 'a FIFO (named pipe)';
  if (s.isCharacterDevice()) return 'a character device';
  if (s.isBlockDevice()) return 'a block device';
  if (s.isSocket()) return 'a socket';
  if (s.isDirectory()) return 'a directory';
  return 'not a regular file';
}

function notRegular(path: string, s: Stats): CheckpointError {
  return new CheckpointError('E_FILE_NOT_REGULAR', `${path} is ${fileTypeName(s)}, not a regular file; weightd reads only plain files (a symlink to one is fine): replace it with the real file`, { file: path });
}

function tooLarge(path: string, size: number, maxBytes: number): CheckpointError {
  return new CheckpointError('E_FILE_TOO_LARGE', `${path} is ${size} bytes, over the ${maxBytes}-byte limit for this file; it is not the file it should be: check the path`, { file: path, maxBytes });
}

function grew(path: string, size: number): CheckpointError {
  return new CheckpointError('E_FILE_CHANGED', `${path} grew while it was being read (fstat said ${size} bytes); something is writing to it: wait for the download to finish`, { file: path });
}

/** O_NONBLOCK: open(2) of a FIFO returns at once instead of waiting for a writer; regular files read as ever. */
const OPEN_FLAGS = constants.O_RDONLY | constants.O_NONBLOCK;

export interface RegularFile {
  fh: FileHandle;
  size: number;
}

/** Opens `path` for reading if it is a regular file (symlinks followed). Throws E_FILE_NOT_REGULAR, or the open's own error. */
export async function openRegularFile(path: string): Promise<RegularFile> {
  const fh = await open(path, OPEN_FLAGS);
  try {
    const s = await fh.stat();
    if (!s.isFile()) throw notRegular(path, s);
    return { fh, size: s.size };
  } catch (err) {
    await fh.close();
    throw err;
  }
}

/** true for a regular file, false when nothing is there; E_FILE_NOT_REGULAR for anything else. stat(2) never blocks on a FIFO. */
export async function isRegularFile(path: string): Promise<boolean> {
  let s: Stats;
  try {
    s = await stat(path);
  } catch {
    return false;
  }
  if (!s.isFile()) throw notRegular(path, s);
  return true;
}

/**
 * Limits for the JSON files that are read whole. A config.json is a few KB; the index of the
 * largest public checkpoints (DeepSeek-V3: 91k tensors in 163 shards) is under 10 MB, so 64 MiB
 * leaves room while a mistaken link to a large file fails at once instead of filling memory.
 */
export const MAX_CONFIG_BYTES = 16 << 20;
export const MAX_INDEX_BYTES = 64 << 20;

/** The whole of a small regular file as UTF-8; E_FILE_TOO_LARGE past `maxBytes`, checked before reading and by the read itself, which never asks for more than maxBytes + 1. */
export async function readSmallFile(path: string, maxBytes: number): Promise<string> {
  const { fh, size } = await openRegularFile(path);
  try {
    if (size > maxBytes) throw tooLarge(path, size, maxBytes);
    // One byte more than fstat said: a file that grows while being read is seen, not cut short.
    const buf = Buffer.alloc(size + 1);
    let done = 0;
    while (done < buf.length) {
      const { bytesRead } = await fh.read(buf, done, buf.length - done, done);
      if (bytesRead === 0) return buf.toString('utf8', 0, done);
      done += bytesRead;
    }
    throw grew(path, size);
  } finally {
    await fh.close();
  }
}

/** openRegularFile on the calling thread: the descriptor of `path` if it is a regular file (the caller closes it), and its size. */
export function openRegularFileSync(path: string): { fd: number; size: number } {
  const fd = openSync(path, OPEN_FLAGS);
  try {
    const s = fstatSync(fd);
    if (!s.isFile()) throw notRegular(path, s);
    return { fd, size: s.size };
  } catch (err) {
    closeSync(fd);
    throw err;
  }
}

/**
 * readSmallFile on the calling thread, for the small files that are read where no await fits
 * (lock takeover, manifest removal at exit, the --models file while flags are parsed). Only a
 * regular file is read, so the thread never blocks on a FIFO planted in the directory.
 */
export function readSmallFileSync(path: string, maxBytes: number): string {
  const { fd, size } = openRegularFileSync(path);
  try {
    if (size > maxBytes) throw tooLarge(path, size, maxBytes);
    const buf = Buffer.alloc(size + 1);
    let done = 0;
    while (done < buf.length) {
      const bytesRead = readSync(fd, buf, done, buf.length - done, done);
      if (bytesRead === 0) return buf.toString('utf8', 0, done);
      done += bytesRead;
    }
    throw grew(path, size);
  } finally {
    closeSync(fd);
  }
}
