"""A writer's pull on a cuda rank (docs/weight-updates.md, "Pulling from the writer's tensors"):
the trainer's own tensors, already on the rank's GPU, are named to the daemon by the legacy CUDA
IPC handle of the cudaMalloc allocation holding each one and its offset in it, and the daemon
copies them once, device to device, into the new version's memory (which no writer maps).

The handle comes from the driver (``cuMemGetAddressRange``, then ``cuIpcGetMemHandle`` of the
allocation's base, as torch's own sharing does), not from ``untyped_storage()._share_cuda_()``:
that one also puts the storage under torch's IPC reference counting, which waits for a consumer's
release the daemon never sends, so a freed parameter's block would be kept until the process exits.

Memory with no legacy IPC handle (torch's ``expandable_segments``, ``cuMemCreate`` allocations) is
refused with ``E_UPDATE_UNSUPPORTED``: write it through a staging update instead.
"""

from __future__ import annotations

import base64
import bisect
import ctypes
import json
from typing import Any, Dict, Iterator, List, Optional, Tuple

from .cuda import CudaError, _Driver, _IpcHandle, context_current
from .protocol import MAX_REQUEST_BYTES, Connection, ProtocolError

# What one pull_tensors request may hold: well under the daemon's request bound, with room for the envelope.
_BATCH_BYTES = MAX_REQUEST_BYTES - (64 << 10)


def _device_pointer(name: str, value: Any, ordinal: int) -> Tuple[int, int]:
    """The device address and byte size of ``value``'s bytes: a contiguous torch CUDA tensor on
    device ``ordinal``, or anything with a dense ``__cuda_array_interface__``."""
    if hasattr(value, "data_ptr") and hasattr(value, "is_cuda"):
        if not value.is_cuda:
            raise ProtocolError("E_BAD_OPTION", f"tensor {name!r} is on {value.device}, not a CUDA device: a pull copies GPU memory; write host bytes through a staging update (upd.write)")
        if value.device.index != ordinal:
            raise ProtocolError("E_DEVICE_MISMATCH", f"tensor {name!r} is on cuda:{value.device.index}, but this update pulls on cuda:{ordinal}, the rank's GPU; a pull copies within one GPU")
        if not value.is_contiguous():
            raise ProtocolError("E_NOT_CONTIGUOUS", f"tensor {name!r} is not contiguous: a pull copies each tensor's bytes as one range; pull .contiguous() of it (and keep that alive until commit)")
        return value.data_ptr(), value.numel() * value.element_size()
    cai = getattr(value, "__cuda_array_interface__", None)
    if cai is None:
        raise ProtocolError("E_BAD_OPTION", f"tensor {name!r} is a {type(value).__name__}: pull_from takes CUDA tensors (torch, or __cuda_array_interface__); write host bytes through a staging update")
    shape, typestr = tuple(cai["shape"]), cai["typestr"]
    count = 1
    for n in shape:
        count *= n
    itemsize = int(typestr[2:])
    strides = cai.get("strides")
    if strides is not None:
        dense, step = [], itemsize
        for n in reversed(shape):
            dense.append(step)
            step *= n
        if tuple(reversed(dense)) != tuple(strides):
            raise ProtocolError("E_NOT_CONTIGUOUS", f"tensor {name!r} is not dense (strides {strides}): a pull copies each tensor's bytes as one range")
    return int(cai["data"][0]), count * itemsize


class PullSources:
    """The handles a pull names, one per allocation (a handle is opened once per daemon context, so
    tensors of one allocation share it), found with the device's primary context current."""

    def __init__(self, ordinal: int):
        self.driver = d = _Driver.get()
        self.ordinal = ordinal
        self.dev = d.device(ordinal)
        self.uuid = d.device_uuid(self.dev)
        ctx = ctypes.c_void_p()
        d.check(d.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), self.dev), "cuDevicePrimaryCtxRetain")
        self._ctx = ctx
        self.handles: List[str] = []
        # The allocations found so far, by base: [base, end) and its handle's place in `handles`,
        # bases sorted. A tensor inside one of them needs no driver call: the pulled tensors are
        # held until commit, so their allocations live as long as this update.
        self._bases: List[int] = []
        self._allocations: Dict[int, Tuple[int, int]] = {}

    def _current(self) -> Any:
        return context_current(self.driver, self._ctx)

    def locate(self, name: str, value: Any) -> Tuple[int, int, int]:
        """``(source, offset, nbytes)``: the handle of the allocation holding ``value`` and where in it."""
        ptr, nbytes = _device_pointer(name, value, self.ordinal)
        if nbytes == 0:
            return -1, 0, 0  # nothing to pull (an empty tensor's pointer is null: no allocation to find)
        base, end, source = self._known(ptr) or self._find(name, ptr)
        if ptr + nbytes > end:
            raise ProtocolError("E_BAD_SIZE", f"tensor {name!r} ({nbytes} bytes at {ptr:#x}) runs past its allocation ({end - base} bytes at {base:#x})")
        return source, ptr - base, nbytes

    def _find(self, name: str, ptr: int) -> Tuple[int, int, int]:
        """``(base, end, source)`` of the allocation holding address ``ptr``, none of those found
        so far: asked of the driver, with its IPC handle, and recorded."""
        d = self.driver
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        with self._current():
            d.check(d.cuMemGetAddressRange(ctypes.byref(base), ctypes.byref(size), ptr), f"cuMemGetAddressRange({name})")
            handle = _IpcHandle()
            rc = d.cuIpcGetMemHandle(ctypes.byref(handle), base.value)
            if rc != 0:
                try:
                    d.check(rc, f"cuIpcGetMemHandle({name})")
                except CudaError as err:
                    raise ProtocolError(
                        "E_UPDATE_UNSUPPORTED",
                        f"tensor {name!r}'s memory has no CUDA IPC handle ({err}): a pull needs cudaMalloc'd memory, not torch's expandable_segments "
                        "or cuMemCreate; write it through a staging update (begin_update without source) instead",
                    ) from err
        source = len(self.handles)
        self.handles.append(base64.b64encode(ctypes.string_at(ctypes.addressof(handle), 64)).decode())
        self._allocations[base.value] = (base.value + size.value, source)
        bisect.insort(self._bases, base.value)
        return base.value, base.value + size.value, source

    def _known(self, ptr: int) -> Optional[Tuple[int, int, int]]:
        """``(base, end, source)`` of an allocation found earlier that holds address ``ptr``."""
        i = bisect.bisect_right(self._bases, ptr) - 1
        if i < 0:
            return None
        base = self._bases[i]
        end, source = self._allocations[base]
        return (base, end, source) if ptr < end else None

    def synchronize(self) -> None:
        """Waits for everything queued on the device (torch's streams run in this context), so that
        what the tensors are to hold has landed before the daemon reads them."""
        with self._current():
            self.driver.check(self.driver.cuCtxSynchronize(), "cuCtxSynchronize")

    def close(self) -> None:
        if self._ctx is not None:
            self._ctx = None
            self.driver.check(self.driver.cuDevicePrimaryCtxRelease(self.dev), "cuDevicePrimaryCtxRelease")


def _is_torch(value: Any) -> bool:
    return hasattr(value, "data_ptr") and hasattr(value, "numel") and hasattr(value, "is_cuda")


def batches(entries: List[Dict[str, Any]], handles: List[str]) -> Iterator[Tuple[List[str], List[Dict[str, Any]]]]:
    """pull_tensors bodies under the request bound: each batch's own ``sources`` (only the handles
    it uses) and its entries with ``source`` indexing them."""
    # Most pulls fit one request (an 8B model's 291 tensors: 28 kB): known from a bound on the
    # body's size, without encoding each entry to measure it, which took 0.8 ms of such a pull's
    # client time on the development VM.
    if not entries:
        return
    used = sorted({e["source"] for e in entries})
    if _size_bound(entries) + sum(len(handles[g]) + 4 for g in used) <= _BATCH_BYTES:
        if used == list(range(len(handles))):
            yield handles, entries
        else:
            local = {g: i for i, g in enumerate(used)}
            yield [handles[g] for g in used], [{**e, "source": local[e["source"]]} for e in entries]
        return
    batch: List[Dict[str, Any]] = []
    used: Dict[int, int] = {}
    size = 0
    for e in entries:
        cost = len(json.dumps(e)) + 16 + (0 if e["source"] in used else len(handles[e["source"]]) + 4)
        if batch and size + cost > _BATCH_BYTES:
            yield _sources(used, handles), batch
            batch, used, size = [], {}, 0
            cost = len(json.dumps(e)) + 16 + len(handles[e["source"]]) + 4
        local = used.setdefault(e["source"], len(used))
        batch.append({**e, "source": local})
        size += cost
    if batch:
        yield _sources(used, handles), batch


def _size_bound(entries: List[Dict[str, Any]]) -> int:
    """At least the bytes ``entries`` take in a request's JSON: each name escaped at worst 12 bytes
    a character (a surrogate pair's two ``\\uXXXX``), the keys, separators and three numbers of at
    most 20 digits each in under 128 bytes."""
    return sum(12 * len(e["name"]) + 128 for e in entries)


def _sources(used: Dict[int, int], handles: List[str]) -> List[str]:
    return [handles[g] for g, _ in sorted(used.items(), key=lambda kv: kv[1])]


class PullPlan:
    """A pull plan (docs/weight-updates.md, "Pull plans"): a trainer's tensors of ``model``, named
    to the daemon once, on a connection of the plan's own. The daemon opens their memory and makes
    what its copies and digests need now, and keeps it while the plan is open, so that each update
    after pulls them with one short request: ``upd.pull_from(plan)`` on an update begun with
    ``source="pull"`` (on any connection of this process).

    The plan holds the tensors given until ``close()``, so their allocations stay. Before each pull
    it checks that every one of them still lies where the plan says (``E_PULL_PLAN_STALE``: open a
    new plan); a trainer that writes its new weights into the same tensors (an optimizer's step, a
    ``copy_``) keeps its plan for good. One that replaces a parameter's tensor with another must
    open a new plan: the plan reads the tensors it was given.

    A plan of more tensors than one request holds (an 8B model's 291 tensors take 28 kB of its
    1 MiB; a large MoE's rank may hold tens of thousands) is sent in parts, on the plan's own
    connection, and made once its last part came."""

    def __init__(self, socket_path: str, model: str, tensors: Dict[str, Any], device: Optional[int] = None, timeout: float = 300.0):
        from .cuda import _current_torch_device

        if not tensors:
            raise ProtocolError("E_BAD_OPTION", f"a pull plan of {model!r} names no tensor: give it the trainer's tensors by the layout's names")
        self.model = model
        self._sources = PullSources(device if device is not None else _current_torch_device())
        self.conn: Optional[Connection] = None
        try:
            entries: List[Dict[str, Any]] = []
            #: Per tensor: its name, the tensor, and where the plan names its bytes (address, size).
            self._places: List[Tuple[str, Any, int, int]] = []
            for name, value in tensors.items():
                source, offset, nbytes = self._sources.locate(name, value)
                ptr = _device_pointer(name, value, self._sources.ordinal)[0]
                self._places.append((name, value, ptr, nbytes))
                if nbytes:
                    entries.append({"name": name, "source": source, "offset": offset, "bytes": nbytes})
            if not entries:
                raise ProtocolError("E_BAD_OPTION", f"every tensor of the pull plan of {model!r} is empty: there is nothing to pull")
            self.conn = Connection(socket_path, timeout)
            # A plan of more tensors than one request holds goes in parts, each under the bound:
            # all but the last with ``more``, each after the first naming the plan.
            parts = list(batches(entries, self._sources.handles))
            plan: Dict[str, Any] = {}
            for i, (sources, part) in enumerate(parts):
                more = {"more": True} if i + 1 < len(parts) else {}
                reply = self.conn.request("open_pull_plan", model=model, device=self._sources.uuid, sources=sources, tensors=part, **more, **plan)
                plan = {"plan": reply["plan"]}
        except BaseException:
            self.close()
            raise
        #: Per tensor: whether it is a torch tensor, and its element count, for check()'s fast path.
        self._torch = [(True, v.numel()) if _is_torch(v) else (None, 0) for _, v, _, _ in self._places]
        #: The plan's number in the daemon, and what it reported of making it.
        self.id: str = reply["plan"]
        self.reply = reply
        self.names = frozenset(name for name, _, _, _ in self._places)

    @property
    def tensors(self) -> Dict[str, Any]:
        return {name: value for name, value, _, _ in self._places}

    def check(self) -> None:
        """Refuses (``E_PULL_PLAN_STALE``, naming the tensor) where a tensor no longer lies where
        the plan names it: moved, resized; then waits for the device, so that what torch queued
        into the tensors has landed before the daemon reads them."""
        if self.conn is None:
            raise ProtocolError("E_PULL_PLAN_CLOSED", f"the pull plan of {self.model!r} is closed; open a new one (client.pull_plan)")
        # torch tensors by their address and element count alone (a few hundred of them each
        # step: this is on the update's path), anything else as it was located.
        if all(t is not None and v.data_ptr() == p and v.numel() == n for (_, v, p, _), (t, n) in zip(self._places, self._torch)):
            self._sources.synchronize()
            return
        for name, value, ptr, nbytes in self._places:
            now, size = _device_pointer(name, value, self._sources.ordinal)
            if now != ptr or size != nbytes:
                raise ProtocolError(
                    "E_PULL_PLAN_STALE",
                    f"tensor {name!r} lies at {now:#x} ({size} bytes), not at {ptr:#x} ({nbytes} bytes) where the pull plan names it; "
                    "open a new plan (client.pull_plan) after moving the trainer's tensors",
                )
        self._sources.synchronize()

    def close(self) -> None:
        """Ends the plan: the daemon lets go of the trainer's memory it opened (with the plan's connection), then this drops the tensors."""
        if self.conn is not None:
            conn, self.conn = self.conn, None
            conn.close()
        self._places, self._torch = [], []
        if self._sources is not None:
            sources, self._sources = self._sources, None
            sources.close()

    def __enter__(self) -> "PullPlan":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
