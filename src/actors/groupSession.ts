// The node's membership in its tensor-parallel group, alive from rendezvous until the node
// ends. Node 0 also hosts the coordinator, and joins it over TCP like every other node, so one
// code path serves all nodes. A single node is its own group: the same join checks run
// locally, with no network.
import { hostname } from 'node:os';
import { fromCallback } from 'xstate';
import { RendezvousError, serializeError, type WeightdError } from '../errors.js';
import { checkJoin, type GroupExpectation } from '../rendezvous/checkJoin.js';
import { GroupMember, type JoinRequest } from '../rendezvous/groupMember.js';
import { Coordinator } from '../rendezvous/coordinatorServer.js';
import type { GroupCommand, GroupEvent } from '../rendezvous/groupEvents.js';
import { groupRankTable } from '../wire/rankTable.js';
import { groupTiming, type GroupTiming } from '../rendezvous/timing.js';
import { RDZV_PROTOCOL_VERSION } from '../rendezvous/groupMessages.js';
import type { GroupSessionInput } from '../machines/supervisorActors.js';

export const groupSession = fromCallback<GroupCommand, GroupSessionInput, GroupEvent>(({ input, sendBack, receive }) => {
  const { config, prepared, log } = input;
  // The group forms around the node's first model.
  const { plan } = prepared.models[0]!;
  const join: JoinRequest = {
    nnodes: config.nnodes,
    tpSize: config.tpSize,
    localWorldSize: config.localWorldSize,
    nodeRank: config.nodeRank,
    hostName: hostname(),
    deviceUuids: prepared.devices.map((d) => d.uuid),
    visibleDevices: prepared.visibleDevices,
    fingerprint: plan.fingerprint,
    fingerprintFields: plan.fingerprintFields,
  };
  const expect: GroupExpectation = {
    nnodes: config.nnodes,
    tpSize: config.tpSize,
    localWorldSize: config.localWorldSize,
    fingerprint: plan.fingerprint,
    fingerprintFields: plan.fingerprintFields,
    tensorNames: plan.ranks[0]?.contentTensors.names,
    token: config.token,
  };
  const fail = (err: WeightdError) => sendBack({ type: 'GROUP_FAILED', error: serializeError(err) });

  if (config.nnodes === 1) {
    const rejection = checkJoin({ type: 'join', protocolVersion: RDZV_PROTOCOL_VERSION, ...join, tokenProof: null }, '', { ...expect, token: undefined }, '', []);
    if (rejection) {
      fail(new RendezvousError(rejection.code, rejection.message, rejection.details));
      return;
    }
    const rankTable = groupRankTable([join]);
    log.info({ rankTable }, 'single node: rank table');
    sendBack({ type: 'GROUP_JOINED', rankTable });
    receive((cmd) => {
      if (cmd.type === 'NODE_READY') sendBack({ type: 'GROUP_READY' });
    });
    return;
  }

  let timing: GroupTiming;
  try {
    timing = groupTiming(input.timing);
  } catch (err) {
    fail(err as WeightdError);
    return;
  }
  let stopped = false;
  let coordinator: Coordinator | undefined;
  let member: GroupMember | undefined;

  const emit = (event: GroupEvent): void => {
    if (stopped) return;
    if (event.type === 'GROUP_FAILED' && coordinator) {
      // Node 0 ends when its group fails, taking the coordinator with it: first let every
      // node hear the verdict (bounded by the rendezvous deadline).
      void coordinator.verdictDelivered().then(() => !stopped && sendBack(event));
      return;
    }
    sendBack(event);
  };

  const startMember = (): void => {
    member = new GroupMember({
      host: config.masterAddr,
      port: config.weightCachePort,
      token: config.token,
      join,
      rendezvousTimeoutMs: config.rendezvousTimeoutMs,
      timing,
      log,
      emit,
    });
    member.start();
  };

  if (config.nodeRank === 0) {
    Coordinator.listen({ host: config.masterAddr, port: config.weightCachePort, expect, rendezvousTimeoutMs: config.rendezvousTimeoutMs, timing, log }).then(
      (c) => {
        if (stopped) return c.close();
        coordinator = c;
        c.onStateChange((state) => !stopped && sendBack({ type: 'COORDINATOR_STATE', state }));
        startMember();
      },
      (err: WeightdError) => !stopped && fail(err),
    );
  } else {
    startMember();
  }

  receive((cmd) => {
    switch (cmd.type) {
      case 'NODE_READY':
        return member?.nodeReady(cmd.content);
      case 'NODE_FAILED':
        // Node 0 tells its coordinator directly: the process ends before a frame to itself would
        // make the round trip, and the other nodes must hear why now, not at their timeout.
        coordinator?.reportFailure(config.nodeRank, cmd.error.code, cmd.error.message);
        return member?.nodeFailed(cmd.error);
      case 'MODEL_GROUP_JOIN': {
        const { type: _, ...join } = cmd;
        if (member) return member.modelJoin(join);
        return sendBack({ type: 'MODEL_GROUP_ABORT', name: cmd.name, fingerprint: cmd.fingerprint, error: serializeError(new RendezvousError('E_MODEL_GROUP_COORDINATOR_LOST', `model "${cmd.name}": this node has no connection to node 0 yet`)) });
      }
      case 'MODEL_GROUP_RESIDENT':
        return member?.modelResident(cmd.name, cmd.fingerprint);
      case 'MODEL_GROUP_FAILED':
        return member?.modelFailed(cmd.name, cmd.fingerprint, cmd.error);
      case 'MODEL_GROUP_STALE':
        return member?.modelStale(cmd.name, cmd.fingerprint);
    }
  });

  return () => {
    stopped = true;
    member?.close();
    coordinator?.close();
  };
});
