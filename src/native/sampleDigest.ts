// A daemon's content-fingerprint sample (src/checkpoint/sampleContent.ts's FileSampler): the
// sampled ranges read and hashed by the addon on a libuv thread (native/sampled_digest.h). Which
// ranges, how the file is opened and the errors' wording stay sampleContent.ts's.
import { samplerWith, type FileSampler } from '../checkpoint/sampleContent.js';
import { addon } from './addon.js';

export const sampleWithAddon: FileSampler = samplerWith((fd, ranges, mergeGap) => addon().sampleDigest(fd, ranges, mergeGap));
