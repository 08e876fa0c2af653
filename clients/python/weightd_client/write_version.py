"""A trainer's named tensors become a new version of a model the daemon serves: the trainer side
of the vLLM weight-transfer backend ``weightd`` (vllm_transfer.py's ``trainer_send_weights``,
vLLM 0.26; vllm_trainer.py's ``TrainerWeightTransferEngine``, 0.32), usable without vLLM.

Every local rank of the model gets one update over its version ``base`` (docs/weight-updates.md),
naming only the tensors given: only their segments are copied, the rest is shared with the base.
Names are the checkpoint's (the daemon's ``checkpoint`` layout, as a Hugging Face model's
``named_parameters()`` gives them) or an engine's (the ``vllm`` layout's, as vLLM's
``named_parameters()`` gives them, through ``rename``): a tensor of a fused parameter
(``qkv_proj``, ``gate_up_proj``, FusedMoE's ``w13_weight``) in the shape the layout serves is
split into the checkpoint tensors that parameter's view holds (engine_names.py), on a model of one
local rank (at tensor-parallel size 2 and more a fused parameter is refused). A checkpoint tensor
may come whole at any tensor-parallel size: each rank gets its own piece of it, gathered from the
regions of the whole tensor's bytes that the rank's begin_update names (``piece``: the daemon's
one sharding rule, docs/sharding.md); on a model of one local rank it may also come as that
rank's piece. Every name, dtype and shape is checked against each rank before a byte is written;
a refusal or a failure before the last commit abandons every rank's update, so nothing of it is
ever served. The result names the version the engines then follow
(``update_weights`` with ``{"model": NAME, "version": N}``, vllm_follow.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .client import NODE_MANIFEST, WeightdClient, default_socket_dir, live_node_manifest
from .columns import same_uuid
from .engine_names import EngineNames, EngineParam, split
from .protocol import WeightdError
from .tensors import torch_dtype
from .update import Update, commit_all


class WriteRefused(WeightdError):
    """The trainer's tensors cannot become a version of the model; the message says what to do."""


class NotServing(WeightdError):
    """No single version of the name (of that number) serves on the socket; the message lists what does."""


@dataclass
class WriteTarget:
    """Where a trainer writes: ``model``, the name the daemon serves it under; the daemon's
    ``socket_dir`` (the sockets its node.json lists for ``model``: its local ranks; default: env
    ``WEIGHTD_SOCKET_DIR``, else the daemon's default dir) or its ``sockets``, one per local rank;
    ``base``, the number of the version written over (default: the one serving now)."""

    model: str
    socket_dir: Optional[str] = None
    sockets: Optional[List[str]] = None
    base: Optional[int] = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"weightd trainer_args need 'model', the name the daemon serves the model under; got {self.model!r}")
        if self.socket_dir is not None and self.sockets is not None:
            raise ValueError(f"weightd trainer_args take 'socket_dir' ({self.socket_dir!r}) or 'sockets' ({self.sockets!r}), not both")
        if self.sockets is not None and not self.sockets:
            raise ValueError("weightd trainer_args' 'sockets' is empty: name one socket per local rank of the model, or give 'socket_dir'")

    @classmethod
    def of(cls, args: Any) -> "WriteTarget":
        """From a dict (as vLLM's ``trainer_args`` come) or a WriteTarget."""
        if isinstance(args, cls):
            return args
        if not isinstance(args, dict):
            raise ValueError(f"weightd trainer_args must be a dict or a WriteTarget, got {type(args).__name__}")
        try:
            return cls(**args)
        except TypeError as err:
            raise ValueError(f"weightd trainer_args {sorted(args)}: {err}; the keys are model, socket_dir, sockets, base") from err


def serving_fingerprint(client: WeightdClient, name: str, version: Optional[int] = None) -> str:
    """This socket's rank fingerprint of the version of ``name`` that serves now (its
    ``current`` one: retained versions serve too, docs/weight-updates.md), or of the one
    numbered ``version``. A daemon before ``current`` must serve one version of the name."""
    versions = client.ping().get("models")
    if versions is None:
        raise NotServing("E_NO_MODELS", f"the daemon at {client.socket_path} does not name its models (a weightd before several models)")
    serving = [v for v in versions if v.get("name") == name and v["status"] == "serving" and (version is None or v.get("version") == version)]
    if version is None and any("current" in v for v in serving):
        serving = [v for v in serving if v["current"]]
    if len(serving) != 1:
        listed = ", ".join(f"{v.get('name')} v{v.get('version', 0)} {v['fingerprint'][:12]} ({v['status']})" for v in versions)
        which = f"model {name!r}" + ("" if version is None else f" numbered {version}")
        what = "no version" if not serving else f"{len(serving)} versions"
        raise NotServing("E_NOT_SERVING", f"{what} of {which} serving at {client.socket_path} (it serves: {listed})")
    return serving[0]["fingerprint"]


def rank_sockets(target: WriteTarget) -> List[str]:
    """The sockets of the model's local ranks, by global rank: those given, or those the node's
    manifest (node.json) lists for the name. Only those: the dir holds other sockets (the
    keeper's, the control socket) that a writer must not speak to."""
    if target.sockets is not None:
        return list(target.sockets)
    d = target.socket_dir or os.environ.get("WEIGHTD_SOCKET_DIR") or default_socket_dir()
    manifest = live_node_manifest(d)
    if manifest is None:
        raise WriteRefused(
            "E_NO_SOCKET",
            f"no running weightd lists its sockets in {d} (its {NODE_MANIFEST} is missing, unreadable, or names a process that is gone): "
            "start the daemon and wait until it is ready, or pass its --weight-cache-socket-dir as 'socket_dir'",
        )
    models = manifest.get("models") or []
    # Every version of the name serves on the same sockets, one per device.
    ranks = {r["globalRank"]: r["socketPath"] for m in models if m.get("name") == target.model for r in m["ranks"]}
    if not ranks:
        served = sorted({str(m.get("name")) for m in models})
        raise WriteRefused("E_NO_SOCKET", f"the weightd in {d} serves no model {target.model!r} (it serves: {', '.join(served) or 'nothing'}); check the name (weightd ctl list)")
    return [ranks[r] for r in sorted(ranks)]


def _ordinal(device: Dict[str, Any]) -> Optional[int]:
    """A cuda rank's GPU as this process numbers it (by UUID), so that each local rank's update
    maps on its own GPU; None on host (or no such GPU here: Update then refuses, naming both)."""
    if device.get("backend") != "cuda":
        return None
    import torch

    return next((i for i in range(torch.cuda.device_count()) if same_uuid(str(torch.cuda.get_device_properties(i).uuid), device["uuid"])), None)


def _check(name: str, dtype: Any, shape: Sequence[int], upd: Update, socket: str, ranks: int) -> None:
    """Refuses a tensor whose dtype is not what this rank holds under ``name``, or whose shape is
    not what this rank is given from: where the rank holds a piece of it, the whole tensor (each
    of the model's ``ranks`` local ranks cut from it), or the piece itself on a model of one local
    rank (every rank is given the same tensor, and the ranks' pieces differ)."""
    t = upd.tensors[name]
    held_dtype, held_shape = torch_dtype(t["dtype"]), list(t["shape"])
    whole = t.get("piece", {}).get("fullShape")
    takes = [whole] if whole is not None and ranks > 1 else [held_shape, whole]
    if dtype == held_dtype and list(shape) in takes:
        return
    if dtype != held_dtype:
        hint = f"convert it first (tensor.to({held_dtype}))"
    elif whole is not None:
        hint = (
            f"give the whole tensor ({whole}), which each of the {ranks} ranks' pieces is cut from (a piece would be written to every rank, and theirs differ), "
            "or write each rank's piece through client.begin_update on that rank's socket"
            if ranks > 1
            else f"give the whole tensor ({whole}), which this rank's piece is cut from, or this rank's piece"
        )
    else:
        hint = "the checkpoint's shape is what the daemon holds"
    raise WriteRefused(
        "E_TENSOR_MISMATCH",
        f"tensor {name!r}: the trainer's is {dtype} {list(shape)}, but the rank at {socket} holds {held_dtype} {held_shape} of model {upd.model!r}; {hint}",
        {"tensor": name},
    )


def _rank_piece(name: str, value: Any, upd: Update) -> Any:
    """``value`` as this rank holds it: the tensor itself, or, given whole where the rank holds a
    tensor-parallel piece, that piece, gathered from the regions of the whole tensor's bytes (C
    order) the daemon named, on the tensor's own device."""
    t = upd.tensors[name]
    piece = t.get("piece")
    if piece is None or list(value.shape) != list(piece["fullShape"]):
        return value
    import torch

    whole = value.detach().contiguous().reshape(-1).view(torch.uint8)
    at = whole.storage_offset()
    parts = [whole.as_strided((r["rows"], r["rowBytes"]), (r["srcPitch"], 1), at + r["srcOffset"]).reshape(-1) for r in piece["regions"]]
    out = torch.cat(parts) if parts else whole[:0]
    return out.view(value.dtype).reshape(t["shape"])


def write_version(
    tensors: Iterable[Tuple[str, Any]],
    target: WriteTarget,
    metadata: Optional[Sequence[Tuple[str, Any, Sequence[int]]]] = None,
    rename: Callable[[str], str] = lambda name: name,
) -> Dict[str, Any]:
    """Writes ``tensors`` ((name, torch tensor) pairs, any device) as a new version of
    ``target.model`` on each of its local ranks, and commits it once all are written. Returns
    the update_info the engines follow it with: ``{"model", "version"}``.

    ``metadata``: (name, torch dtype, shape) of every pair to come, in any order (vLLM 0.32's
    ``WeightSource.metadata()``): the pairs are then read once, while writing. Without it they
    are read whole first, since their names decide which segments the daemon copies.
    ``rename``: the vllm layout's name of an engine's parameter name (vllm_rules.layout_name
    under the trainer's vLLM), for names that are not the checkpoint's."""
    if metadata is None:
        tensors = list(tensors)
        metadata = [(n, t.dtype, tuple(t.shape)) for n, t in tensors]
    names = [n for n, _, _ in metadata]
    if not names:
        raise WriteRefused("E_NO_TENSORS", f"no tensors to write to model {target.model!r}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise WriteRefused("E_TENSOR_TWICE", f"tensors named more than once: {', '.join(twice)}; give each once")
    sockets = rank_sockets(target)
    updates: List[Update] = []
    try:
        bases: List[Tuple[str, Optional[int]]] = []
        for socket in sockets:
            client = WeightdClient(socket)
            try:
                base = serving_fingerprint(client, target.model, target.base)
                bases.append((base, _ordinal(client.ping()["device"])))
                if len(bases) == 1:
                    engine_names = EngineNames.of_rank(client, target.model, base, metadata, rename=rename)
            finally:
                client.close()
        params = {n: engine_names.param(n, d, s) for n, d, s in metadata}
        fused = [n for n, p in params.items() if p is not None]
        if fused and len(sockets) > 1:
            raise WriteRefused(
                "E_TENSOR_MISMATCH",
                f"tensor {fused[0]!r} is a parameter of the engine's layout, which model {target.model!r} holds as {len(sockets)} tensor-parallel pieces, one per rank; "
                "a fused engine parameter is not cut into the ranks' pieces: send the checkpoint's tensors whole by their own names, or write each rank's piece through client.begin_update on that rank's socket",
                {"tensor": fused[0]},
            )
        written_as = {n: _pieces(n, d, s, params[n]) for n, d, s in metadata}
        checkpoint_names = [piece for n in names for piece, _, _ in written_as[n]]
        twice = sorted({n for n in checkpoint_names if checkpoint_names.count(n) > 1})
        if twice:
            raise WriteRefused("E_TENSOR_TWICE", f"checkpoint tensors written more than once (by name and inside a fused parameter, say): {', '.join(twice)}; give each once")
        # A name the rank does not hold: the daemon refuses it (E_UNKNOWN_TENSOR, naming it).
        for socket, (base, device) in zip(sockets, bases):
            updates.append(Update(socket, target.model, base, tensors=checkpoint_names, device=device))
        for upd, socket in zip(updates, sockets):
            for name in names:
                for piece, dtype, shape in written_as[name]:
                    _check(piece, dtype, shape, upd, socket, len(sockets))
        written = set()
        for name, value in tensors:
            if name not in written_as or name in written:
                raise WriteRefused("E_TENSOR_MISMATCH", f"the trainer's tensors yielded {name!r}, which its metadata did not list (or listed once); they must agree", {"tensor": name})
            param = params[name]
            for piece, piece_value in [(name, value)] if param is None else split(name, param, value):
                for upd, socket in zip(updates, sockets):
                    _check(piece, piece_value.dtype, piece_value.shape, upd, socket, len(sockets))
                    upd.write(piece, _rank_piece(piece, piece_value, upd))
            written.add(name)
        missing = sorted(set(written_as) - written)
        if missing:
            raise WriteRefused("E_TENSOR_MISMATCH", f"the trainer's metadata listed tensors its iteration did not yield: {', '.join(missing)}")
    except BaseException:
        for upd in updates:
            upd.abandon()
        raise
    result = commit_all(updates)
    return {"model": target.model, "version": result["version"]}


def _pieces(name: str, dtype: Any, shape: Sequence[int], param: Optional[EngineParam]) -> List[Tuple[str, Any, Sequence[int]]]:
    """The checkpoint tensors a trainer's tensor is written as: itself, or its parameter's pieces."""
    return [(name, dtype, shape)] if param is None else [(p.name, dtype, p.shape) for p in param.pieces]
