// The checkpoint layer's surface for tools outside src/ (bench/); src/ itself imports the files
// it needs directly, not this index.

export { planCheckpoint, ARENA_ALIGNMENT, type PlanOptions } from './planCheckpoint.js';
export { parseSafetensors, MAX_HEADER_BYTES, type SafetensorsHeader, type SafetensorsTensor } from './parseSafetensors.js';
export { writeSafetensors, encodeSafetensorsHeader, type TensorToWrite } from './writeSafetensors.js';
export { createHeaderPool, parseShards, INLINE_PARSE_MAX_FILES } from './parseShards.js';
export { PROTOCOL_VERSION, fingerprintCheckpoint, rankFingerprint } from './fingerprint.js';
export { DTYPE_BITS, DTYPES, isDtype, bytesForElements, type SafetensorsDtype } from './dtypes.js';
export { FAMILIES, familyOf } from './tpRules.js';
export type * from './types.js';
