"""load_into: fill a torch model from weightd zero-copy, or from its checkpoint on disk.

Named ``torch_load`` rather than ``torch``: a ``weightd_client/torch.py`` would be what
``import torch`` finds whenever that folder is on sys.path (a script run from it, some tools),
and the package's own modules import the real torch. torch is imported only when a load runs,
so ``import weightd_client`` stays cheap.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from .client import Attached, Mismatch, WeightdClient, find_socket
from .fingerprint import FingerprintError, expected_fingerprint
from .protocol import WeightdError

log = logging.getLogger("weightd_client")

__all__ = ["LoadResult", "load_into"]


@dataclass
class LoadResult:
    """Where the weights came from. Keep it as long as the model: it holds the lease.

    ``source`` is ``"weightd"`` (zero-copy views of the daemon's memory) or ``"disk"``;
    ``reason`` says why not weightd (None when weightd), ``fields`` the fingerprint fields
    that differed, if that was why.
    """

    source: str
    reason: Optional[str] = None
    fields: List[str] = field(default_factory=list)
    socket_path: Optional[str] = None
    attached: Optional[Attached] = field(default=None, repr=False)

    def close(self) -> None:
        """Ends the lease and unmaps, once the model's tensors are freed (drop the model first)."""
        if self.attached is not None:
            self.attached.detach()
            self.attached = None


class _Refusal(Exception):
    """Why the daemon's tensors cannot stand in for this model's: load from disk instead."""

    def __init__(self, reason: str, fields: Optional[List[str]] = None):
        super().__init__(reason)
        self.fields = fields or []


def load_into(
    model: Any,
    model_dir: str,
    *,
    tp_size: int = 1,
    tp_rank: int = 0,
    global_rank: Optional[int] = None,
    socket_path: Optional[str] = None,
    socket_dir: Optional[str] = None,
    device: Optional[int] = None,
    plan_file: Optional[str] = None,
    fallback: Optional[Callable[[Any], None]] = None,
) -> LoadResult:
    """Assigns every parameter and persistent buffer of ``model`` (an ``nn.Module``, on the meta
    device or not) from the weightd rank serving ``model_dir``, zero-copy, or loads from disk.

    The daemon's socket is ``socket_path``, else the one serving ``global_rank`` (default
    ``tp_rank``) in ``socket_dir`` (default the daemon's). ``device``: the CUDA ordinal (cuda
    backend, and where a disk load puts the tensors; default torch's current device, and for
    disk the model's own device, else the CPU). On any mismatch (fingerprint fields, names,
    shapes, dtypes, tied weights, no daemon) a warning names it and ``fallback(model)`` runs;
    without one, tp_size 1 loads ``model_dir`` itself (transformers models through their own
    ``from_pretrained``, converting dtypes as it does; others from the safetensors files).
    """
    import torch

    _check_meta_buffers(model)
    rank = tp_rank if global_rank is None else global_rank
    try:
        return _from_weightd(model, model_dir, tp_size, tp_rank, rank, socket_path, socket_dir, device, plan_file)
    except _Refusal as refusal:
        reason, fields = str(refusal), refusal.fields
    log.warning("weightd: loading %s from disk: %s", model_dir, reason)
    if fallback is not None:
        fallback(model)
    elif tp_size != 1:
        raise WeightdError(
            "E_NO_FALLBACK",
            f"weightd could not serve rank {tp_rank} of {tp_size} ({reason}), and load_into reads only whole (tp 1) checkpoints from disk; pass fallback= your engine's own sharded loader",
        )
    else:
        with torch.no_grad():
            _from_disk(model, model_dir, device)
    return LoadResult("disk", reason=reason, fields=fields)


def _from_weightd(model: Any, model_dir: str, tp_size: int, tp_rank: int, rank: int, socket_path: Optional[str], socket_dir: Optional[str], device: Optional[int], plan_file: Optional[str]) -> LoadResult:
    try:
        expected = expected_fingerprint(model_dir, tp_size, tp_rank, plan_file=plan_file)
    except (FingerprintError, ImportError) as err:
        raise _Refusal(f"cannot compute the expected fingerprint: {err}") from err
    try:
        path = socket_path or find_socket(global_rank=rank, socket_dir=socket_dir)
        client = WeightdClient(path)
    except WeightdError as err:
        raise _Refusal(f"no weightd to attach to ({err.code}: {err})") from err
    try:
        attached = client.attach(expected.fingerprint, expected.fields, device=device, tensor_format="torch")
    except WeightdError as err:
        client.close()
        raise _Refusal(f"weightd refused to attach ({err.code}: {err})") from err
    if isinstance(attached, Mismatch):
        client.close()
        raise _Refusal(f"the daemon at {path} serves other weights: fingerprint fields differ: {', '.join(attached.fields)}", attached.fields)
    # The map lease follows this process, not the connection; detach reconnects.
    client.close()
    try:
        import torch

        with torch.no_grad():
            sources = _daemon_sources(model, attached)
            _assign(model, sources, strict_dtype=True, where=f"weightd ({path})")
            _place_buffers(model, _served_device(attached))
    except BaseException as err:
        # The failed frames' locals hold views, which would keep the mapping and its lease
        # until the traceback is gone (see CudaMapping): nothing needs them now.
        traceback.clear_frames(err.__traceback__)
        attached.detach()
        raise
    return LoadResult("weightd", socket_path=path, attached=attached)


def _served_device(attached: Attached) -> Any:
    import torch

    for t in attached.tensors.values():
        return t.device
    return torch.device("cpu")


# --- names: what the model holds and what stands in for each of its tensors -------------------


def _model_tensors(model: Any) -> Tuple[Dict[str, Any], List[List[str]]]:
    """The model's persistent tensors by name, and its tie groups (names of one tensor object)."""
    state = model.state_dict(keep_vars=True)
    groups: Dict[int, List[str]] = {}
    for name, t in state.items():
        groups.setdefault(id(t), []).append(name)
    return state, list(groups.values())


def _daemon_sources(model: Any, attached: Attached) -> Dict[str, Any]:
    """Each of the model's tensor names -> a zero-copy view of the daemon's memory."""
    views = dict(attached.tensors)
    aliases = attached.state.get("aliases", {})
    state, groups = _model_tensors(model)
    # The manifest ties names the model keeps apart: one view cannot be two parameters.
    tied_in_model = {n for g in groups if len(g) > 1 for n in g}
    untied = sorted(a for a in aliases if a in state and a not in tied_in_model)
    if untied:
        raise _Refusal(f"tied weights differ: the daemon ties {', '.join(untied)} to {', '.join(aliases[a] for a in untied)}, the model does not", ["tied"])
    return _converted(model, views, state)


def _converted(model: Any, views: Dict[str, Any], state: Dict[str, Any]) -> Dict[str, Any]:
    """Checkpoint names -> the model's, through transformers' own key conversions (v5 renames
    keys and fuses MoE experts into one tensor). A fused tensor is served zero-copy only where
    its pieces lie back to back in the daemon's memory, in the order the fusion needs (the
    daemon places them so when it plans the ``vllm`` layout)."""
    renamings, converters = _conversions(model)
    if not renamings and not converters:
        return views
    out: Dict[str, Any] = {}
    fused: Dict[str, Dict[Tuple[int, int], Tuple[str, Any]]] = {}
    fusion_of: Dict[str, Any] = {}
    for name, view in views.items():
        renamed = name
        for renaming in renamings:  # in turn, as transformers' loader applies them
            renamed, _ = renaming.rename_source_key(renamed)
        hit = _match_converter(renamed, converters)
        if hit is None:
            out[renamed] = view
            continue
        conv, source_index, expert, target = hit
        fused.setdefault(target, {})[(expert, source_index)] = (name, view)
        fusion_of[target] = conv
    for target, parts in fused.items():
        out[target] = _fused_view(target, fusion_of[target], parts, state.get(target))
    return out


def _conversions(model: Any) -> Tuple[List[Any], List[Any]]:
    try:
        from transformers import PreTrainedModel
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming
    except ImportError:
        return [], []
    if not isinstance(model, PreTrainedModel):
        return [], []
    transforms = get_model_conversion_mapping(model, add_legacy=False)
    return [t for t in transforms if isinstance(t, WeightRenaming)], [t for t in transforms if isinstance(t, WeightConverter)]


def _match_converter(key: str, converters: List[Any]) -> Optional[Tuple[Any, int, int, str]]:
    """(converter, which source pattern, expert index, target name) of a key a converter fuses."""
    for conv in converters:
        for i, pattern in enumerate(conv.source_patterns):
            body = re.escape(pattern).replace(r"\*", r"(\d+)")
            m = re.search(body + "$", key)
            if m is None:
                continue
            target_pattern = conv.target_patterns[0] if isinstance(conv.target_patterns, list) else conv.target_patterns
            prefix = key[: m.start()]
            return conv, i, int(m.group(1)) if m.groups() else 0, prefix + target_pattern
    return None


def _fused_view(target: str, conv: Any, parts: Dict[Tuple[int, int], Tuple[str, Any]], model_tensor: Any) -> Any:
    from transformers.core_model_loading import Concatenate, MergeModulelist

    ops = [(type(op), getattr(op, "dim", None)) for op in conv.operations]
    if ops not in ([(MergeModulelist, 0)], [(MergeModulelist, 0), (Concatenate, 1)]):
        raise _Refusal(f"{target}: transformers builds it with {[type(op).__name__ for op in conv.operations]}, which load_into cannot serve zero-copy", ["layout"])
    experts = sorted({e for e, _ in parts})
    sources = len(conv.source_patterns)
    if experts != list(range(len(experts))) or len(parts) != len(experts) * sources:
        raise _Refusal(f"{target}: the daemon serves pieces {sorted(n for n, _ in parts.values())}, not all {sources} for each of experts 0..{len(experts) - 1}", ["names"])
    # Stacked over experts, each expert's sources concatenated: memory order expert-major.
    order = [parts[(e, s)] for e in experts for s in range(sources)]
    first = order[0][1]
    rows = sum(parts[(0, s)][1].shape[0] for s in range(sources))
    shape = [len(experts), rows, *first.shape[1:]]
    end = first.data_ptr()
    for name, view in order:
        if view.dtype != first.dtype or view.shape[1:] != first.shape[1:] or view.data_ptr() != end:
            raise _Refusal(
                f"{target}: the daemon's pieces of it are not back to back in memory ({name}), so it cannot be one zero-copy tensor; run weightd with --layouts vllm (it places them so)",
                ["layout"],
            )
        end += view.numel() * view.element_size()
    return _span(first, end - first.data_ptr(), shape, [v for _, v in order])


def _span(first: Any, nbytes: int, shape: List[int], pieces: List[Any]) -> Any:
    """A tensor over ``nbytes`` of memory from ``first``'s start: the pieces' own bytes, not a copy.

    Its buffer holds the pieces, so while it lives they do, and with them the mapping they
    keep open (a host one stays mapped, a cuda one's handles stay open: see CudaMapping)."""
    import torch

    if first.device.type == "cuda":
        from .cuda import CudaBuffer

        buf: Any = CudaBuffer(first.data_ptr(), nbytes, "U8", [nbytes], raw=True)
        buf.pieces = pieces
        raw = torch.as_tensor(buf, device=first.device)
    else:
        buf = (ctypes.c_char * nbytes).from_address(first.data_ptr())
        buf.pieces = pieces
        raw = torch.frombuffer(buf, dtype=torch.uint8)
    return raw.view(first.dtype).reshape(shape)


# --- assignment ---------------------------------------------------------------------------------


def _assign(model: Any, sources: Dict[str, Any], strict_dtype: bool, where: str) -> None:
    """Sets every persistent tensor of the model to its source; a tie group gets one object."""
    import torch

    state, groups = _model_tensors(model)
    missing, problems, plan = [], [], []
    for group in groups:
        have = [n for n in group if n in sources]
        if not have:
            missing.extend(group)
            continue
        src, want = sources[have[0]], state[group[0]]
        if list(src.shape) != list(want.shape):
            problems.append(f"{have[0]} shape {list(src.shape)} != model's {list(want.shape)}")
        elif src.dtype != want.dtype:
            if strict_dtype:
                problems.append(f"{have[0]} dtype {src.dtype} != model's {want.dtype}")
            else:
                src = src.to(want.dtype)
        plan.append((group, src))
    unexpected = sorted(set(sources) - set(state))
    fields = (["names"] if missing or unexpected else []) + (["shapes"] if any(" shape " in p for p in problems) else []) + (["dtypes"] if any(" dtype " in p for p in problems) else [])
    if fields:
        parts = []
        if missing:
            parts.append(f"missing: {', '.join(sorted(missing)[:8])}{' ...' if len(missing) > 8 else ''}")
        if unexpected:
            parts.append(f"unexpected: {', '.join(unexpected[:8])}{' ...' if len(unexpected) > 8 else ''}")
        parts.extend(problems[:8])
        message = f"{where} does not fit the model: {'; '.join(parts)}"
        if strict_dtype:
            raise _Refusal(message, fields)
        raise WeightdError("E_MODEL_MISMATCH", message + "; build the model from the checkpoint's config.json")
    for group, src in plan:
        first_name = group[0]
        was = state[first_name]
        value = torch.nn.Parameter(src, requires_grad=False) if isinstance(was, torch.nn.Parameter) else src
        for name in group:
            module_name, _, leaf = name.rpartition(".")
            module = model.get_submodule(module_name)
            if leaf in module._parameters:
                module._parameters[leaf] = value
            else:
                module._buffers[leaf] = value


def _non_persistent_buffers(model: Any) -> List[Tuple[str, Any]]:
    persistent = set(model.state_dict(keep_vars=True))
    return [(n, b) for n, b in model.named_buffers() if n not in persistent and b is not None]


def _check_meta_buffers(model: Any) -> None:
    # Before any tensor is assigned: a half-assigned model must never be left behind.
    meta = [n for n, b in _non_persistent_buffers(model) if b.device.type == "meta"]
    if meta and getattr(model, "_init_weights", None) is None:
        raise WeightdError("E_META_BUFFER", f"buffer {meta[0]} is on the meta device and is in no checkpoint; build the model on a real device, or compute it before load_into")


def _place_buffers(model: Any, device: Any) -> None:
    """Non-persistent buffers (rotary frequencies) are no checkpoint's: a meta one is computed
    again (transformers' ``_init_weights``), one elsewhere moves to the weights' device."""
    import torch

    recompute = []
    for name, buf in _non_persistent_buffers(model):
        module_name, _, leaf = name.rpartition(".")
        module = model.get_submodule(module_name)
        if buf.device.type == "meta":
            module._buffers[leaf] = torch.empty_like(buf, device=device)
            recompute.append(module)
        elif buf.device != device:
            module._buffers[leaf] = buf.to(device)
    for module in recompute:
        model._init_weights(module)  # present: _check_meta_buffers made sure


def _from_disk(model: Any, model_dir: str, device: Optional[int]) -> None:
    import torch

    state, _ = _model_tensors(model)
    real = [t.device for t in state.values() if t.device.type != "meta"]
    target = torch.device("cuda", device) if device is not None else real[0] if real else torch.device("cpu")
    try:
        from transformers import PreTrainedModel
    except ImportError:
        PreTrainedModel = None
    if PreTrainedModel is not None and isinstance(model, PreTrainedModel):
        # transformers' own loader knows its key conversions (renames, fused experts).
        dtypes = {t.dtype for t in state.values() if t.is_floating_point()}
        loaded = type(model).from_pretrained(model_dir, config=model.config, dtype=dtypes.pop() if len(dtypes) == 1 else None)
        sources = {k: v.to(target) for k, v in loaded.state_dict().items()}
    else:
        sources = {k: v for f in _weight_files(model_dir) for k, v in _load_safetensors(f, target).items()}
    _assign(model, sources, strict_dtype=False, where=f"checkpoint {model_dir}")
    _place_buffers(model, target)


def _weight_files(model_dir: str) -> List[str]:
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            return [os.path.join(model_dir, n) for n in sorted(set(json.load(f)["weight_map"].values()))]
    return [os.path.join(model_dir, "model.safetensors")]


def _load_safetensors(path: str, device: Any) -> Dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(path, device=str(device))
