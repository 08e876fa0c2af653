// This weightd's version, from package.json (read once): what --version prints and what a kept
// record names as its writer.
import { readFileSync } from 'node:fs';

const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string };

export const VERSION = pkg.version;
