// How the keeper files a rank's shard: by its device and its rank fingerprint. A model's
// shards (models/shardsOf.ts) are named this way for the drops.

/** One rank's shard as the keeper files it. */
export interface ShardKey {
  device: string;
  fingerprint: string;
}
