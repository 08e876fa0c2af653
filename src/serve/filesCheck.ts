// Whether the checkpoint files a served model version was loaded from are still the ones on disk
// (the identity rule: src/files/fileIdentity.ts), asked before a lease is granted and by the
// device server's sweep. One per version, shared by its ranks on every device, so the first rank
// to see a change makes them all stale at once. A stat per file, at most once per period: each
// answer is trusted for `periodMs` after the check that gave it began (docs/spec/file-identity.md,
// "When it is checked"). Stale is for good: a file put back is not the bytes that were loaded.
import { changedFiles, type FileIdentity, type IdentityChange } from '../files/fileIdentity.js';

export class FilesCheck {
  readonly files: readonly FileIdentity[];
  readonly periodMs: number;
  #stale: IdentityChange[] | undefined;
  /** The last check: when it began, and its answer. */
  #last: { startedAt: number; changes: Promise<IdentityChange[]> } | undefined;
  readonly #listeners = new Set<(changes: IdentityChange[]) => void>();

  constructor(files: readonly FileIdentity[], periodMs: number) {
    this.files = files;
    this.periodMs = periodMs;
  }

  /** The changes that made the version stale; undefined while its files are unchanged. */
  get stale(): IdentityChange[] | undefined {
    return this.#stale;
  }

  /** Calls `listener` once, when the version turns stale (at once when it is already). Returns the unsubscribe. */
  onStale(listener: (changes: IdentityChange[]) => void): () => void {
    if (this.#stale) {
      listener(this.#stale);
      return () => {};
    }
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  /**
   * Stats the files unless a check began less than `periodMs` ago (then its answer stands), and
   * resolves to the changes once stale, undefined while unchanged. Never rejects: a file that
   * cannot be stat'ed is a change (gone).
   */
  async check(): Promise<IdentityChange[] | undefined> {
    if (this.#stale) return this.#stale;
    const now = performance.now();
    if (this.#last === undefined || now - this.#last.startedAt >= this.periodMs) this.#last = { startedAt: now, changes: changedFiles(this.files) };
    const changes = await this.#last.changes;
    if (changes.length > 0 && !this.#stale) {
      this.#stale = changes;
      for (const l of this.#listeners) l(changes);
      this.#listeners.clear();
    }
    return this.#stale;
  }
}
