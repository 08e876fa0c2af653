// A written version's manifest digest (docs/spec/kept-written.md §2) and its directory check
// (§3.1, on real trees of directories and symbolic links) against test/vectors/kept-written.json,
// whose values were computed apart from src/keeper/writtenIdentity.ts, and what the identity check
// names when it refuses a record.
import { mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { CheckpointPlan } from '../../src/checkpoint/types.js';
import { writtenDirectory } from '../../src/keeper/writtenDirectory.js';
import { manifestDigest, writtenIdentityRefusal } from '../../src/keeper/writtenIdentity.js';
import { repoRoot } from '../helpers/paths.js';

interface ManifestCase {
  description: string;
  ranks: CheckpointPlan['ranks'];
  expected: { manifest: string };
}

interface DirectoryCase {
  description: string;
  dirs: string[];
  links: Record<string, string>;
  commit: string;
  repoint?: Record<string, string>;
  restart: string;
  expected: { recorded: string; same: boolean };
}

const vectors = JSON.parse(readFileSync(`${repoRoot}test/vectors/kept-written.json`, 'utf8')) as { cases: ManifestCase[]; directories: DirectoryCase[] };

test('the manifest digest is the SHA-256 of every rank\'s tensors and sorted aliases, as the vectors say', () => {
  for (const c of vectors.cases) assert.is(manifestDigest(c.ranks), c.expected.manifest, c.description);
  assert.is.not(vectors.cases[0]!.expected.manifest, vectors.cases[1]!.expected.manifest, 'two names swapped, nothing moved');
});

test('a refusal names the directories, then every field that differs besides content and protocol, then the manifest', () => {
  const ranks = vectors.cases[0]!.ranks;
  const fields = { headers: 'h1', config: 'c1', content: 'x', protocol: 'p' };
  const e = { name: 'tiny', modelDir: '/m/a', plan: { fingerprintFields: { ...fields, content: 'y', protocol: 'q' }, ranks }, resolve: writtenDirectory };
  const written = { fields, manifest: manifestDigest(ranks) };
  assert.is(writtenIdentityRefusal({ model: '/m/a', written }, e), undefined, 'content and protocol are the version\'s own');
  assert.match(writtenIdentityRefusal({ model: '/m/b', written }, e)!, 'written over the checkpoint in /m/b, and this start serves model "tiny" from /m/a');
  assert.match(writtenIdentityRefusal({ model: '/m/a', written: { ...written, fields: { ...fields, headers: 'h0', config: 'c0' } } }, e)!, "fingerprint's config, headers (docs/spec/fingerprint.md §4)");
  assert.match(writtenIdentityRefusal({ model: '/m/a', written: { ...written, fields: { ...fields, quantization: 'q' } } }, e)!, "fingerprint's quantization");
  assert.match(writtenIdentityRefusal({ model: '/m/a', written: { ...written, manifest: vectors.cases[1]!.expected.manifest } }, e)!, 'its tensors (names, dtypes, shapes, places) are not the ones model "tiny" has now');
});

test('the directory a commit records and a restart compares is the real one, every symbolic link followed, as the vectors say', () => {
  const ranks = vectors.cases[0]!.ranks;
  const fields = { headers: 'h1' };
  const written = { fields, manifest: manifestDigest(ranks) };
  assert.ok(vectors.directories.length >= 6);
  for (const c of vectors.directories) {
    const root = realpathSync(mkdtempSync(join(tmpdir(), 'weightd-written-dir-')));
    try {
      for (const d of c.dirs) mkdirSync(join(root, d), { recursive: true });
      const link = (name: string, target: string) => symlinkSync(target, join(root, name));
      for (const [name, target] of Object.entries(c.links)) link(name, target);
      const recorded = writtenDirectory(join(root, c.commit));
      assert.is(relative(root, recorded), c.expected.recorded, `${c.description}: recorded`);
      for (const [name, target] of Object.entries(c.repoint ?? {})) {
        rmSync(join(root, name));
        link(name, target);
      }
      const refusal = writtenIdentityRefusal({ model: recorded, written }, { name: 'tiny', modelDir: join(root, c.restart), plan: { fingerprintFields: fields, ranks }, resolve: writtenDirectory });
      assert.is(refusal === undefined, c.expected.same, `${c.description}: ${refusal ?? 'accepted'}`);
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  }
});

test('a record of an earlier build, which names the directory through a link, is judged by where that link leads', () => {
  const root = realpathSync(mkdtempSync(join(tmpdir(), 'weightd-written-dir-')));
  try {
    mkdirSync(join(root, 'v1'));
    symlinkSync('v1', join(root, 'cur'));
    const ranks = vectors.cases[0]!.ranks;
    const e = { name: 'tiny', modelDir: join(root, 'v1'), plan: { fingerprintFields: {}, ranks }, resolve: writtenDirectory };
    assert.is(writtenIdentityRefusal({ model: join(root, 'cur'), written: { fields: {}, manifest: manifestDigest(ranks) } }, e), undefined);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});

test.run();
