"""Writing a new version of a model the daemon serves (docs/weight-updates.md).

``client.begin_update(model, base)`` asks one rank's socket for writable copies of version
``base``'s segments (the daemon copied the base into them, so only the tensors that change need
writing). Write through ``upd.tensor(name)`` (a numpy array, or a torch tensor with
``tensor_format="torch"``, over the shared pages) or ``upd.write(name, value)``; then
``upd.commit()``: the mappings go first (the daemon refuses to seal memory a process can still
write, E_UPDATE_MAPPED), and the daemon digests what was written and serves it as the model's
newest version once every local rank committed. The commit of the last rank returns the version's
number and fingerprint; readers follow with ``Attached.switch_to(fingerprint)``.

On a cuda rank (a daemon run with ``--cuda-handles fd``) the descriptors are staging VMM
allocations: they are imported and mapped read-write on this process's device, and
``upd.tensor(name)`` is a torch CUDA tensor over them (a ``CudaBuffer`` without torch), which a
trainer fills device to device (``copy_``); ``upd.write`` copies a torch tensor (any device) or
host bytes. ``commit()`` waits for the device, unmaps, and the daemon copies the staging into
memory no writer maps, which is what it serves.

A trainer whose new weights are already on the rank's GPU can skip the staging: with
``source="pull"`` no segment comes with the update; ``upd.pull_from({name: tensor})`` names the
tensors' own memory (CUDA IPC handles of their allocations, weightd_client.pull), and ``commit()``
has the daemon copy them once, device to device, into the version's final memory. The tensors must
stay allocated and unchanged until ``commit()`` returns (the update holds references to them).

Used as a context manager, an update left without commit is abandoned: the connection closes,
and the daemon frees everything of it (as it does when the writer's process dies).
"""

import mmap
from typing import Any, Dict, List, Optional

from .protocol import Connection, ProtocolError, ServeError, close_fds
from .cuda import CUDA_FD_HANDLE
from .tensors import numpy_dtype, torch_dtype


# What this client reads of a begin_update reply (docs/protocol.md, begin_update).
_REPLY_FIELDS = ("update", "model", "base", "segments", "tensors")
_ITEM_FIELDS = {"segment": ("segment", "bytes"), "tensor": ("name", "dtype", "shape", "segment", "offset", "bytes")}


def _check_reply(reply: Dict[str, Any]) -> None:
    """Refuses a begin_update reply that lacks a field this client reads, naming the field, before
    anything of it is used (the update would otherwise fail later, or half made)."""
    why = "the daemon's reply is malformed; is it of another weightd version than this client?"
    for field in _REPLY_FIELDS:
        if field not in reply:
            raise ProtocolError("E_BAD_REPLY", f"the begin_update reply lacks {field!r}; {why}")
    for kind, fields in _ITEM_FIELDS.items():
        items = reply[f"{kind}s"]
        if not isinstance(items, list):
            raise ProtocolError("E_BAD_REPLY", f"the begin_update reply's {kind}s is not a list; {why}")
        for i, item in enumerate(items):
            missing = [f for f in fields if not isinstance(item, dict) or f not in item]
            if missing:
                raise ProtocolError("E_BAD_REPLY", f"{kind} {i} of the begin_update reply lacks {missing[0]!r}; {why}")


class Update:
    """One rank's part of an update: its own connection, which must stay open until commit."""

    def __init__(
        self,
        socket_path: str,
        model: str,
        base: str,
        timeout: float = 300.0,
        tensors: Optional[List[str]] = None,
        device: Optional[int] = None,
        source: str = "staging",
        prepare: bool = False,
    ):
        """``device``: cuda only, the CUDA ordinal to map on (default: torch's current device);
        it must be the rank's GPU. ``source``: "staging" (writable copies of the base come with the
        update) or "pull" (cuda: none come; ``pull_from`` names the writer's own tensors).
        ``prepare`` (pull only): the daemon makes the version's final memory now, for the segments
        holding ``tensors`` (every segment without), so that ``pull_from``'s copies start at once;
        begin while the new weights are still being computed."""
        if source not in ("staging", "pull"):
            raise ProtocolError("E_BAD_OPTION", f"source {source!r}: use 'staging' or 'pull'")
        if prepare and source != "pull":
            raise ProtocolError("E_BAD_OPTION", "prepare is for a pull update (source='pull'): a staging update copies its segments at begin anyway")
        if source == "pull" and tensors is not None and not prepare:
            raise ProtocolError(
                "E_BAD_OPTION", "a pull update takes a tensors list only with prepare=True (the segments whose memory to make at begin): the tensors given to pull_from are the ones written"
            )
        # pull: the writer's tensors' handles, found in the device's primary context.
        self._pull: Any = None
        # The pulled tensors, held until commit() returns: the daemon reads their memory then.
        self._held: Dict[str, Any] = {}
        extra: Dict[str, Any] = {} if tensors is None else {"tensors": list(tensors)}
        if source == "pull":
            from .cuda import _current_torch_device
            from .pull import PullSources

            self._pull = PullSources(device if device is not None else _current_torch_device())
            extra = {**extra, "source": "pull", "device": self._pull.uuid, **({"prepare": True} if prepare else {})}
        try:
            self.conn = Connection(socket_path, timeout)
        except BaseException:
            self._release_pull()
            raise
        try:
            reply, fds = self.conn.request_fds("begin_update", model=model, base=base, **extra)
        except BaseException:
            self.conn.close()
            self._release_pull()
            raise
        # By segment number: a partial update maps only the segments it was given.
        self._maps: Dict[int, mmap.mmap] = {}
        # cuda: the staging allocations, mapped read-write (weightd_client.cuda.CudaMapping).
        self._cuda: Any = None
        try:
            _check_reply(reply)
            if len(fds) != len(reply["segments"]):
                raise ProtocolError("E_BAD_REPLY", f"begin_update lists {len(reply['segments'])} segment(s) but {len(fds)} descriptor(s) came with it")
            if any(seg["handle"] == CUDA_FD_HANDLE for seg in reply["segments"]):
                from .cuda import CudaMapping

                state = {"device": reply["device"], "rank": {"globalRank": f"over base {reply['base'][:12]}"}, "segments": reply["segments"], "tensors": reply["tensors"], "aliases": {}}
                fd_of = {seg["segment"]: fd for seg, fd in zip(reply["segments"], fds)}
                # Views as CudaBuffers (no torch needed to map); tensor() makes torch ones of them.
                self._cuda = CudaMapping(state, device=device, tensor_format="memoryview", segment_fds=fd_of, writable=True)
            for seg, fd in zip(reply["segments"], fds):
                if seg["handle"] != CUDA_FD_HANDLE:
                    self._maps[seg["segment"]] = mmap.mmap(fd, seg["bytes"], flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            self._unmap()
            self.conn.close()
            self._release_pull()
            raise
        finally:
            # The mappings hold the pages: no descriptor of the update stays in this process.
            close_fds(fds)
        self.id: str = reply["update"]
        self.model: str = reply["model"]
        self.base: str = reply["base"]
        self.tensors: Dict[str, Dict[str, Any]] = {t["name"]: t for t in reply["tensors"]}
        self.partial = tensors is not None
        self.result: Optional[Dict[str, Any]] = None

    def _meta(self, name: str) -> Dict[str, Any]:
        if self.result is not None or not (self._maps or self._cuda or self._pull):
            raise ProtocolError("E_CLOSED", f"the update of {self.model!r} is committed or abandoned; begin another to write")
        t = self.tensors.get(name)
        if t is None and self.partial:
            raise ProtocolError(
                "E_NOT_NAMED",
                f"tensor {name!r} was not named in begin_update(tensors=...) of {self.model!r}, so its segment is shared with the base and not writable; name it to write it",
            )
        if t is None:
            raise ProtocolError("E_UNKNOWN_TENSOR", f"the update of {self.model!r} has no tensor {name!r}; it has {len(self.tensors)} (update.tensors lists them)")
        return t

    def tensor(self, name: str, tensor_format: Optional[str] = None) -> Any:
        """A writable view of tensor ``name`` over the update's shared pages (it reads the base's
        bytes until written). Drop every view before commit: a live one keeps the pages mapped.
        ``tensor_format``: host, "numpy" (the default) or "torch"; cuda, "torch" (the default: a
        CUDA tensor) or "cuda_array" (a ``CudaBuffer``, ``__cuda_array_interface__``, no torch)."""
        import numpy as np

        t = self._meta(name)
        self._refuse_if_pull("tensor")
        if self._cuda is not None:
            return self._cuda_tensor(t, tensor_format or "torch")
        tensor_format = tensor_format or "numpy"
        raw = np.frombuffer(self._maps[t["segment"]], dtype=np.uint8, count=t["bytes"], offset=t["offset"])
        if tensor_format == "torch":
            import torch

            return torch.from_numpy(raw).view(torch_dtype(t["dtype"])).view(t["shape"])
        if tensor_format != "numpy":
            raise ProtocolError("E_BAD_OPTION", f"tensor_format {tensor_format!r}: use 'numpy' or 'torch'")
        return raw.view(numpy_dtype(t["dtype"])).reshape(t["shape"])

    def _cuda_tensor(self, t: Dict[str, Any], tensor_format: str) -> Any:
        buf = self._cuda.tensors[t["name"]]
        if tensor_format == "cuda_array":
            return buf
        if tensor_format != "torch":
            raise ProtocolError("E_BAD_OPTION", f"tensor_format {tensor_format!r} on a cuda rank: use 'torch' or 'cuda_array'")
        import torch

        from .cuda import CudaBuffer

        # Raw bytes first (torch has no __cuda_array_interface__ typestr for bf16 or fp8), then the dtype.
        raw = self._cuda.track(CudaBuffer(buf.pointer, t["bytes"], "U8", [t["bytes"]], raw=True))
        return torch.as_tensor(raw, device=f"cuda:{self._cuda.ordinal}").view(torch_dtype(t["dtype"])).view(t["shape"])

    def write(self, name: str, value: Any) -> None:
        """Copies ``value`` (a numpy array, a torch tensor on any device, or bytes) into tensor
        ``name``; its byte size must be the tensor's."""
        t = self._meta(name)
        self._refuse_if_pull("write")
        if self._cuda is not None and hasattr(value, "detach"):
            import torch

            # Device to device from the trainer's own tensor (or host to device from a CPU one),
            # as bytes: torch's copy_ queues it on the current stream (commit waits for it).
            src = value.detach().contiguous().view(-1)
            nbytes = src.numel() * src.element_size()
            if nbytes != t["bytes"]:
                raise ProtocolError("E_BAD_SIZE", f"tensor {name!r} holds {t['bytes']} bytes ({t['dtype']} {t['shape']}); the value given has {nbytes}")
            if nbytes:
                self._cuda_tensor(t, "torch").view(-1).view(torch.uint8).copy_(src.view(torch.uint8))
            return
        if hasattr(value, "detach"):
            import torch

            value = value.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy()
        data = memoryview(value).cast("B") if not isinstance(value, (bytes, bytearray)) else memoryview(value)
        if data.nbytes != t["bytes"]:
            raise ProtocolError("E_BAD_SIZE", f"tensor {name!r} holds {t['bytes']} bytes ({t['dtype']} {t['shape']}); the value given has {data.nbytes}")
        if self._cuda is not None:
            self._cuda.write(t, data)
            return
        self._maps[t["segment"]][t["offset"] : t["offset"] + t["bytes"]] = data

    def _refuse_if_pull(self, call: str) -> None:
        if self._pull is not None:
            raise ProtocolError("E_BAD_OPTION", f"the update of {self.model!r} pulls: it has no staging to {call}; name the tensors with pull_from(...), or begin_update without source='pull'")

    def pull_from(self, tensors: Any) -> Dict[str, Any]:
        """Names, for a pull update, the writer's own tensors (contiguous torch CUDA tensors on the
        rank's GPU, or dense ``__cuda_array_interface__`` arrays) as the new bytes of the layout's
        tensors of those names; may be called several times before ``commit()``, each tensor once.
        Everything is checked before anything is sent (names, byte sizes, devices, handles); the
        device is synchronized first, so what torch queued into them lands before the daemon reads.
        Keeps a reference to each until ``commit()`` returns; they must not change meanwhile.
        ``tensors`` may be a ``PullPlan`` of this model (client.pull_plan): its tensors, named
        once, are pulled by one short request, once the plan checked they lie where it says.
        Returns the daemon's last reply: ``pulled`` of ``tensors`` so far."""
        if self._pull is None:
            raise ProtocolError("E_BAD_OPTION", f"the update of {self.model!r} was begun with staging; begin_update(..., source='pull') to pull")
        from .pull import PullPlan

        if isinstance(tensors, PullPlan):
            return self._pull_by_plan(tensors)
        entries = []
        for name, value in tensors.items():
            t = self._meta(name)
            if name in self._held:
                raise ProtocolError("E_BAD_OPTION", f"tensor {name!r} is pulled already in this update; pull each tensor once")
            source, offset, nbytes = self._pull.locate(name, value)
            if nbytes != t["bytes"]:
                raise ProtocolError("E_BAD_SIZE", f"tensor {name!r} holds {t['bytes']} bytes ({t['dtype']} {t['shape']}); the value given has {nbytes}")
            if nbytes:
                entries.append({"name": name, "source": source, "offset": offset, "bytes": nbytes})
        from .pull import batches

        self._pull.synchronize()
        # Held from the first batch on: a batch the daemon took is read at commit, whatever follows.
        self._held.update(tensors)
        reply: Dict[str, Any] = {"pulled": len(self._held), "tensors": len(self.tensors)}
        for sources, batch in batches(entries, self._pull.handles):
            reply = self.conn.request("pull_tensors", update=self.id, sources=sources, tensors=batch)
        return reply

    def _pull_by_plan(self, plan: Any) -> Dict[str, Any]:
        if plan.model != self.model:
            raise ProtocolError("E_BAD_OPTION", f"the pull plan names tensors of {plan.model!r}, not of {self.model!r}; open a plan of this model")
        twice = next((name for name in plan.names if name in self._held), None)
        if twice is not None:
            raise ProtocolError("E_BAD_OPTION", f"tensor {twice!r} is pulled already in this update; pull each tensor once")
        plan.check()
        reply = self.conn.request("pull_by_plan", update=self.id, plan=plan.id)
        # Held as pull_from's, until commit() returns: the daemon reads them until then, even if
        # the plan is closed first.
        self._held.update(plan.tensors)
        return reply

    def commit(self) -> Dict[str, Any]:
        """Unmaps, then commits this rank: the reply's ``waiting`` lists the local ranks still to
        commit; once empty, ``version``, ``modelFingerprint`` and this rank's ``fingerprint`` name
        the version that now serves."""
        if self.result is not None:
            return self.result
        self._unmap()
        self.result = self.conn.request("commit_update", update=self.id)
        # The daemon closed its handles of the pulled tensors before it replied.
        self._held = {}
        self._release_pull()
        if not self.result["waiting"]:
            self.conn.close()
        return self.result

    def _release_pull(self) -> None:
        if self._pull is not None:
            pull, self._pull = self._pull, None
            pull.close()

    def abandon(self) -> None:
        """Ends the update uncommitted: the daemon frees its copies. Never raises: a mapping a live
        view still holds goes with its last view (the daemon serves nothing of it)."""
        # The connection first: its end is what ends the update in the daemon, whatever the views.
        self.conn.close()
        self._held = {}
        try:
            self._release_pull()
        except Exception:  # noqa: BLE001 - abandoning never raises
            pass
        if self._cuda is not None:
            cuda, self._cuda = self._cuda, None
            try:
                cuda.close()  # deferred to the last view's end while views are alive
            except Exception:  # noqa: BLE001 - abandoning never raises; the daemon frees its side regardless
                pass
        for i, m in list(self._maps.items()):
            try:
                m.close()
            except BufferError:
                continue
            del self._maps[i]
        self._maps = {}

    def _unmap(self) -> None:
        if self._cuda is not None:
            # What torch queued into the staging must land before the daemon copies it.
            cuda = self._cuda
            cuda.synchronize()
            cuda.tensors = {}
            alive = cuda.views_alive()
            if alive:
                cuda.tensors = cuda._make_tensors(cuda.state, "memoryview")  # the update stays writable
                raise ServeError("E_UPDATE_MAPPED", f"{alive} view(s) of the update of {self.model!r} are still alive; delete every tensor(...) view before commit")
            self._cuda = None
            cuda.close()
        for i, m in list(self._maps.items()):
            try:
                m.close()
            except BufferError as err:
                raise ServeError(
                    "E_UPDATE_MAPPED",
                    f"a view of the update of {self.model!r} (segment {i}) is still alive; delete every tensor(...) view before commit",
                ) from err
            del self._maps[i]

    def __enter__(self) -> "Update":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.result is None:
            self.abandon()


def commit_all(updates: List[Update]) -> Dict[str, Any]:
    """Commits every local rank's part of one update, in order, and closes their connections:
    the last commit's reply, which names the version that now serves."""
    try:
        results = [u.commit() for u in updates]
    except BaseException:
        # Every rank's, the committed ones' too: the update ends with its first connection, and the
        # ranks not reached still map their staging (a cuda writer's imports stay until closed).
        for u in updates:
            u.abandon()
        raise
    finally:
        for u in updates:
            u.conn.close()
    return results[-1]
