"""Host backend: each segment is a memfd sealed read-only by the daemon, received over the socket
(get_segment_fds, SCM_RIGHTS), checked, mapped read-only, and its descriptor closed at once.

Views are torch tensors, numpy arrays or memoryviews, whichever the caller asks for (default:
the richest one installed). None of them copies; all are read-only (numpy marks them so; torch
warns that the buffer is not writable — writing to it would crash the process).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import struct
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

from .protocol import ProtocolError, ServeError
from .columns import check_same_placement
from .prepared_remap import PreparedRemap
from .retire import Retire, run_now
from .tensors import by_name, element_shape, memoryview_format, numpy_dtype, resolve_format, torch_by_name, SegmentViews

# fcntl's names for memfd seals (Python 3.8+ on Linux has them; the values are the kernel's).
F_GET_SEALS = getattr(fcntl, "F_GET_SEALS", 1034)
F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 2)
F_SEAL_GROW = getattr(fcntl, "F_SEAL_GROW", 4)
F_SEAL_WRITE = getattr(fcntl, "F_SEAL_WRITE", 8)
SERVED_SEALS = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW


def _check_segment_fd(segment: int, fd: int, nbytes: int) -> None:
    """Refuses a descriptor that is not a daemon's served segment of at least ``nbytes``."""
    # Unsealed, the bytes could change under the views, or the file shrink under the mapping
    # (SIGBUS on the next read): whoever sent it is not a daemon serving sealed memory.
    try:
        seals = fcntl.fcntl(fd, F_GET_SEALS)
    except OSError as err:
        raise ServeError("E_SHM_OPEN", f"segment {segment}'s descriptor is not a sealable memfd ({err}); refusing to map it") from err
    if seals & SERVED_SEALS != SERVED_SEALS:
        raise ServeError("E_SHM_OPEN", f"segment {segment}'s descriptor is not sealed against write, shrink and grow (seals {seals:#x}); refusing to map it")
    size = os.fstat(fd).st_size
    if size < nbytes:
        raise ServeError("E_SHM_OPEN", f"segment {segment}'s descriptor holds {size} bytes, fewer than its {nbytes}; refusing to map it")


def _map_segment(segment: int, fd: int, nbytes: int) -> mmap.mmap:
    """Maps a received segment read-only; the caller closes ``fd`` (the mapping keeps the pages).

    The mapping is an ``mmap`` object (so views can say when they are gone: see close) whose
    pages are the segment's, moved in by mremap: an ``mmap`` of the descriptor itself would keep a
    duplicate of it open before Python 3.13, and with it the segment's memory after a switch_to
    left it behind."""
    _check_segment_fd(segment, fd, nbytes)
    real = _Mapping.of_fd(fd, nbytes)
    try:
        placeholder = mmap.mmap(-1, nbytes, mmap.MAP_PRIVATE, mmap.PROT_READ)
    except BaseException:
        real.unmap()
        raise
    try:
        real.move_to(_Mapping(_address(placeholder), real.length))
    except BaseException:
        real.unmap()
        placeholder.close()
        raise
    return placeholder


class _Mapping:
    """A range of this process's address space, moved whole with mremap (libc through ctypes:
    Python's mmap cannot map at a given address)."""

    _libc: Any = None

    def __init__(self, address: int, length: int):
        self.address, self.length = address, length

    @classmethod
    def libc(cls) -> Any:
        if cls._libc is None:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
            libc.mmap.restype = ctypes.c_void_p
            libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
            libc.mremap.restype = ctypes.c_void_p
            cls._libc = libc
        return cls._libc

    @staticmethod
    def _failed(call: str) -> OSError:
        err = ctypes.get_errno()
        return (PermissionError if err in (errno.EPERM, errno.EACCES) else OSError)(err, f"{call}: {os.strerror(err)}")

    @classmethod
    def of_fd(cls, fd: int, nbytes: int) -> "_Mapping":
        """``fd`` mapped shared and read-only somewhere, in whole pages."""
        length = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
        address = cls.libc().mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address not in (None, _MAP_FAILED):
            return cls(address, length)
        failure = cls._failed("mmap")
        if not isinstance(failure, PermissionError):
            raise failure
        # Kernels before 6.7 refuse a shared mapping of a write-sealed memfd through a descriptor
        # open for writing; one opened read-only maps the same pages.
        readonly = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            address = cls.libc().mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, readonly, 0)
            if address in (None, _MAP_FAILED):
                raise cls._failed("mmap")
            return cls(address, length)
        finally:
            os.close(readonly)

    def alias(self) -> "_Mapping":
        """A second mapping of these (shared) pages elsewhere: what a switch puts back on failure."""
        address = self.libc().mremap(self.address, 0, self.length, _MREMAP_MAYMOVE, None)
        if address in (None, _MAP_FAILED):
            raise self._failed("mremap (alias)")
        return _Mapping(address, self.length)

    def move_to(self, there: "_Mapping") -> "_Mapping":
        """Moves these pages to ``there``'s address in one mremap, replacing what was mapped there
        with no moment in which the range is unmapped, so no other thread's mmap can land in it;
        this range is unmapped after. On failure the kernel may have unmapped ``there`` already
        (it does so before moving): the caller puts something back. Returns ``there``."""
        if self.libc().mremap(self.address, self.length, there.length, _MREMAP_MAYMOVE | _MREMAP_FIXED, there.address) in (None, _MAP_FAILED):
            raise self._failed("mremap")
        return there

    def unmap(self) -> None:
        self.libc().munmap(self.address, self.length)


_MAP_FAILED = ctypes.c_void_p(-1).value
_MREMAP_MAYMOVE, _MREMAP_FIXED = 1, 2


class _PyBuffer(ctypes.Structure):
    # CPython's Py_buffer (the buffer protocol's view), to read a read-only mapping's address.
    _fields_ = [
        ("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t), ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int), ("ndim", ctypes.c_int), ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p), ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p),
    ]


def _address(obj: Any) -> int:
    """Where a buffer (an mmap) starts in this process."""
    view = _PyBuffer()
    get, release = ctypes.pythonapi.PyObject_GetBuffer, ctypes.pythonapi.PyBuffer_Release
    get.argtypes, release.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int], [ctypes.POINTER(_PyBuffer)]
    if get(obj, ctypes.byref(view), 0) != 0:
        raise ServeError("E_SHM_OPEN", "cannot read a segment mapping's address")
    try:
        return view.buf
    finally:
        release(ctypes.byref(view))


def view_maker(fmt: str) -> Callable[[Any, Dict[str, Any]], Any]:
    """Builds zero-copy views of tensors in a buffer (a mapping, or a host copy), per format.

    For torch the buffer may be the ``segment_views`` of a mapping, made once for all the tensors
    in it (see SegmentViews: per tensor, a tensor made from the buffer is most of an attach)."""
    if fmt == "torch":

        def make(buf: Any, t: Dict[str, Any]) -> Any:
            return (buf if isinstance(buf, SegmentViews) else segment_views(buf)).view(t)

        return make
    if fmt == "numpy":
        import numpy as np

        def make(mm: Any, t: Dict[str, Any]) -> Any:
            dt = np.dtype(numpy_dtype(t["dtype"]))
            arr = np.frombuffer(mm, dtype=dt, count=t["bytes"] // dt.itemsize, offset=t["offset"])
            return arr.reshape(element_shape(t, dt.itemsize))

        return make

    def make(mm: Any, t: Dict[str, Any]) -> Any:
        view = memoryview(mm)[t["offset"]: t["offset"] + t["bytes"]]
        code = memoryview_format(t["dtype"])
        shape = element_shape(t, struct.calcsize(code))
        # memoryview.cast takes no empty or zero-sized shapes: those stay flat.
        if shape and all(shape):
            return view.cast(code, shape)
        return view.cast(code)

    return make


def _torch_bytes(buf: Any) -> Any:
    """A read-only buffer as one torch uint8 tensor, no copy."""
    import torch

    if not len(buf):
        return torch.empty(0, dtype=torch.uint8)
    with warnings.catch_warnings():
        # Read-only on purpose: these bytes are shared with every other client.
        warnings.filterwarnings("ignore", message=".*not writable.*")
        # Through a memoryview: torch keeps the object it is given but not its buffer export,
        # and a view must keep the mapping from closing (see HostMapping.close).
        return torch.frombuffer(memoryview(buf), dtype=torch.uint8)


def segment_views(buf: Any) -> SegmentViews:
    """A read-only buffer's tensors as torch views of one byte tensor over it."""
    return SegmentViews(_torch_bytes(buf), lambda t: _torch_bytes(memoryview(buf)[t["offset"] : t["offset"] + t["bytes"]]))


class HostMapping:
    """The mapped segments of one attach; ``close()`` unmaps them once no view is left.

    ``fds``: segment number -> its descriptor (get_segment_fds); every one is closed here,
    mapped or not, whatever fails."""

    #: Every segment is mapped PROT_READ: a write through a view faults (SIGSEGV), and the
    #: daemon's memfds are sealed against writes besides.
    read_only = True

    def __init__(self, state: Dict[str, Any], fds: Dict[int, int], tensor_format: str = "auto"):
        self.state = state
        self._closed = False
        #: What the last remap did: segments remapped and skipped, seconds (None before any).
        self.last_switch: Optional[Dict[str, Any]] = None
        self.maps: Dict[int, mmap.mmap] = {}
        self.tensors: Dict[str, Any] = {}
        try:
            for seg in state["segments"]:
                fd = fds.get(seg["segment"])
                if fd is None:
                    raise ProtocolError("E_BAD_MANIFEST", f"the daemon sent no descriptor for segment {seg['segment']}")
                self.maps[seg["segment"]] = _map_segment(seg["segment"], fd, seg["bytes"])
            for fd in fds.values():
                os.close(fd)
            fds.clear()
            fmt = resolve_format(tensor_format)
            if fmt == "torch":
                # Each segment's mapping as one byte tensor, of which every tensor is a view.
                bufs = {k: segment_views(mm) for k, mm in self.maps.items()}

                def views_of(segment: int) -> SegmentViews:
                    if segment not in bufs:
                        raise ProtocolError("E_BAD_MANIFEST", f"a tensor lies in segment {segment}, which the manifest does not list")
                    return bufs[segment]

                self.tensors = torch_by_name(state, views_of)
            else:
                make = view_maker(fmt)

                def view(t: Dict[str, Any]) -> Any:
                    mm = self.maps.get(t["segment"])
                    if mm is None or t["offset"] + t["bytes"] > len(mm):
                        raise ProtocolError("E_BAD_MANIFEST", f"tensor {t['name']} lies outside its segment {t['segment']}")
                    return make(mm, t)

                self.tensors = by_name(state, view)
        except BaseException:
            for fd in fds.values():
                os.close(fd)
            fds.clear()
            self.close()
            raise

    def changed_segments(self, state: Dict[str, Any]) -> List[int]:
        """The segments of ``state`` (another version's get_state reply) whose memory is not the
        memfd this maps there (each segment's ``memory``, its inode: a version sharing a segment
        with its base names the base's, and this mapping keeps that inode alive, so no other
        memfd can have it meanwhile). A segment without a name, on either side, counts as changed."""
        mapped = {seg["segment"]: seg.get("memory") for seg in self.state["segments"]}
        return [seg["segment"] for seg in state["segments"] if seg.get("memory") is None or mapped.get(seg["segment"]) != seg["memory"]]

    def prepare_remap(self, state: Dict[str, Any], fds: Dict[int, int]) -> "PreparedRemap":
        """Step one of ``remap``: checks that ``state`` places every tensor exactly where this
        mapping does and maps each segment that changes (``changed_segments``) aside; the others
        stay as they are and need no descriptor. The views still read this version. ``fds``: the
        changed segments' descriptors at least (the caller closes them). Pass the result to
        ``finish_remap``, or ``discard()`` it."""
        if self._closed:
            raise ServeError("E_CLOSED", "this mapping is closed; attach again instead of remapping it")
        check_same_placement(self.state, state, ServeError)
        changed = [n for n in self.changed_segments(state) if n in self.maps]
        missing = sorted(set(changed) - set(fds))
        if missing:
            raise ServeError("E_NO_SEGMENT_FDS", f"segment(s) {missing} have no descriptor; pass get_segment_fds' reply for the new lease")
        sizes = {seg["segment"]: int(seg["bytes"]) for seg in state["segments"]}
        prepared = PreparedRemap(self, state, len(self.maps) - len(changed))
        try:
            for n in changed:
                _check_segment_fd(n, fds[n], sizes[n])
                prepared.held[n] = _Mapping.of_fd(fds[n], sizes[n])
        except BaseException as err:
            self.discard(prepared)
            if isinstance(err, OSError):
                raise ServeError("E_SHM_OPEN", f"cannot map the new version's segments ({err}); the views still read the old version") from err
            raise
        return prepared

    def finish_remap(self, prepared: "PreparedRemap", retire: Optional[Retire] = None) -> Dict[str, Any]:
        """Step two of ``remap``: moves each staged segment over the old one in one mremap, so
        every view reads the new bytes at the same address and is never left over a hole. All
        or nothing: the old pages are kept (a second mapping of them) until every segment
        moved, and put back on a failure; then unmapped, by ``retire`` when given (on the
        client's thread for it, as cuda.py's releases), else before it returns. Returns what
        it did: segments remapped and skipped, seconds."""
        if prepared.mapping is not self or prepared.against is not self.state or self._closed:
            self.discard(prepared)
            raise ServeError("E_SWITCH_STALE", "this mapping switched or closed since the switch was prepared (or it is another's); prepare it again")
        started = time.perf_counter()
        staged = prepared.held
        kept: Dict[int, Tuple[_Mapping, _Mapping]] = {}  # segment -> (its address range, the old pages' alias)
        remapped = sorted(staged)
        try:
            for n in remapped:
                here = _Mapping(_address(self.maps[n]), staged[n].length)
                kept[n] = (here, here.alias())
                staged[n].move_to(here)
                del staged[n]
        except BaseException as err:
            undone = self._undo(kept, staged)
            staged.clear()
            if isinstance(err, OSError):
                state_now = "the views still read the old version" if undone else "the views are not usable: detach"
                raise ServeError("E_SHM_OPEN", f"cannot map the new version's segments in place ({err}); {state_now}") from err
            raise
        self.state = prepared.state
        self.last_switch = {"remapped": remapped, "skipped": prepared.skipped, "seconds": time.perf_counter() - started}
        aliases = [old for _, old in kept.values()]

        def unmap_old() -> None:
            for old in aliases:
                old.unmap()

        (retire or run_now)(unmap_old)
        return self.last_switch

    def remap(self, state: Dict[str, Any], fds: Dict[int, int]) -> Dict[str, Any]:
        """Puts another served version's segments behind this mapping's addresses, in place:
        ``prepare_remap`` then ``finish_remap`` (each says what it does)."""
        return self.finish_remap(self.prepare_remap(state, fds))

    @staticmethod
    def discard(prepared: "PreparedRemap") -> None:
        """Unmaps what ``prepared`` mapped aside (a switch that will not happen); idempotent."""
        for m in prepared.held.values():
            m.unmap()
        prepared.held.clear()

    @staticmethod
    def _undo(kept: Dict[int, Tuple["_Mapping", "_Mapping"]], staged: Dict[int, "_Mapping"]) -> bool:
        """Puts every segment's old pages back at its address (also the one whose move failed:
        the kernel may have unmapped it) and unmaps what was staged; whether all of it worked."""
        ok = True
        for here, old in kept.values():
            try:
                old.move_to(here)
            except OSError:
                ok = False
        for m in staged.values():
            m.unmap()
        return ok

    def close(self, then: Optional[Callable[[], None]] = None) -> None:
        """Unmaps every segment no view references, then runs ``then`` (the lease's end) at once:
        a mapped page outlives the segment's release, so no view can fault."""
        self._closed = True
        try:
            self._unmap()
        finally:
            if then is not None:
                then()

    def _unmap(self) -> None:
        self.tensors = {}  # our own references to the views, so an unused mapping can close
        for key, mm in list(self.maps.items()):
            try:
                mm.close()
                del self.maps[key]
            except BufferError:
                # Views still reference it: the mapping ends when the last of them is freed. The
                # bytes stay valid meanwhile (a released segment's pages live while mapped).
                pass
