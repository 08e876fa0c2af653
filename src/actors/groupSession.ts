// The node's membership in its tensor-parallel group, alive from rendezvous until the node
// ends. A single node is its own group: its rank table is its own devices.
import { hostname } from 'node:os';
import { fromCallback } from 'xstate';
import { RendezvousError, serializeError } from '../errors.js';
import type { Logger } from '../log.js';
import type { NodeConfig } from '../nodeOptions.js';
import type { GroupCommand, GroupEvent } from '../rendezvous/groupEvents.js';
import { nodeRankTable } from '../rendezvous/rankTable.js';
import type { Prepared } from './prepareNode.js';

export interface GroupSessionInput {
  config: NodeConfig;
  prepared: Prepared;
  log: Logger;
}

export const groupSession = fromCallback<GroupCommand, GroupSessionInput, GroupEvent>(({ input, sendBack, receive }) => {
  const { config, prepared } = input;
  if (config.nnodes > 1) {
    sendBack({
      type: 'GROUP_FAILED',
      error: serializeError(new RendezvousError('E_RDZV_UNSUPPORTED', `--nnodes ${config.nnodes}: multi-node rendezvous is not built yet; run with --nnodes 1`)),
    });
    return;
  }
  sendBack({ type: 'GROUP_JOINED', rankTable: nodeRankTable(config.nodeRank, hostname(), prepared.devices.map((d) => d.uuid)) });
  receive((cmd) => {
    if (cmd.type === 'NODE_READY') sendBack({ type: 'GROUP_READY' });
  });
});
