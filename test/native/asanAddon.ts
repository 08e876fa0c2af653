// Imported first by the AddressSanitizer scenario (asanScenario.ts) and its worker thread: every
// load of build/Release/weightd.node (src/native/addon.ts) gets the ASan build in build-asan/
// instead (CMakeLists.txt, WEIGHTD_ASAN), so the scenario drives the real bindings through the
// real TypeScript above them.
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../../../', import.meta.url));
export const asanAddonPath = join(root, 'build-asan', 'Release', 'weightd.node');
const addonPath = join(root, 'build', 'Release', 'weightd.node');

const dlopen = process.dlopen.bind(process);
process.dlopen = (module: object, filename: string, ...flags: number[]) => dlopen(module, filename === addonPath ? asanAddonPath : filename, ...flags);
