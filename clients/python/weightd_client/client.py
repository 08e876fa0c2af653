"""The client API: find a rank's socket, ask for its state, attach zero-copy or copy, detach,
release. Protocol details live in protocol.py; backends in host.py and cuda.py."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional

# Both mappings are imported with the client (stdlib only at module level), not on the first
# attach: on the H200 a fresh process's first attach spent 10 of its 16 ms importing .cuda.
from .columns import TensorColumns
from .cuda import CUDA_FD_HANDLE, CudaMapping
from .host import HostMapping
from .liveness import is_process_alive
from .packed_manifest import unpack_manifest
from .protocol import MAX_REQUEST_BYTES, Connection, ProtocolError, ServeError, close_fds
from .retire import Retirer

if TYPE_CHECKING:
    from .update import Update
    from .pull import PullPlan

log = logging.getLogger("weightd_client")

SOCKET_SUFFIX = ".sock"
NODE_MANIFEST = "node.json"
# Sockets in the directory that serve no rank (docs/spec/socket-names.md, 4 and 5).
_NOT_RANK_SOCKET = re.compile(r"keeper\.sock|control-[0-9]+\.sock")


def default_socket_dir() -> str:
    """The daemon's default, ``<tmpdir>/weightd-<uid>``, with Node's os.tmpdir() rule (not
    Python's tempfile, which probes other places)."""
    tmp = os.environ.get("TMPDIR") or os.environ.get("TMP") or os.environ.get("TEMP") or "/tmp"
    if len(tmp) > 1 and tmp.endswith("/"):
        tmp = tmp[:-1]
    return os.path.join(tmp, f"weightd-{os.getuid()}")


def device_file_stem(device_id: str) -> str:
    """A device id as a socket/lock file stem: the rule of docs/spec/socket-names.md."""
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", device_id)
    if not stem:
        return "_"
    return "_" + stem[1:] if stem.startswith(".") else stem


def is_rank_socket_name(name: str) -> bool:
    """Whether a file name in the socket dir may be a rank's socket: the rule of docs/spec/socket-names.md."""
    return name.endswith(SOCKET_SUFFIX) and _NOT_RANK_SOCKET.fullmatch(name) is None


def live_node_manifest(socket_dir: str) -> Optional[Dict[str, Any]]:
    """``node.json`` in ``socket_dir`` (src/wire/nodeManifest.ts): which socket serves which rank
    of which model; None when there is none, it is not one, or the daemon that wrote it is gone."""
    try:
        with open(os.path.join(socket_dir, NODE_MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
        start_time = manifest.get("startTime")
        if isinstance(manifest.get("ranks"), list) and is_process_alive(manifest["pid"], start_time if isinstance(start_time, str) else None):
            return manifest
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def find_socket(global_rank: Optional[int] = None, device_uuid: Optional[str] = None, socket_dir: Optional[str] = None) -> str:
    """The socket serving a rank (via the node manifest, else by asking each socket) or a device."""
    d = socket_dir or default_socket_dir()
    if device_uuid is not None:
        path = os.path.join(d, device_file_stem(device_uuid) + SOCKET_SUFFIX)
        if os.path.exists(path):
            return path
    elif global_rank is not None:
        try:
            for entry in (live_node_manifest(d) or {"ranks": []})["ranks"]:
                if entry["globalRank"] == global_rank and os.path.exists(entry["socketPath"]):
                    return entry["socketPath"]
        except (KeyError, TypeError):
            pass  # not a manifest this client reads: ask the sockets themselves
        try:
            names = sorted(n for n in os.listdir(d) if is_rank_socket_name(n))
        except OSError:
            names = []
        for name in names:
            path = os.path.join(d, name)
            try:
                conn = Connection(path, timeout=2.0)
                try:
                    if conn.request("ping")["rank"]["globalRank"] == global_rank:
                        return path
                finally:
                    conn.close()
            except Exception:  # a stale socket or a stopping daemon: try the next
                continue
    else:
        raise ValueError("find_socket needs global_rank or device_uuid")
    what = f"device {device_uuid}" if device_uuid is not None else f"rank {global_rank}"
    raise ServeError(
        "E_NO_SOCKET",
        f"no weightd socket in {d} serves {what}; the daemon is not running or not ready yet (load from disk meanwhile), or it uses another socket dir",
    )


@dataclass
class Mismatch:
    """The cache holds something else: load from disk. ``fields`` names what differs."""

    fields: List[str]
    fingerprint: str
    fingerprint_fields: Dict[str, str]
    status: str = "mismatch"


@dataclass
class PendingSwitch:
    """A switch made ready (``WeightdClient.prepare_switch``): the fingerprint asked for, the new
    version's get_state reply (its lease is held) and what the mapping prepared."""

    fingerprint: str
    state: Dict[str, Any]
    prepared: Any


@dataclass
class Attached:
    """Zero-copy tensors; valid until ``detach()`` (also on ``with`` exit)."""

    backend: str
    lease_id: str
    state: Dict[str, Any]
    tensors: Dict[str, Any]
    _client: "WeightdClient" = field(repr=False)
    _mapping: Any = field(repr=False)
    status: str = "attached"
    _detached: bool = field(default=False, repr=False)
    _pending: Optional["PendingSwitch"] = field(default=None, repr=False)

    def detach(self) -> None:
        """Unmaps and drops the lease. Drop the tensors first: on cuda, while any view is still
        referenced, both wait for the last one to be freed (a closed IPC pointer would fault)."""
        if self._detached:
            return
        self._detached = True
        self.tensors = {}
        # The lease ends when the mapping closes: now, on this client's connection, or, while views
        # are still referenced, when the last is freed. That runs in a finalizer, which a garbage
        # collection may run in the middle of a request on this connection: a request nested in
        # it would break both, so that end goes on a connection of its own (a map lease is the
        # process's, on any of its connections).
        now = True

        def end() -> None:
            if now:
                self._client.detach(self.lease_id)
            else:
                self._client.detach_elsewhere(self.lease_id)

        try:
            self._drop_pending()
        finally:
            try:
                self._mapping.close(then=end)
            finally:
                now = False

    def prepare_switch(self, fingerprint: str, fingerprint_fields: Optional[Dict[str, str]] = None) -> "Attached | Mismatch":
        """The part of ``switch_to(fingerprint)`` that may run while the engine still computes
        with the current version (at the event, during a step): takes the new version's lease and
        imports its segments that differ from the ones mapped (segments it shares with them are
        not touched at all). The tensors still read the current version; the next
        ``switch_to(fingerprint)`` only remaps. A prepare for another fingerprint, or a detach,
        gives back what this one took. ``Mismatch`` when the daemon does not serve it."""
        if self._detached:
            raise ProtocolError("E_CLOSED", "this attach was detached; attach again")
        self._drop_pending()
        pending = self._client.prepare_switch(self._mapping, fingerprint, fingerprint_fields, self.state.get("layout", "checkpoint"))
        if isinstance(pending, Mismatch):
            return pending
        self._pending = pending
        return self

    def switch_to(self, fingerprint: str, fingerprint_fields: Optional[Dict[str, str]] = None) -> "Attached | Mismatch":
        """Makes these tensors read another model the daemon serves with the same placement (the
        same names, dtypes, shapes and offsets; another version of the weights), in place: the
        views keep their addresses, so code that captured them (a CUDA graph) reads the new
        bytes with nothing rebuilt. Only the segments the new version does not share with the
        mapped one are remapped (the daemon names each segment's memory). Takes the new
        version's lease; the old one's allocations and lease are let go of right after it
        returns, on the client's retirer thread (this client's next request waits for that). On
        a failure the tensors still read the old version and its lease is kept. Call it between
        steps: the device is synchronized, and nothing may read the tensors meanwhile. What ``prepare_switch(fingerprint)`` did ahead is
        used, else it is done now. ``last_switch`` says what it did.
        On cuda it needs ``--cuda-handles fd`` (legacy IPC handles: E_REMAP_UNSUPPORTED)."""
        if self._detached:
            raise ProtocolError("E_CLOSED", "this attach was detached; attach again")
        pending, self._pending = self._pending, None
        # Prepared for another version, or against a mapping that switched since (through
        # WeightdClient.switch): what it holds is not what this switch needs.
        if pending is not None and (pending.fingerprint != fingerprint or pending.prepared.against is not self._mapping.state):
            self._client.drop_switch(self._mapping, pending)
            pending = None
        if pending is None:
            pending = self._client.prepare_switch(self._mapping, fingerprint, fingerprint_fields, self.state.get("layout", "checkpoint"))
            if isinstance(pending, Mismatch):
                return pending
        state = self._client.finish_switch(self._mapping, pending, self.lease_id)
        self.lease_id, self.state = state["leaseId"], state
        return self

    @property
    def last_switch(self) -> Optional[Dict[str, Any]]:
        """What the last ``switch_to`` did: ``remapped`` (segment numbers), ``skipped`` (segments
        shared with the version before, left mapped as they were), ``seconds`` (from the device's
        synchronization to the last access granted) and, on a GPU, ``split``: its ``syncSeconds``,
        ``remapSeconds`` (the unmaps and maps) and ``grantSeconds``. None before any switch."""
        return getattr(self._mapping, "last_switch", None)

    def _drop_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self._client.drop_switch(self._mapping, pending)

    def __enter__(self) -> "Attached":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.detach()


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic collector off while an attach decodes the manifest and makes a view per
    tensor: tens of thousands of new objects set off full collections that walk all of them, which
    at 50k tensors made the views' cost vary by 3x. Nothing an attach makes is a cycle.

    What the attach made lives as long as the attach: at the end it goes to the oldest generation
    at once (freeze, then unfreeze, which puts every tracked object there), instead of a
    young-generation pass over every new tensor when the collector comes back on (and a
    middle-generation pass after it): at 50k tensors, about 10 ms of a first attach's CPU on the
    development VM (bench/RESULTS.md). freeze would take the process's own young objects along,
    and garbage among them (a cycle holding a large buffer, say) would then wait for a full
    collection, rare in a process of millions of objects. So the young generations are collected
    first, as the collector's next middle pass would: their garbage is freed, and what lives goes
    to the oldest generation, where that pass puts it. It costs about 0.45 ms of CPU in a fresh
    process that imported torch (bench/RESULTS.md; the thresholds bound what the young generations
    hold, some 700 + 7,000 objects, wherever it runs). Only what other threads allocate during the
    attach goes along with it. Nothing is left frozen; where the process froze objects of its own,
    they stay as they are and the attach's take the ordinary way."""
    was = gc.isenabled()
    hand_over = was and gc.get_freeze_count() == 0
    if hand_over:
        gc.collect(1)
    gc.disable()
    try:
        yield
    finally:
        if hand_over:
            gc.freeze()
            gc.unfreeze()
        if was:
            gc.enable()


class WeightdClient:
    """One rank's socket. Not thread-safe: use one client per thread."""

    def __init__(self, socket_path: str, timeout: float = 30.0, client_name: Optional[str] = None):
        self.conn = Connection(socket_path, timeout)
        self.client_name = client_name or f"weightd-python/{os.getpid()}"
        # What a switch replaced is let go of on this thread after it returns (retire.py); every
        # request here waits for it first, so nothing this client asks next finds it still held.
        self._retirer = Retirer()
        self.conn.before_request = self._retirer.settle
        self.conn.request("ping")  # connect now, so a wrong path fails here

    @property
    def socket_path(self) -> str:
        return self.conn.socket_path

    def ping(self) -> Dict[str, Any]:
        return self.conn.request("ping")

    def get_state(
        self, fingerprint: str, mode: str = "map", fingerprint_fields: Optional[Dict[str, str]] = None, layout: str = "checkpoint"
    ) -> Dict[str, Any]:
        """The get_state reply: ``status`` "ok" (manifest and lease) or "mismatch". Its
        ``tensors`` are a ``TensorColumns``, a sequence of one dict per tensor, whichever form the
        daemon sent.

        ``layout`` names whose names and shapes the tensors come under (docs/protocol.md, Layouts).
        """
        try:
            reply = self.conn.request(
                "get_state",
                fingerprint=fingerprint,
                pid=os.getpid(),
                mode=mode,
                fingerprintFields=fingerprint_fields,
                client=self.client_name,
                layout=None if layout == "checkpoint" else layout,
                packed=True,
                columns=True,
            )
        except ProtocolError as err:
            # A reply whose packed manifest was refused came with a lease: a map lease follows
            # this process, so it would hold the version's memory until the process exits.
            if "leaseId" in err.details:
                self.detach(err.details["leaseId"])
            raise
        # A daemon older than layouts ignores the field and answers with checkpoint names.
        if reply.get("status") == "ok" and reply.get("layout", "checkpoint") != layout:
            self.detach(reply["leaseId"])
            raise ProtocolError(
                "E_LAYOUT_NOT_SERVED",
                f"asked for layout {layout!r} but the daemon answered with {reply.get('layout', 'checkpoint')!r} "
                "(a weightd older than layouts); upgrade the daemon, or load from disk",
            )
        if reply.get("status") == "ok":
            # A daemon older than packing sends columns, and one older than columns an object per tensor.
            try:
                if "packed" in reply:
                    reply["tensors"] = unpack_manifest(reply.pop("packed"))
                elif "columns" in reply:
                    reply["tensors"] = TensorColumns(reply.pop("columns"))
                else:
                    reply["tensors"] = TensorColumns.from_objects(reply.get("tensors"))
            except BaseException:
                self.detach(reply["leaseId"])
                raise
        return reply

    def _state(self, fingerprint: str, mode: str, fingerprint_fields: Optional[Dict[str, str]], layout: str) -> Any:
        reply = self.get_state(fingerprint, mode, fingerprint_fields, layout)
        if reply.get("status") == "mismatch":
            return Mismatch(reply["fields"], reply["fingerprint"], reply["fingerprintFields"])
        return reply

    def _open(self, state: Dict[str, Any], device: Optional[int], tensor_format: str) -> Any:
        if state["backend"] == "cuda":
            if not any(s["handle"] == CUDA_FD_HANDLE for s in state["segments"]):
                return CudaMapping(state, device, tensor_format)
            # --cuda-handles fd: the mappings hold the memory, so the descriptors go at once.
            fds = self.segment_fds(state["leaseId"])
            try:
                return CudaMapping(state, device, tensor_format, segment_fds=fds)
            finally:
                close_fds(list(fds.values()))
        old = [s["handle"] for s in state["segments"] if s["handle"] != "fd"]
        if old:
            raise ProtocolError("E_BAD_MANIFEST", f"host segment handle {old[0]!r} is not \"fd\": the daemon is older than memfd segments; upgrade it, or load from disk")
        return HostMapping(state, self.segment_fds(state["leaseId"]), tensor_format)

    def segment_fds(self, lease_id: str, segments: Optional[List[int]] = None) -> Dict[int, int]:
        """get_segment_fds on this connection: each segment's descriptor (host: a sealed memfd;
        cuda: VMM memory) by segment number, the caller's to close (HostMapping does, and _open
        for cuda); ``segments``: only those (a daemon older than that sends every one, and the
        others are closed here). Nothing received is left open if this fails."""
        reply, fds = self.conn.request_fds("get_segment_fds", leaseId=lease_id, **({"segments": segments} if segments is not None else {}))
        if len(reply.get("segments", [])) != len(fds):
            close_fds(fds)
            raise ProtocolError("E_BAD_REPLY", f"get_segment_fds lists {len(reply.get('segments', []))} segment(s) but {len(fds)} descriptor(s) came with it")
        got = dict(zip(reply["segments"], fds))
        if segments is not None:
            close_fds([fd for n, fd in got.items() if n not in segments])
            got = {n: fd for n, fd in got.items() if n in segments}
        return got

    def prepare_switch(self, mapping: Any, fingerprint: str, fingerprint_fields: Optional[Dict[str, str]], layout: str) -> "PendingSwitch | Mismatch":
        """Takes a map lease on version ``fingerprint`` and makes ``mapping``'s switch to it ready
        (``prepare_remap``: the segments it does not share with what ``mapping`` maps are imported
        or mapped aside; only their descriptors are asked for). The views still read the mapped
        version. ``Mismatch`` with nothing changed when the daemon does not serve it; on a failure
        the new lease is dropped."""
        state = self._state(fingerprint, "map", fingerprint_fields, layout)
        if isinstance(state, Mismatch):
            return state
        try:
            changed = mapping.changed_segments(state)
            every = [seg["segment"] for seg in state["segments"]]
            fds = (self.segment_fds(state["leaseId"], None if changed == every else changed)) if changed else {}
            try:
                prepared = mapping.prepare_remap(state, fds)
            finally:
                close_fds(list(fds.values()))
        except BaseException:
            self.detach(state["leaseId"])
            raise
        return PendingSwitch(fingerprint, state, prepared)

    def finish_switch(self, mapping: Any, pending: "PendingSwitch", replaces: str) -> Dict[str, Any]:
        """Puts ``pending``'s version behind ``mapping``'s addresses (``finish_remap``): the new
        version's get_state reply. What it replaced (the old allocations' imports, then lease
        ``replaces``, the version mapped before) is let go of right after, on this client's
        retirer thread, off the switch's stall; this client's next request waits for it. On a
        failure the new lease is dropped and the mapping still reads the old version under its lease."""
        try:
            mapping.finish_remap(pending.prepared, retire=self._retirer.submit)
        except BaseException:
            self.detach(pending.state["leaseId"])
            raise
        self._retirer.submit(lambda: self._detach_replaced(replaces, pending.fingerprint))
        return pending.state

    def _detach_replaced(self, lease_id: str, switched_to: str) -> None:
        """Drops the lease a switch replaced (run on the retirer's thread), on a connection of its
        own for the request (a map lease is the process's, dropped on any of its connections; this
        client's is its caller's thread's), closed after: the client holds no more descriptors,
        nor the daemon's connection budget, than before."""
        conn = Connection(self.socket_path, timeout=self.conn.timeout)
        try:
            conn.request("detach", leaseId=lease_id)
        except Exception as err:  # noqa: BLE001 - an OSError of the connection too: no caller to raise to
            # The switch is done; the old lease ends with its connection or process, or the daemon's sweep.
            log.warning("weightd: switched to %s, but dropping the old lease failed: %s", switched_to[:12], err)
        finally:
            conn.close()

    def drop_switch(self, mapping: Any, pending: "PendingSwitch") -> None:
        """Gives back what a prepared switch holds: its imports (or staged mappings) and its lease."""
        try:
            mapping.discard(pending.prepared)
        finally:
            self.detach(pending.state["leaseId"])

    def switch(self, mapping: Any, fingerprint: str, fingerprint_fields: Optional[Dict[str, str]], layout: str, replaces: str) -> Any:
        """``prepare_switch`` then ``finish_switch``: the new version's get_state reply, or
        ``Mismatch`` with nothing changed."""
        pending = self.prepare_switch(mapping, fingerprint, fingerprint_fields, layout)
        if isinstance(pending, Mismatch):
            return pending
        return self.finish_switch(mapping, pending, replaces)

    def attach(
        self,
        fingerprint: str,
        fingerprint_fields: Optional[Dict[str, str]] = None,
        device: Optional[int] = None,
        tensor_format: str = "auto",
        layout: str = "checkpoint",
    ) -> Any:
        """Maps the rank zero-copy: ``Attached`` (tensors by name, aliases included) or ``Mismatch``.

        cuda: ``device`` is this process's CUDA ordinal (default torch's current device); its
        UUID must be the daemon's. ``tensor_format``: auto | torch | numpy | memoryview (host).
        ``layout="vllm"``: the tensors by vLLM's parameter names and shapes, if the daemon planned it.
        """
        with _collector_paused():
            state = self._state(fingerprint, "map", fingerprint_fields, layout)
            if isinstance(state, Mismatch):
                return state
            try:
                mapping = self._open(state, device, tensor_format)
            except BaseException:
                self.detach(state["leaseId"])
                raise
        return Attached(state["backend"], state["leaseId"], state, mapping.tensors, self, mapping)

    def copy(
        self,
        fingerprint: str,
        fingerprint_fields: Optional[Dict[str, str]] = None,
        device: Optional[int] = None,
        tensor_format: str = "auto",
        layout: str = "checkpoint",
    ) -> Any:
        """Copies every tensor into this process and drops the lease: a dict, or ``Mismatch``.

        host: owned copies in ``tensor_format``. cuda: with torch, device tensors (clones on this
        process's GPU); without torch, host copies in ``tensor_format``.
        """
        state = self._state(fingerprint, "copy", fingerprint_fields, layout)
        if isinstance(state, Mismatch):
            return state
        try:
            mapping = self._open(state, device, tensor_format)
            try:
                if state["backend"] == "cuda" and not mapping.uses_torch:
                    # No torch: copy to host memory through the driver, viewed like host tensors.
                    from .host import view_maker
                    from .tensors import resolve_format

                    make = view_maker(resolve_format(tensor_format))
                    out = {t["name"]: make(mapping.read(t), {**t, "offset": 0}) for t in state["tensors"]}
                else:
                    out = {t["name"]: _copied(mapping.tensors[t["name"]]) for t in state["tensors"]}
                    if state["backend"] == "cuda":
                        from .cuda import synchronize

                        synchronize(mapping.ordinal)  # the copies must finish before the handles close
                # Aliases stay one object after the copy, as they were before it.
                for alias, target in state["aliases"].items():
                    out[alias] = out[target]
            finally:
                mapping.close()
        finally:
            self.detach(state["leaseId"])
        return out

    def detach(self, lease_id: Optional[str] = None) -> int:
        """Drops a lease (default: every lease taken on this connection). Returns how many."""
        return int(self.conn.request("detach", leaseId=lease_id)["dropped"])

    def detach_elsewhere(self, lease_id: str) -> None:
        """Drops lease ``lease_id`` on a connection of its own, never this client's (which may be
        in the middle of a request: Attached.detach); a failure is logged, as there is no caller
        to raise to. The lease ends with the process otherwise."""
        conn = Connection(self.socket_path, timeout=self.conn.timeout)
        try:
            conn.request("detach", leaseId=lease_id)
        except Exception as err:  # noqa: BLE001 - run from a finalizer
            log.warning("weightd: dropping lease %s after its last view was freed failed: %s", lease_id[:8], err)
        finally:
            conn.close()

    def release(self, force: bool = False) -> Dict[str, Any]:
        """Asks the daemon to free the rank (refused with E_LEASE_HELD while others map it)."""
        return self.conn.request("release", force=force or None)

    def stats(self, fingerprint: Optional[str] = None) -> Dict[str, Any]:
        """The counters and live leases of the version ``fingerprint`` (default: the node's own model)."""
        return self.conn.request("stats", fingerprint=fingerprint)

    def watch(self, model: str, stale: bool = False) -> Dict[str, Any]:
        """Asks to be told, on this connection, when a newer version of ``model`` is ready on this
        device and when a version of it is about to be dropped (``events``); with ``stale``, also
        when one is stale (its checkpoint files changed: ``model_stale``). A watch lives as long
        as the connection: watch again after the daemon restarted."""
        return self.conn.request("watch", model=model, stale=True) if stale else self.conn.request("watch", model=model)

    def begin_update(
        self,
        model: str,
        base: str,
        timeout: float = 300.0,
        tensors: Optional[List[str]] = None,
        device: Optional[int] = None,
        source: str = "staging",
        prepare: bool = False,
    ) -> "Update":
        """A write lease on a new version of ``model`` over version ``base`` (this rank's
        fingerprint), on a connection of its own (weightd_client.update). ``tensors``: the
        tensors to write (default all); only their segments are copied, the rest is shared with the base.
        ``device``: on a cuda rank, the CUDA ordinal of its GPU in this process (default: torch's current one).
        ``source="pull"`` (cuda): no staging; ``Update.pull_from`` names the writer's own GPU tensors.
        ``prepare=True`` (pull): the version's memory is made now, for the segments of ``tensors``
        (all without), so a pull begun while the trainer still computes copies at once."""
        from .update import Update

        return Update(self.socket_path, model, base, timeout, tensors, device, source, prepare)

    def pull_plan(self, model: str, tensors: Dict[str, Any], device: Optional[int] = None, timeout: float = 300.0) -> "PullPlan":
        """Names ``tensors`` (the layout's names to the trainer's CUDA tensors on this rank's GPU)
        to the daemon once, for every pull update of ``model`` after: ``upd.pull_from(plan)``
        (weightd_client.pull.PullPlan). Close it (or use it as a context manager) when done."""
        from .pull import PullPlan

        return PullPlan(self.socket_path, model, tensors, device, timeout)

    def pull_update(self, model: str, base: str, tensors: Dict[str, Any], device: Optional[int] = None, timeout: float = 300.0) -> Dict[str, Any]:
        """A new version of ``model`` over ``base`` whose ``tensors`` (name to a CUDA tensor on this
        rank's GPU) are copied by the daemon straight from the given memory; every other tensor keeps
        the base's bytes. One rank: begin (source "pull"), pull_from, commit; returns the commit's reply.
        The begin names the tensors where their names fit one request, so the daemon makes their
        segments' memory while the request to pull them is on its way (``prepare``)."""
        names = list(tensors)
        fits = 0 < len(names) and len(json.dumps(names)) < MAX_REQUEST_BYTES // 2
        with self.begin_update(model, base, timeout=timeout, device=device, source="pull", tensors=names if fits else None, prepare=fits) as upd:
            upd.pull_from(tensors)
            return upd.commit()

    def events(self, timeout: float = 0.0) -> List[Dict[str, Any]]:
        """The events (``model_ready``, ``model_dropping``, ``lease_revoked``, ``model_stale``) received since the
        last call; with none yet, waits up to ``timeout`` seconds for one (docs/protocol.md, Events)."""
        return self.conn.poll_events(timeout)

    def settle(self) -> None:
        """Waits until what this client's switches replaced is let go of (the old versions'
        imports and leases; each request waits for it too, so only a check from outside the
        client, another process's, needs this)."""
        self._retirer.settle()

    def close(self) -> None:
        self._retirer.settle()
        self.conn.close()

    def __enter__(self) -> "WeightdClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _copied(t: Any) -> Any:
    if hasattr(t, "clone"):  # torch
        return t.clone()
    if hasattr(t, "copy"):  # numpy
        return t.copy()
    if isinstance(t, memoryview):
        owned = memoryview(bytearray(t.tobytes()))
        return owned.cast(t.format) if t.ndim <= 1 else owned.cast(t.format, list(t.shape))
    raise TypeError(f"cannot copy a {type(t).__name__} tensor; install torch")
