"""Host backend: each segment is a memfd sealed read-only by the daemon, received over the socket
(get_segment_fds, SCM_RIGHTS), checked, mapped read-only, and its descriptor closed at once.

Views are torch tensors, numpy arrays or memoryviews, whichever the caller asks for (default:
the richest one installed). None of them copies; all are read-only (numpy marks them so; torch
warns that the buffer is not writable — writing to it would crash the process).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import sys
import warnings
from typing import Any, Callable, Dict, List, Optional

from .protocol import ProtocolError, ServeError
from .tensors import by_name, element_shape, memoryview_format, numpy_dtype, resolve_format, torch_by_name, SegmentViews

# fcntl's names for memfd seals (Python 3.8+ on Linux has them; the values are the kernel's).
F_GET_SEALS = getattr(fcntl, "F_GET_SEALS", 1034)
F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 2)
F_SEAL_GROW = getattr(fcntl, "F_SEAL_GROW", 4)
F_SEAL_WRITE = getattr(fcntl, "F_SEAL_WRITE", 8)
SERVED_SEALS = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW


def _map_segment(segment: int, fd: int, nbytes: int) -> mmap.mmap:
    """Maps a received segment read-only; the caller closes ``fd`` (the mapping keeps the pages)."""
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
    # CPython's mmap keeps a dup of the descriptor for as long as it maps, unless told not to (3.13+).
    untracked: Dict[str, Any] = {"trackfd": False} if sys.version_info >= (3, 13) else {}
    try:
        return mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ, **untracked)
    except PermissionError:
        # Kernels before 6.7 refuse a shared mapping of a write-sealed memfd opened read-write; a
        # private read-only one maps the same pages, with no copy, since nothing can write them.
        return mmap.mmap(fd, nbytes, mmap.MAP_PRIVATE, mmap.PROT_READ, **untracked)


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

    def close(self, then: Optional[Callable[[], None]] = None) -> None:
        """Unmaps every segment no view references, then runs ``then`` (the lease's end) at once:
        a mapped page outlives the segment's release, so no view can fault."""
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
