// The rendezvous protocol's messages, between every node's GroupMember and node 0's
// Coordinator, over TCP. Framing (magic "WGTD", frame version, length, JSON payload) is the
// serving protocol's codec (src/wire/frameCodec.ts); this file is the message set on top.
//
// Compatibility rule: `hello` and `join` carry the protocol version, and the shapes of `hello`,
// `rejected` and the version/nodeRank/hostName fields of `join` never change. So two weightd
// builds that disagree on everything else can still tell every node *why* they cannot form a
// group, instead of failing on a schema error. Objects drop unknown keys (a newer peer may add
// optional fields); strings and arrays are bounded so one frame stays small.
import { z } from 'zod';
import { clipText, ProtocolError, schemaIssues } from '../errors.js';
import { encodeMessage, FrameDecoder, parsePayload } from '../wire/frameCodec.js';

/**
 * Version of the rendezvous message set; nodes must agree on it exactly. 2: model groups
 * (model_*). 3: reloads of a stale model across nodes (model_stale, model_reload).
 */
export const RDZV_PROTOCOL_VERSION = 3;

/** Largest frame either side accepts. The biggest message, the rank table of 4096 ranks, is ~600 KiB. */
export const MAX_RDZV_FRAME_BYTES = 1 << 20;

const MAX_RANKS = 4096;
const count = z.int().min(0).max(MAX_RANKS * 1024);
const positive = z.int().min(1).max(MAX_RANKS);
const nodeRank = z.int().min(0).max(MAX_RANKS - 1);
const shortText = z.string().min(1).max(256);
/** What a `message` or `reason` may hold: longer text is clipped when sent (withinBounds), never refused by every node. */
const MAX_REASON_CHARS = 2000;
const reason = z.string().max(MAX_REASON_CHARS);
const rankList = z.array(nodeRank).max(MAX_RANKS);
const MAX_FINGERPRINT_FIELDS = 64;

/** HMAC-SHA256 of the hello nonce under the token, base64 (44 characters); null: no token. */
const tokenProof = z.string().regex(/^[A-Za-z0-9+/]{43}=$/).nullable();

const fingerprintFields = z.record(z.string().min(1).max(64), shortText)
  .refine((f) => Object.keys(f).length <= MAX_FINGERPRINT_FIELDS, `at most ${MAX_FINGERPRINT_FIELDS} fingerprint fields`);

/** Which model version a model-group message is about: its name and checkpoint fingerprint. */
const modelVersion = { name: shortText, fingerprint: shortText };

export const RankTableEntrySchema = z.object({
  globalRank: count,
  nodeRank,
  localRank: count,
  hostName: shortText,
  deviceUuid: shortText,
});

// ---- client -> coordinator ----

export const JoinMessage = z.object({
  type: z.literal('join'),
  protocolVersion: z.int(),
  nnodes: positive,
  tpSize: positive,
  localWorldSize: positive,
  nodeRank,
  hostName: shortText,
  /** One per local rank, in local-rank order. */
  deviceUuids: z.array(shortText).max(MAX_RANKS),
  /** How many devices of its backend the node sees (not only the ones it uses). */
  visibleDevices: count,
  fingerprint: shortText,
  /**
   * The fingerprint's per-field hashes, so a refusal names the fields that differ ("content").
   * Optional: a join without them is still checked on the fingerprint, and refused naming it.
   */
  fingerprintFields: fingerprintFields.optional(),
  tokenProof,
});
export type JoinMessage = z.infer<typeof JoinMessage>;

/** What is readable in a join from any protocol version: enough to name the node. */
const AnyVersionJoin = z.object({
  type: z.literal('join'),
  protocolVersion: z.int(),
  nodeRank: z.unknown().optional(),
  hostName: z.unknown().optional(),
});

export const ClientMessage = z.discriminatedUnion('type', [
  JoinMessage,
  /**
   * Every local rank is serving. `content`: the bytes it holds, compared across nodes at the
   * barrier (nodeContent.ts); absent from a node without digests (an older weightd).
   */
  z.object({
    type: z.literal('ready'),
    content: z.object({ fingerprint: z.string().regex(/^[0-9a-f]{64}$/), digests: z.string().regex(/^[0-9a-f]*$/).max(8 * 100_000) }).optional(),
  }),
  /** This node failed locally; during start-up the coordinator fails the whole group. */
  z.object({ type: z.literal('failed'), code: shortText, message: reason }),
  z.object({ type: z.literal('heartbeat') }),
  /** A clean goodbye, so peers can log why instead of "connection lost". */
  z.object({ type: z.literal('leaving'), reason }),
  /**
   * Sent instead of a join by a node that failed before it could join (its checkpoint could
   * not be planned, say): a starting group fails now instead of at its timeout.
   */
  z.object({ type: z.literal('abort'), nodeRank, hostName: shortText, tokenProof, code: shortText, message: reason }),
  // A model that spans the group, loaded while serving (docs/multi-node.md, "Models across
  // nodes"): each node joins its model group once planned, loads it to resident but not
  // attachable, and says so; node 0 then commits it everywhere, or aborts it everywhere.
  z.object({ type: z.literal('model_join'), ...modelVersion, tpSize: positive, fingerprintFields: fingerprintFields.optional() }),
  z.object({ type: z.literal('model_resident'), ...modelVersion }),
  /** This node could not load it; without a fingerprint: it could not even plan it (and did not join). */
  z.object({ type: z.literal('model_failed'), name: shortText, fingerprint: shortText.optional(), code: shortText, message: reason }),
  /** This node's files of a version that spans the group changed (it drains here): node 0 has every node load the model again. */
  z.object({ type: z.literal('model_stale'), ...modelVersion }),
]);
export type ClientMessage = z.infer<typeof ClientMessage>;

// ---- coordinator -> client ----

export const ServerMessage = z.discriminatedUnion('type', [
  /** First frame on every connection; the nonce makes a token proof useless to replay. */
  z.object({ type: z.literal('hello'), protocolVersion: z.int(), nonce: z.string().min(16).max(256) }),
  /** The join was accepted; the group is still gathering. Sent again whenever it changes. */
  z.object({ type: z.literal('waiting'), joined: rankList, missing: rankList }),
  /** Every node was accepted: the global rank table. Load now. */
  z.object({ type: z.literal('joined'), rankTable: z.array(RankTableEntrySchema).max(MAX_RANKS) }),
  /** Every node is serving. `lost`: nodes that are down right now (only ever non-empty for a rejoin). */
  z.object({ type: z.literal('group_ready'), lost: rankList }),
  /** The group cannot form (or, while serving, this node cannot rejoin): the same verdict for every node. */
  z.object({
    type: z.literal('rejected'),
    code: shortText,
    message: reason,
    details: z.record(z.string().max(64), z.unknown()).optional(),
  }),
  z.object({ type: z.literal('peer_lost'), nodeRank, reason }),
  z.object({ type: z.literal('peer_back'), nodeRank }),
  z.object({ type: z.literal('heartbeat') }),
  z.object({ type: z.literal('leaving'), reason }),
  /** A model group is gathering: who has joined it so far. */
  z.object({ type: z.literal('model_waiting'), ...modelVersion, joined: rankList, missing: rankList }),
  /** Resident on every node: serve it now (the older version of its name drains). */
  z.object({ type: z.literal('model_commit'), ...modelVersion }),
  /** The model group failed: free it; the older version keeps serving. The same verdict for every node. */
  z.object({
    type: z.literal('model_abort'),
    ...modelVersion,
    code: shortText,
    message: reason,
    details: z.record(z.string().max(64), z.unknown()).optional(),
  }),
  /**
   * Node `nodeRank` found this version stale: every node loads the model again from its own
   * files, as `weightd ctl load` on every node would (src/models/groupReload.ts).
   */
  z.object({ type: z.literal('model_reload'), ...modelVersion, nodeRank }),
]);
export type ServerMessage = z.infer<typeof ServerMessage>;

export type AnyMessage = ClientMessage | ServerMessage;

/** `message` with its `message` and `reason` clipped to what the schemas take: a verdict that names many nodes, or a failure report that a coordinator prefixed, still reaches every node. */
function withinBounds(message: AnyMessage): AnyMessage {
  const out: Record<string, unknown> = { ...message };
  for (const key of ['message', 'reason'] as const) {
    const text = out[key];
    // Room left for the clip's own suffix.
    if (typeof text === 'string' && text.length > MAX_REASON_CHARS) out[key] = clipText(text, MAX_REASON_CHARS - 40);
  }
  return out as AnyMessage;
}

/** Encodes one message as a frame; a message over the bound is a bug here, not the peer's. */
export function encodeRdzvMessage(message: AnyMessage): Buffer {
  const frame = encodeMessage(withinBounds(message));
  if (frame.length > MAX_RDZV_FRAME_BYTES) {
    throw new ProtocolError('E_RDZV_FRAME_TOO_LARGE', `rendezvous message "${message.type}" is ${frame.length} bytes, over the ${MAX_RDZV_FRAME_BYTES}-byte frame bound`);
  }
  return frame;
}

export function createRdzvDecoder(): FrameDecoder {
  return new FrameDecoder(MAX_RDZV_FRAME_BYTES);
}

function invalid(what: string, error: z.ZodError): ProtocolError {
  // The first issues, clipped (schemaIssues): zod's whole report of a stranger's 70,000 bad
  // fields took 480 ms and made a 5.9 MB message, logged and sent back.
  return new ProtocolError('E_RDZV_SCHEMA', `invalid rendezvous ${what}: ${schemaIssues(error.issues)}`);
}

/**
 * A client message. A join from another protocol version is returned as `{foreignVersion}`
 * with what can be read of it, so the coordinator can reject it by name rather than as noise.
 */
export function parseClientMessage(payload: Buffer):
  | { message: ClientMessage }
  | { foreignVersion: number; nodeRank?: number; hostName?: string } {
  const value = parsePayload(payload);
  const envelope = AnyVersionJoin.safeParse(value);
  if (envelope.success && envelope.data.protocolVersion !== RDZV_PROTOCOL_VERSION) {
    const { nodeRank: r, hostName: h } = envelope.data;
    return {
      foreignVersion: envelope.data.protocolVersion,
      nodeRank: Number.isInteger(r) ? (r as number) : undefined,
      hostName: typeof h === 'string' ? h.slice(0, 256) : undefined,
    };
  }
  const parsed = ClientMessage.safeParse(value);
  if (!parsed.success) throw invalid('client message', parsed.error);
  return { message: parsed.data };
}

export function parseServerMessage(payload: Buffer): ServerMessage {
  const parsed = ServerMessage.safeParse(parsePayload(payload));
  if (!parsed.success) throw invalid('coordinator message', parsed.error);
  return parsed.data;
}
