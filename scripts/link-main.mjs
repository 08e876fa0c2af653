// tsc writes src/main.ts to dist/src/main.js; the documented entry point is dist/main.js.
import { writeFileSync, chmodSync } from 'node:fs';
const target = new URL('../dist/main.js', import.meta.url);
writeFileSync(target, "#!/usr/bin/env node\nimport './src/main.js';\n");
chmodSync(target, 0o755);
