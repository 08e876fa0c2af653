// The keeper's wire format (docs/spec/keeper-wire.md; native/keeper/keeper_wire.h is the other
// side, and test/vectors/keeper-wire.json holds both to it): frames "WGTK" + u16 BE version + u32
// BE payload length + payload. A request's payload is an op byte and its body; a reply's is a
// status byte (0 ok, else a code and a message) and its body. Integers are big-endian, strings
// u16 length + UTF-8, blobs u32 length + bytes.
import { KeeperError, ProtocolError, receivedCode, type ErrorCode } from '../errors.js';

export const KEEPER_MAGIC = Buffer.from('WGTK', 'latin1');
export const KEEPER_PROTOCOL_VERSION = 1;
export const KEEPER_HEADER_BYTES = 10;
/** The keeper refuses a larger request payload (a record's blob must fit in it; docs/spec/keeper-wire.md §1 says why 64 MiB). */
export const KEEPER_MAX_REQUEST_BYTES = 64 << 20;
/** Any op but KEEP: the keeper refuses a larger payload on its op byte (§1), and a KEEP this large that brought no fds. */
export const KEEPER_MAX_OTHER_REQUEST_BYTES = 1 << 20;
/** Every reply frame, header included, fits (a client reads no more): the keeper refuses a KEEP that would make its LIST reply larger (E_KEEPER_FULL). */
export const KEEPER_MAX_REPLY_BYTES = 256 << 20;
/** What a keeper of a build before 2026-12-05 accepts (§1): a KEEP past it fails on such a keeper. */
export const KEEPER_V1_MAX_REQUEST_BYTES = 1 << 20;
/** The keeper refuses a record of more descriptors. */
export const KEEPER_MAX_RECORD_FDS = 4096;

/** The codes the keeper replies with (native/keeper/*.cpp); test/keeper/keeperCodes.test.ts holds this list to the C++ source and docs/keeper.md. */
export const KEEPER_ERROR_CODES = [
  'E_BAD_MAGIC', 'E_BAD_REQUEST', 'E_BAD_VERSION', 'E_FRAME_TOO_LARGE', 'E_INTERNAL', 'E_KEEPER_FDS', 'E_KEEPER_FULL', 'E_NOT_KEPT', 'E_NO_FDS',
  'E_READ_TIMEOUT', 'E_TOO_MANY_FDS', 'E_TOO_MANY_WATCHERS', 'E_UNEXPECTED_FDS', 'E_UNKNOWN_OP',
] as const satisfies readonly ErrorCode[];

export const KeeperOp = { keep: 1, take: 2, drop: 3, list: 4, ping: 5, watch: 6 } as const;

/** One record as LIST reports it. */
export interface KeptRecord {
  device: string;
  fingerprint: string;
  fdCount: number;
  ageMs: number;
  /** The process that kept or last took it; 0 for none. */
  ownerPid: number;
  ownerAlive: boolean;
  /** Time left before the keeper frees it; 0 while its owner lives. */
  expiresInMs: number;
  record: Buffer;
}

export interface KeeperPing {
  pid: number;
  protocolVersion: number;
  records: number;
  fds: number;
  uptimeMs: number;
}

export interface TakenRecord {
  record: Buffer;
  /** How long ago it was kept. */
  ageMs: number;
}

class Writer {
  readonly #parts: Buffer[] = [];
  #length = 0;

  /** The payload's length so far, without joining its parts (a KEEP's record is megabytes). */
  get length(): number {
    return this.#length;
  }

  #push(...parts: Buffer[]): void {
    for (const p of parts) this.#length += p.length;
    this.#parts.push(...parts);
  }

  u8(v: number): this {
    this.#push(Buffer.of(v));
    return this;
  }

  str(s: string, what: string): this {
    const b = Buffer.from(s, 'utf8');
    if (b.length > 0xffff) throw new ProtocolError('E_BAD_REQUEST', `${what} is ${b.length} bytes of UTF-8; the keeper's strings hold at most 65535`, { what });
    const len = Buffer.alloc(2);
    len.writeUInt16BE(b.length);
    this.#push(len, b);
    return this;
  }

  blob(b: Buffer): this {
    const len = Buffer.alloc(4);
    len.writeUInt32BE(b.length);
    this.#push(len, b);
    return this;
  }

  frame(): Buffer {
    const payload = Buffer.concat(this.#parts);
    const limit = payload[0] === KeeperOp.keep ? KEEPER_MAX_REQUEST_BYTES : KEEPER_MAX_OTHER_REQUEST_BYTES;
    if (payload.length > limit) {
      throw new ProtocolError('E_FRAME_TOO_LARGE', `a keeper request of ${payload.length} bytes exceeds its limit of ${limit}: keep a smaller record`, { bytes: payload.length });
    }
    const header = Buffer.alloc(KEEPER_HEADER_BYTES);
    KEEPER_MAGIC.copy(header, 0);
    header.writeUInt16BE(KEEPER_PROTOCOL_VERSION, 4);
    header.writeUInt32BE(payload.length, 6);
    return Buffer.concat([header, payload]);
  }
}

/** Bounds-checked reads of a reply's body: a short or long reply is E_KEEPER_REPLY. */
class Reader {
  #pos = 0;
  constructor(private readonly buf: Buffer) {}

  #take(n: number, what: string): Buffer {
    if (this.buf.length - this.#pos < n) {
      throw new ProtocolError('E_KEEPER_REPLY', `keeper reply truncated: ${what} needs ${n} bytes at offset ${this.#pos} of ${this.buf.length}`);
    }
    const b = this.buf.subarray(this.#pos, this.#pos + n);
    this.#pos += n;
    return b;
  }

  u8(what: string): number {
    return this.#take(1, what).readUInt8();
  }

  u32(what: string): number {
    return this.#take(4, what).readUInt32BE();
  }

  u64(what: string): number {
    return Number(this.#take(8, what).readBigUInt64BE());
  }

  str(what: string): string {
    return this.#take(this.#take(2, what).readUInt16BE(), what).toString('utf8');
  }

  blob(what: string): Buffer {
    return Buffer.from(this.#take(this.u32(what), what));
  }

  end(): void {
    if (this.#pos !== this.buf.length) throw new ProtocolError('E_KEEPER_REPLY', `keeper reply has ${this.buf.length - this.#pos} bytes past its last field`);
  }
}

/** A KEEP's payload (§3): the one definition of both its frame and its size. */
const keepPayload = (device: string, fingerprint: string, record: Buffer): Writer =>
  new Writer().u8(KeeperOp.keep).str(device, 'device').str(fingerprint, 'fingerprint').blob(record);
export const encodeKeep = (device: string, fingerprint: string, record: Buffer): Buffer => keepPayload(device, fingerprint, record).frame();
/** The payload length of encodeKeep's frame, which a keeper holds to its request limit (§1), computed without building the frame. */
export const keepPayloadBytes = (device: string, fingerprint: string, record: Buffer): number => keepPayload(device, fingerprint, record).length;
export const encodeTake = (device: string, fingerprint: string): Buffer =>
  new Writer().u8(KeeperOp.take).str(device, 'device').str(fingerprint, 'fingerprint').frame();
/** fingerprint "" drops every record of `device`; device "" drops every record. */
export const encodeDrop = (device: string, fingerprint: string): Buffer =>
  new Writer().u8(KeeperOp.drop).str(device, 'device').str(fingerprint, 'fingerprint').frame();
export const encodeList = (): Buffer => new Writer().u8(KeeperOp.list).frame();
export const encodePing = (): Buffer => new Writer().u8(KeeperOp.ping).frame();
export const encodeWatch = (): Buffer => new Writer().u8(KeeperOp.watch).frame();

/** The body of an ok reply; a keeper's error reply is thrown as a KeeperError with its code. */
function replyBody(frame: Buffer): Reader {
  if (frame.length < KEEPER_HEADER_BYTES || !frame.subarray(0, 4).equals(KEEPER_MAGIC)) {
    throw new ProtocolError('E_KEEPER_REPLY', `the reply does not start with "WGTK" (got ${JSON.stringify(frame.subarray(0, 4).toString('latin1'))}): the socket is not a weightd keeper's`);
  }
  const version = frame.readUInt16BE(4);
  if (version !== KEEPER_PROTOCOL_VERSION) {
    throw new ProtocolError('E_KEEPER_REPLY', `the keeper speaks protocol version ${version}, this weightd ${KEEPER_PROTOCOL_VERSION}: run a keeper of the same weightd release`, { version });
  }
  const body = new Reader(frame.subarray(KEEPER_HEADER_BYTES));
  const status = body.u8('status');
  if (status !== 0) {
    const code = body.str('error code');
    const message = body.str('error message');
    throw new KeeperError(receivedCode(code), `keeper: ${message}`, { keeperCode: code });
  }
  return body;
}

export function decodeEmpty(frame: Buffer): void {
  replyBody(frame).end();
}

export function decodeTake(frame: Buffer): TakenRecord {
  const r = replyBody(frame);
  const taken = { record: r.blob('record'), ageMs: r.u32('age') };
  r.end();
  return taken;
}

export function decodeDrop(frame: Buffer): number {
  const r = replyBody(frame);
  const n = r.u32('records dropped');
  r.end();
  return n;
}

export function decodeList(frame: Buffer): KeptRecord[] {
  const r = replyBody(frame);
  const records: KeptRecord[] = [];
  for (let i = r.u32('record count'); i > 0; i--) {
    records.push({
      device: r.str('device'),
      fingerprint: r.str('fingerprint'),
      fdCount: r.u32('fd count'),
      ageMs: r.u64('age'),
      ownerPid: r.u32('owner pid'),
      ownerAlive: r.u8('owner alive') === 1,
      expiresInMs: r.u64('expires in'),
      record: r.blob('record'),
    });
  }
  r.end();
  return records;
}

export function decodePing(frame: Buffer): KeeperPing {
  const r = replyBody(frame);
  const ping = { pid: r.u32('pid'), protocolVersion: r.u32('protocol version'), records: r.u32('records'), fds: r.u32('fds'), uptimeMs: r.u64('uptime') };
  r.end();
  return ping;
}
