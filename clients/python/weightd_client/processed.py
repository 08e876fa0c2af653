"""Processed layouts (docs/engines.md, "Publishing what the engine computed"): parameters an
engine derived from a served version's bytes (requantized, transposed, repacked for the kernel it
selected), handed back to the daemon so that the next engine start with the same key maps them
and skips that processing.

- ``processed_key(fields)``: the key of docs/spec/processed-key.md (the one definition; its
  vectors are test/vectors/processed-key.json);
- ``publish(socket_path, model, base, key, fields, tensors)``: begin_publish, write, commit_publish;
- ``lookup(socket_path, base, key)``: get_processed: a ``Processed`` (a read-only mapping under a
  lease of the version) or ``Absent`` (what is published instead, and which key fields differ).

Host and cuda (``--cuda-handles fd``) backends, as a writer's update.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

import rfc8785
import xxhash

from .cuda import CUDA_FD_HANDLE
from .host import HostMapping
from .protocol import Connection, ProtocolError, ServeError, close_fds
from .tensors import DTYPES, torch_dtype

#: The key's own version: a plugin whose rules of what to publish change bumps it.
KEY_PROTOCOL = "processed-1"
#: The fields of a key, every one a string (docs/spec/processed-key.md §2).
KEY_FIELDS = ("protocol", "base", "engine", "engineVersion", "processing", "arch", "tp", "params")


def processed_key(fields: Mapping[str, str]) -> str:
    """xxh3_128 of the RFC 8785 form of ``fields``: 32 lowercase hex digits. Every field of
    KEY_FIELDS must be there, as a string, and no other."""
    missing = [f for f in KEY_FIELDS if f not in fields]
    extra = sorted(set(fields) - set(KEY_FIELDS))
    if missing or extra or not all(isinstance(v, str) for v in fields.values()):
        raise ValueError(f"a processed key has exactly the string fields {list(KEY_FIELDS)}; got missing {missing}, unknown {extra}")
    return xxhash.xxh3_128_hexdigest(rfc8785.dumps(dict(fields)))


def params_digest(params: List[tuple]) -> str:
    """The ``params`` field: xxh3_128 of the RFC 8785 form of ``[[name, dtype, shape], ...]`` sorted by name."""
    return xxhash.xxh3_128_hexdigest(rfc8785.dumps(sorted([[n, d, list(s)] for n, d, s in params])))


def differing(mine: Mapping[str, str], theirs: Mapping[str, str]) -> List[str]:
    """The key fields whose values differ, in KEY_FIELDS' order, each with both values."""
    return [f"{f} (published {theirs.get(f)!r}, this engine {mine.get(f)!r})" for f in KEY_FIELDS if mine.get(f) != theirs.get(f)]


@dataclass
class Absent:
    """No layout of this key: ``published`` lists those there are (key, keyFields, bytes)."""

    published: List[Dict[str, Any]]

    def why(self, mine: Mapping[str, str]) -> str:
        if not self.published:
            return "nothing is published for this version yet"
        # The published layout closest to this engine's key: the one fewest fields away.
        closest = min((differing(mine, p["keyFields"]) for p in self.published), key=len)
        return f"the published key differs in {'; '.join(closest)}"


class Processed:
    """A processed layout mapped read-only: ``tensors`` by name (views of the daemon's sealed
    memory), held under ``lease`` of the version, which the caller detaches once they are gone.
    Mapped as get_state's segments are: host memfds, or (``device``) cuda VMM descriptors."""

    def __init__(self, reply: Dict[str, Any], fds: List[int], tensor_format: str, device: Optional[int]):
        by_segment = {s["segment"]: fd for s, fd in zip(reply["segments"], fds)}
        if len(fds) != len(reply["segments"]):
            close_fds(fds)
            raise ProtocolError("E_BAD_REPLY", f"get_processed lists {len(reply['segments'])} segment(s) but {len(fds)} descriptor(s) came with it")
        self.lease: str = reply["leaseId"]
        self.key: str = reply["key"]
        state = {**reply, "aliases": {}}
        if reply["backend"] == "cuda":
            from .cuda import CudaMapping

            try:  # the mappings hold the memory, so the descriptors go at once
                self.mapping = CudaMapping(state, device, tensor_format, segment_fds=by_segment)
            finally:
                close_fds(fds)
        else:
            self.mapping = HostMapping(state, by_segment, tensor_format)
        self.tensors = self.mapping.tensors
        self.bytes = sum(int(s["bytes"]) for s in reply["segments"])


def lookup(socket_path: str, base: str, key: str, tensor_format: str = "torch", device: Optional[int] = None, timeout: float = 30.0) -> Any:
    """get_processed of ``key`` beside version ``base`` (a rank fingerprint): ``Processed`` or
    ``Absent``. The lease lives with the process (map mode); detach it when the tensors go. A
    mapping that fails gives the lease back before the error is raised.
    ``device``: the CUDA ordinal to map a cuda layout on."""
    if socket_path.startswith("\0"):
        raise ValueError("an abstract socket carries no descriptors")
    conn = Connection(socket_path, timeout)
    try:
        reply, fds = conn.request_fds("get_processed", fingerprint=base, key=key, pid=os.getpid())
        if reply["status"] == "absent":
            close_fds(fds)
            return Absent(reply["published"])
        try:
            return Processed(reply, fds, tensor_format, device)
        except BaseException:
            # The map lease follows the process, not this connection: left held, it would pin the
            # version's memory until the process exits (a caller may carry on without the layout).
            conn.request("detach", leaseId=reply["leaseId"])
            raise
    finally:
        conn.close()


def publish(socket_path: str, model: str, base: str, fields: Mapping[str, str], tensors: Mapping[str, Any], device: Optional[int] = None, timeout: float = 300.0) -> Dict[str, Any]:
    """Publishes ``tensors`` (name -> a torch tensor, any device) beside version ``base`` of
    ``model`` under the key of ``fields``: the daemon makes fresh memory (host: a memfd; cuda, on
    ``device``: a staging allocation), this writes each tensor's bytes (contiguous, in its dtype),
    unmaps, and commits. Returns commit_publish's reply. E_PUBLISHED when the key is there already
    (map it), E_OUT_OF_MEMORY past the daemon's cap or the memory free."""
    import torch

    wanted = [{"name": name, "dtype": safetensors_dtype(t.dtype), "shape": list(t.shape)} for name, t in tensors.items()]
    conn = Connection(socket_path, timeout)
    try:
        reply, fds = conn.request_fds("begin_publish", model=model, base=base, key=processed_key(fields), keyFields=dict(fields), tensors=wanted)
        try:
            if len(fds) != 1 or len(reply["segments"]) != 1:
                raise ProtocolError("E_BAD_REPLY", f"begin_publish sent {len(fds)} descriptor(s) for {len(reply['segments'])} segment(s); one of each was expected")
            writer = _CudaWriter(reply, fds[0], device) if reply["segments"][0]["handle"] == CUDA_FD_HANDLE else _HostWriter(reply["segments"][0], fds[0])
        finally:
            close_fds(fds)
        try:
            for meta in reply["tensors"]:
                src = tensors[meta["name"]].detach().contiguous().reshape(-1).view(torch.uint8)
                if src.numel() != meta["bytes"]:
                    raise ProtocolError("E_BAD_SIZE", f"tensor {meta['name']!r} has {src.numel()} bytes; the daemon placed {meta['bytes']}")
                writer.write(meta, src.cpu().numpy())
        finally:
            # The daemon refuses to seal memory a process can still write (E_UPDATE_MAPPED, host);
            # on cuda it copies the staging into memory no writer maps.
            writer.close()
        return conn.request("commit_publish", publish=reply["publish"])
    finally:
        conn.close()


class _HostWriter:
    """The fresh memfd, mapped writable until close."""

    def __init__(self, segment: Dict[str, Any], fd: int):
        self.mm = mmap.mmap(fd, segment["bytes"], flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)

    def write(self, meta: Dict[str, Any], data: Any) -> None:
        self.mm[meta["offset"] : meta["offset"] + meta["bytes"]] = data.tobytes()

    def close(self) -> None:
        self.mm.close()


class _CudaWriter:
    """The fresh staging allocation (cuda), mapped read-write until close; written from host bytes
    (cuMemcpyHtoD), so the driver's fake runs it as a GPU does."""

    def __init__(self, reply: Dict[str, Any], fd: int, device: Optional[int]):
        from .cuda import CudaMapping

        self.mapping = CudaMapping({**reply, "aliases": {}}, device, "memoryview", segment_fds={reply["segments"][0]["segment"]: fd}, writable=True)

    def write(self, meta: Dict[str, Any], data: Any) -> None:
        self.mapping.write(meta, memoryview(data).cast("B"))

    def close(self) -> None:
        self.mapping.synchronize()
        self.mapping.close()


#: Packed dtypes are viewed as uint8 too, so they never name a torch dtype back.
_PACKED = frozenset(("F4", "F6_E2M3", "F6_E3M2"))


def safetensors_dtype(dtype: Any) -> str:
    """The dtype name (docs/spec/dtypes.md) of a torch dtype."""
    for name in sorted(DTYPES - _PACKED):
        if torch_dtype(name) == dtype:
            return name
    raise ServeError("E_UNKNOWN_DTYPE", f"torch dtype {dtype} has no safetensors name (docs/spec/dtypes.md); it cannot be published")
