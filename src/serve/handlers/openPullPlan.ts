// open_pull_plan: a writer names, once, where its tensors of a model lie in its own GPU memory
// (docs/weight-updates.md, "Pull plans"); the plan desk (pullPlanDesk.ts) keeps what every pull by
// the plan reuses, while this connection lives.
import { ServeError } from '../../errors.js';
import type { DeviceServices } from '../deviceServices.js';
import type { Caller } from '../leaseTable.js';
import type { OpenPullPlanReply, RequestOf } from '../../wire/protocol.js';
import { modelRefs } from './modelVersions.js';

export async function openPullPlan(req: RequestOf<'open_pull_plan'>, services: DeviceServices, caller: Caller): Promise<string> {
  const host = services.updates;
  if (!host) throw new ServeError('E_UPDATE_UNSUPPORTED', `this socket takes no updates, so no pull plan of model "${req.model}"; updates need a weightd node`, { model: req.model });
  const service = services.newestServing(req.model);
  if (!service) {
    throw new ServeError('E_UNKNOWN_MODEL', `no version of model "${req.model}" serves on this device, so it has no layout to plan a pull into; load it first (weightd ctl load)`, {
      model: req.model,
      models: modelRefs(services),
    });
  }
  const opened = await host.plans.open(service, caller, req.device, req.sources, req.tensors, () => services.isConnected(caller.connectionId), { more: req.more, plan: req.plan });
  if ('pending' in opened) {
    const { id, model, tensors, sources } = opened.pending;
    const reply: OpenPullPlanReply = { id: req.id, ok: true, plan: id, model, tensors, sources, pending: true };
    return JSON.stringify(reply);
  }
  const { plan, sources, timings, gpuDigestUnavailable } = opened;
  const reply: OpenPullPlanReply = { id: req.id, ok: true, plan: plan.id, model: plan.model, tensors: plan.tensors.size, sources, gpuDigestUnavailable, timings };
  return JSON.stringify(reply);
}
