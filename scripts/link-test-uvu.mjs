// dist/test/node_modules/uvu: what a compiled test file gets for `import ... from 'uvu'`, so that
// every way of running one (test/run.mjs, or `node dist/test/x.test.js` by hand, as the GPU run
// scripts do) loads test/uvuFailureReport.mjs first. That hook patches uvu's code as it is loaded,
// so it must be registered before; a test file's own imports are too late for it (all of a file's
// ES modules are loaded before any of them runs). This package registers it, then imports the
// real uvu (node_modules/uvu), which the hook patches; uvu/assert is the real one as it is.
import { mkdirSync, writeFileSync } from 'node:fs';

const dir = new URL('../dist/test/node_modules/uvu/', import.meta.url);
// From dir to the repository's root.
const root = '../../../../';
mkdirSync(dir, { recursive: true });
writeFileSync(new URL('package.json', dir), `${JSON.stringify({ name: 'uvu', private: true, type: 'module', exports: { '.': './index.mjs', './assert': './assert.mjs' } }, null, 2)}\n`);
writeFileSync(
  new URL('index.mjs', dir),
  `// Written by scripts/link-test-uvu.mjs.\nimport '${root}test/uvuFailureReport.mjs';\n\nexport const { suite, test, exec } = await import('${root}node_modules/uvu/dist/index.mjs');\n`,
);
writeFileSync(new URL('assert.mjs', dir), `// Written by scripts/link-test-uvu.mjs.\nexport * from '${root}node_modules/uvu/assert/index.mjs';\n`);
