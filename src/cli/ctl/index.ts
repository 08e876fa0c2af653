// The `weightd ctl` commands: one entry per command of the control socket's schema
// (src/control/controlProtocol.ts), each in its own file, in the order help lists them. The
// table's type makes a command without an entry a compile error; test/control/controlCommands.test.ts
// names the files a new command touches.
import type { ControlCommand } from '../../control/controlProtocol.js';
import type { CtlCommand } from './ctlCommand.js';
import { list } from './list.js';
import { load } from './load.js';
import { rollback } from './rollback.js';
import { unload } from './unload.js';

export const CTL_COMMANDS: { readonly [C in ControlCommand]: CtlCommand<C> } = { load, unload, list, rollback };
