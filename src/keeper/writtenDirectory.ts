// The directory a written version is tied to (docs/spec/kept-written.md §1, §3.1), apart from
// writtenIdentity.ts because it reads the filesystem, and the model registry, which loads that
// module, loads no I/O (test/architecture/importGraph.test.ts).
import { realpathSync } from 'node:fs';

/**
 * The checkpoint directory a written version is tied to (docs/spec/kept-written.md §1, §3.1): `dir`
 * with every symbolic link followed, as it resolves now, so that a model named through a link and
 * a link repointed to another checkout are judged by the directory itself. A commit records it
 * once (PlannedModel.writtenOver); a restart resolves both its record's and its own again. `dir`
 * as given when it does not resolve (gone): no directory a start plans, which resolves, is it.
 */
export function writtenDirectory(dir: string): string {
  try {
    return realpathSync(dir);
  } catch {
    return dir;
  }
}
