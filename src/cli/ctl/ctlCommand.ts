// What one `weightd ctl` command is on the command line: its help, its flags, the control request
// it sends (src/control/controlProtocol.ts) and how its reply is printed for a person.
import type { Command } from 'commander';
import type { ControlCommand, ControlReply, ControlRequestOf } from '../../control/controlProtocol.js';

export interface CtlCommand<C extends ControlCommand> {
  description: string;
  examples: string[];
  /** Adds the command's own flags and operands. */
  flags(c: Command): Command;
  /** The request from the parsed flags (shared ones merged in) and its operands, if it takes any. */
  request(o: Record<string, unknown>, ...operands: string[]): ControlRequestOf<C>;
  /** The daemon's successful reply, as text. */
  print(reply: Extract<ControlReply, { ok: true }>): string;
}
