"""The vLLM plugin's processed layouts (docs/engines.md, "Publishing what the engine computed"):
the layers whose processing the plugin can publish (vllm_rules.PUBLISHABLE: by method and the
kernel vLLM selected), the key of that processing (docs/spec/processed-key.md), adopting a
published layout before vLLM's ``process_weights_after_loading`` (each such layer's processing is
then replaced, once, by restoring the state it leaves outside its parameters), and publishing
what the processing computed once it ran.

A published tensor is a layer's parameter after processing, named ``<layer>.<parameter>``; a
parameter that processing left as the transpose of contiguous storage (``weight.t()``, as FP8
kernels keep their weights) is published as that storage, named ``<layer>.<parameter>#t``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from .processed import KEY_PROTOCOL, Processed, params_digest, processed_key, publish, safetensors_dtype
from .vllm_rules import publishable

TRANSPOSED = "#t"


@dataclass
class Plan:
    """The layers whose processing is published or adopted, by name: (layer, its method, how to
    restore what the processing leaves outside its parameters); their parameters' names as
    loaded; and the key."""

    layers: Dict[str, Tuple[nn.Module, Any, Callable[[Any, Any], None]]]
    params: List[str]
    fields: Dict[str, str]

    @property
    def key(self) -> str:
        return processed_key(self.fields)

    @property
    def processing(self) -> str:
        return self.fields["processing"]


def arch() -> str:
    """The GPU architecture (``sm_90``) the kernels were built for, or ``cpu``."""
    from vllm.platforms import current_platform

    if not current_platform.is_cuda_alike():
        return "cpu"
    major, minor = torch.cuda.get_device_capability(torch.accelerator.current_device_index())
    return f"sm_{major}{minor}"


def plan_for(model: nn.Module, base: str, tp_rank: int, tp_size: int) -> Optional[Plan]:
    """The publishable layers of ``model`` as loaded (before processing), or None when it has
    none. ``base``: the rank fingerprint of the version mapped."""
    import vllm

    layers, kinds, params = {}, set(), []
    for name, module in model.named_modules():
        found = publishable(module)
        if found is None:
            continue
        kind, adopt = found
        layers[name] = (module, module.quant_method, adopt)
        kinds.add(kind)
        params += [(f"{name}.{n}", safetensors_dtype(p.dtype), list(p.shape)) for n, p in module.named_parameters(recurse=False)]
    if not layers:
        return None
    fields = {
        "protocol": KEY_PROTOCOL, "base": base, "engine": "vllm", "engineVersion": vllm.__version__, "processing": ", ".join(sorted(kinds)),
        "arch": arch(), "tp": f"{tp_rank}/{tp_size}", "params": params_digest(params),
    }
    return Plan(layers, [p[0] for p in params], fields)


def by_layer(found: Processed) -> Dict[str, Dict[str, torch.Tensor]]:
    """The published tensors by layer and parameter, as the layer is to hold them."""
    out: Dict[str, Dict[str, torch.Tensor]] = {}
    for name, view in found.tensors.items():
        transposed = name.endswith(TRANSPOSED)
        layer, _, attr = (name[: -len(TRANSPOSED)] if transposed else name).rpartition(".")
        out.setdefault(layer, {})[attr] = view.t() if transposed else view
    return out


def misfits(plan: Plan, found: Processed) -> List[str]:
    """Why the published layout does not fit ``plan`` (it must cover every planned layer and no
    other; the key makes that so unless the plugin's rules changed): empty when it fits."""
    layers, planned = set(by_layer(found)), set(plan.layers)
    problems = []
    if layers - planned:
        problems.append(f"layers published that this model does not process: {', '.join(sorted(layers - planned)[:3])}")
    if planned - layers:
        problems.append(f"layers this model processes that are not published: {', '.join(sorted(planned - layers)[:3])}")
    return problems


def adopt(plan: Plan, found: Processed) -> int:
    """Puts the published parameters in place of each planned layer's (``misfits`` must be empty)
    and replaces its processing, once, by restoring what that processing leaves outside the
    parameters. Returns how many tensors it put in place."""
    published = by_layer(found)
    for name, (module, method, restore) in plan.layers.items():
        for attr in [n for n, p in module._parameters.items() if p is not None and n not in published[name]]:
            delattr(module, attr)  # processing dropped it (published as it left the layer)
        for attr, view in published[name].items():
            module._parameters[attr] = nn.Parameter(view, requires_grad=False)

        def processed_already(layer: nn.Module, method: Any = method, restore: Callable = restore) -> None:
            del method.process_weights_after_loading  # once: a later reload (a switch) processes again
            restore(layer, method)

        method.process_weights_after_loading = processed_already
    return sum(len(v) for v in published.values())


def computed(plan: Plan) -> Dict[str, torch.Tensor]:
    """What processing left in each planned layer's parameters, by published name; raises
    ValueError for a parameter laid out in a way the names cannot say (neither contiguous nor a
    transposed contiguous matrix)."""
    out = {}
    for name, (module, _, _) in plan.layers.items():
        for attr, p in module.named_parameters(recurse=False):
            if p.is_contiguous():
                out[f"{name}.{attr}"] = p.data
            elif p.dim() == 2 and p.t().is_contiguous():
                out[f"{name}.{attr}{TRANSPOSED}"] = p.data.t()
            else:
                raise ValueError(f"{name}.{attr} is laid out with strides {p.stride()} after processing, neither contiguous nor a transposed matrix")
    return out


def publish_plan(plan: Plan, socket_path: str, model_name: str) -> str:
    """Publishes what the planned layers' processing computed; returns the log line's text."""
    tensors = computed(plan)
    done = publish(socket_path, model_name, plan.fields["base"], plan.fields, tensors)
    return f"published {len(tensors)} processed parameters of {len(plan.layers)} layers ({plan.processing}; {done['bytes']} bytes, key {plan.key}) to {socket_path}: the next start with this key maps them"

