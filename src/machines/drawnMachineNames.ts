// The names of the machines weightd draws (drawnMachines.ts), apart from the machines themselves:
// the command line lists them as --machine's choices without loading xstate or any machine.
export const DRAWN_MACHINE_NAMES = ['supervisor', 'coordinator', 'groupMember', 'rankService', 'rankWorker', 'modelRegistry', 'model', 'modelGroup'] as const;
export type DrawnMachine = (typeof DRAWN_MACHINE_NAMES)[number];
