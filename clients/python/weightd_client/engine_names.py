"""A trainer's tensor named as an engine names its parameters (vLLM's fused ``qkv_proj`` and
``gate_up_proj``, FusedMoE's ``experts.w13_weight`` and ``w2_weight``) as the checkpoint tensors
it is made of, read from what one rank of the daemon serves: its ``checkpoint`` layout and an
engine layout over the same bytes (docs/protocol.md, Layouts).

An engine layout's view of a fused parameter is its members' pieces back to back, in member
order (src/checkpoint/layouts/vllmParams.ts, docs/sharding.md "The vllm layout"), so the members
of a view are the checkpoint views inside its bytes, by offset, and a tensor shaped as the view
splits into them by the same cut of its elements. The daemon's planner stays the one definition
of which tensors make a parameter; nothing here repeats its rules. Bytes of a view that no
checkpoint tensor holds are the vocabulary's padding rows (zero in the daemon, never written).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .client import WeightdClient
from .protocol import ProtocolError, ServeError, WeightdError
from .tensors import torch_dtype

Shape = Tuple[int, ...]


class NoRule(WeightdError):
    """A trainer's tensor whose name, dtype or shape no layout the daemon serves knows: no byte of
    the update is written (``E_UNKNOWN_TENSOR`` for the name, ``E_TENSOR_MISMATCH`` for the rest)."""


@dataclass(frozen=True)
class Piece:
    """A checkpoint tensor inside an engine parameter: the parameter's elements ``[start, start +
    numel)``, flattened row-major, in ``shape``."""

    name: str
    start: int
    numel: int
    shape: Shape


@dataclass(frozen=True)
class EngineParam:
    """One view of an engine layout on one rank; ``pieces`` empty where its bytes cannot be cut
    into elements (a packed dtype): such a parameter is refused, never written."""

    name: str
    dtype: str
    shape: Shape
    pieces: Tuple[Piece, ...]


def _manifest(client: WeightdClient, fingerprint: str, layout: str) -> Any:
    """The tensors of ``layout`` of version ``fingerprint`` on this socket, by a copy lease
    dropped at once (only the manifest is read)."""
    reply = client.get_state(fingerprint, "copy", layout=layout)
    if reply.get("status") != "ok":
        raise ServeError("E_NOT_SERVING", f"version {fingerprint[:12]} stopped serving at {client.socket_path} while its {layout} layout was read (fields: {reply.get('fields')})")
    client.detach(reply["leaseId"])
    return reply["tensors"]


def engine_params(checkpoint: Any, engine: Any) -> Dict[str, EngineParam]:
    """Each view of ``engine`` (a layout's tensors) with the ``checkpoint`` views that lie inside
    its bytes, in offset order. A checkpoint view that crosses a view's edge, or leaves a gap
    before another, breaks the layouts' rule: the daemon's manifests disagree, and that is refused."""
    by_segment: Dict[int, List[Tuple[int, int, str, str, Shape]]] = {}
    for t in checkpoint:
        if t["bytes"] > 0:
            by_segment.setdefault(t["segment"], []).append((t["offset"], t["bytes"], t["name"], t["dtype"], tuple(t["shape"])))
    offsets: Dict[int, List[int]] = {}
    for segment, views in by_segment.items():
        views.sort()
        offsets[segment] = [v[0] for v in views]
    out: Dict[str, EngineParam] = {}
    for v in engine:
        shape, end = tuple(v["shape"]), v["offset"] + v["bytes"]
        numel = math.prod(shape)
        views, starts = by_segment.get(v["segment"], []), offsets.get(v["segment"], [])
        i, at, pieces = bisect_left(starts, v["offset"]), v["offset"], []
        while i < len(views) and views[i][0] < end:
            offset, size, name, dtype, member_shape = views[i]
            if offset != at or offset + size > end or dtype != v["dtype"]:
                raise ProtocolError(
                    "E_BAD_MANIFEST",
                    f"checkpoint tensor {name!r} ({dtype}, bytes {offset}..{offset + size} of segment {v['segment']}) is not the next piece of "
                    f"{v['name']!r} ({v['dtype']}, bytes {v['offset']}..{end}); the daemon's layouts disagree: is it of another weightd version than this client?",
                )
            pieces.append((name, offset - v["offset"], size, member_shape))
            at, i = at + size, i + 1
        itemsize = v["bytes"] // numel if numel and v["bytes"] % numel == 0 else 0
        whole = itemsize > 0 and all(start % itemsize == 0 and size % itemsize == 0 for _, start, size, _ in pieces)
        out[v["name"]] = EngineParam(
            v["name"], v["dtype"], shape, tuple(Piece(n, start // itemsize, size // itemsize, s) for n, start, size, s in pieces) if whole else ()
        )
    return out


def _same(name: str) -> str:
    return name


class EngineNames:
    """How one rank's model takes a trainer's tensor by name: a checkpoint tensor's name as itself;
    a name of the engine layout ``layout`` (after ``rename``: an engine's ``named_parameters()``
    name as the layout writes it, vllm_rules.layout_name) split into the checkpoint tensors its
    view holds. ``params`` is None where every name is the checkpoint's (the engine layout was not
    read), or where the daemon does not serve ``layout`` (``unserved`` says why)."""

    def __init__(self, model: str, checkpoint: Dict[str, Shape], params: Optional[Dict[str, EngineParam]], layout: str, unserved: str = "", rename: Callable[[str], str] = _same):
        self.model = model
        self.checkpoint = checkpoint
        self.params = params
        self.layout = layout
        self.unserved = unserved
        self.rename = rename

    @classmethod
    def of_rank(
        cls, client: WeightdClient, model: str, fingerprint: str, metadata: Sequence[Tuple[str, Any, Sequence[int]]], layout: str = "vllm", rename: Callable[[str], str] = _same
    ) -> "EngineNames":
        """What version ``fingerprint`` of ``model`` serves on ``client``'s socket, for the tensors
        ``metadata`` lists ((name, dtype, shape) each): the engine layout is read only when one of
        them is not a checkpoint tensor of that shape."""
        tensors = _manifest(client, fingerprint, "checkpoint")
        checkpoint = {t["name"]: tuple(t["shape"]) for t in tensors}
        if all(checkpoint.get(n) == tuple(s) for n, _, s in metadata):
            return cls(model, checkpoint, None, layout, rename=rename)
        try:
            engine = _manifest(client, fingerprint, layout)
        except ProtocolError as err:
            if err.code != "E_LAYOUT_NOT_SERVED":
                raise
            return cls(model, checkpoint, None, layout, str(err), rename)
        except ServeError as err:
            if err.code != "E_UNKNOWN_LAYOUT":
                raise
            return cls(model, checkpoint, None, layout, str(err), rename)
        return cls(model, checkpoint, engine_params(tensors, engine), layout, rename=rename)

    def param(self, name: str, dtype: Any, shape: Sequence[int]) -> Optional[EngineParam]:
        """None where ``name`` is written as itself (a checkpoint tensor's name: each rank checks
        its dtype and shape); else the engine parameter whose pieces a tensor of that dtype and
        shape is; NoRule where neither layout has it so."""
        shape = tuple(shape)
        if self.checkpoint.get(name) == shape:
            return None
        param = None if self.params is None else self.params.get(self.rename(name))
        if param is not None and param.shape == shape:
            if dtype != torch_dtype(param.dtype):
                raise NoRule("E_TENSOR_MISMATCH", f"tensor {name!r}: the trainer's is {dtype}, but {self.layout}'s parameter {param.name!r} of model {self.model!r} is {torch_dtype(param.dtype)}; convert it first (tensor.to({torch_dtype(param.dtype)}))", {"tensor": name})
            if not param.pieces:
                raise NoRule("E_TENSOR_MISMATCH", f"tensor {name!r}: {self.layout}'s parameter {param.name!r} of model {self.model!r} is {param.dtype}, whose bytes this client does not cut into elements; send its checkpoint tensors instead", {"tensor": name})
            return param
        if name in self.checkpoint:
            return None
        if param is not None:
            members = ", ".join(p.name for p in param.pieces) or "its checkpoint tensors"
            raise NoRule(
                "E_TENSOR_MISMATCH",
                f"tensor {name!r}: the trainer's is {dtype} {list(shape)}, but {self.layout}'s parameter {param.name!r} of model {self.model!r} is {torch_dtype(param.dtype)} {list(param.shape)} on this rank, "
                f"the pieces of {members} back to back; no other shape of it is cut into them (a tensor-parallel rank holds its own piece of it); "
                "send the parameter in that shape, or the checkpoint tensors by name",
                {"tensor": name},
            )
        if self.params is None:
            raise NoRule(
                "E_UNKNOWN_TENSOR",
                f"tensor {name!r} is no checkpoint tensor of model {self.model!r}, and the daemon serves no {self.layout} layout to find it in ({self.unserved}); "
                f"send checkpoint names, or serve the model with --layouts checkpoint,{self.layout} so that {self.layout}'s parameter names are taken",
                {"tensor": name},
            )
        raise NoRule(
            "E_UNKNOWN_TENSOR",
            f"tensor {name!r} is neither a checkpoint tensor of model {self.model!r} nor a parameter of its {self.layout} layout"
            + ("" if self.rename(name) == name else f" (as {self.rename(name)!r})")
            + "; check the name (weightd ctl list shows the model; a get_state with layout vllm lists its parameters)",
            {"tensor": name},
        )


def split(name: str, param: EngineParam, value: Any) -> List[Tuple[str, Any]]:
    """The trainer's tensor ``name``, ``value`` (a torch tensor of ``param``'s shape), as its
    checkpoint tensors, by name: views of its elements where it is contiguous."""
    if tuple(value.shape) != param.shape:
        raise NoRule("E_TENSOR_MISMATCH", f"tensor {name!r}: the trainer yielded {list(value.shape)}, but its metadata and the layout say {list(param.shape)}; they must agree", {"tensor": name})
    flat = value.reshape(-1)
    return [(p.name, flat[p.start : p.start + p.numel].reshape(p.shape)) for p in param.pieces]
