"""Host backend: each segment is a 0600 shared-memory file of the daemon's user, mapped read-only.

Views are torch tensors, numpy arrays or memoryviews, whichever the caller asks for (default:
the richest one installed). None of them copies; all are read-only (numpy marks them so; torch
warns that the buffer is not writable — writing to it would crash the process).
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
import warnings
from typing import Any, Callable, Dict, List, Optional

from .protocol import ProtocolError, ServeError
from .tensors import by_name, numpy_dtype, resolve_format, torch_dtype, MEMORYVIEW_FORMAT


def _map_segment(path: str, nbytes: int) -> mmap.mmap:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise ServeError("E_SHM_OPEN", f"cannot open shared segment {path}: {err}; the daemon may have released it: ask for the state again") from err
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size < nbytes:
            raise ServeError("E_SHM_OPEN", f"shared segment {path} is not a file of {nbytes} bytes owned by this user; refusing to map it")
        return mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)  # the mapping keeps the pages


def _shape(t: Dict[str, Any], itemsize: int) -> Optional[List[int]]:
    """The tensor's shape, or None when elements are not whole items (packed F4/F6: flat bytes)."""
    n = 1
    for d in t["shape"]:
        n *= d
    return list(t["shape"]) if n * itemsize == t["bytes"] else None


def view_maker(fmt: str) -> Callable[[Any, Dict[str, Any]], Any]:
    """Builds zero-copy views of tensors in a buffer (a mapping, or a host copy), per format."""
    if fmt == "torch":
        import torch

        def make(mm: Any, t: Dict[str, Any]) -> Any:
            dtype = torch_dtype(t["dtype"])
            if t["bytes"] == 0:
                return torch.empty(t["shape"], dtype=dtype)
            with warnings.catch_warnings():
                # Read-only on purpose: these bytes are shared with every other client.
                warnings.filterwarnings("ignore", message=".*not writable.*")
                # Through a memoryview: torch keeps the object it is given but not its buffer
                # export, and a view must keep the mapping from closing (see HostMapping.close).
                raw = torch.frombuffer(memoryview(mm), dtype=torch.uint8, count=t["bytes"], offset=t["offset"])
            shape = _shape(t, dtype.itemsize)
            return raw.view(dtype).reshape(shape if shape is not None else [-1])

        return make
    if fmt == "numpy":
        import numpy as np

        def make(mm: Any, t: Dict[str, Any]) -> Any:
            dt = np.dtype(numpy_dtype(t["dtype"]))
            arr = np.frombuffer(mm, dtype=dt, count=t["bytes"] // dt.itemsize, offset=t["offset"])
            shape = _shape(t, dt.itemsize)
            return arr.reshape(shape) if shape is not None else arr

        return make

    def make(mm: Any, t: Dict[str, Any]) -> Any:
        view = memoryview(mm)[t["offset"]: t["offset"] + t["bytes"]]
        code = MEMORYVIEW_FORMAT.get(t["dtype"], "B")
        shape = _shape(t, struct.calcsize(code))
        # memoryview.cast takes no empty or zero-sized shapes: those stay flat.
        if shape and all(shape):
            return view.cast(code, shape)
        return view.cast(code)

    return make


class HostMapping:
    """The mapped segments of one attach; ``close()`` unmaps them once no view is left."""

    def __init__(self, state: Dict[str, Any], tensor_format: str = "auto"):
        self.maps: Dict[int, mmap.mmap] = {}
        self.tensors: Dict[str, Any] = {}
        try:
            for seg in state["segments"]:
                self.maps[seg["segment"]] = _map_segment(seg["handle"], seg["bytes"])
            make = view_maker(resolve_format(tensor_format))

            def view(t: Dict[str, Any]) -> Any:
                mm = self.maps.get(t["segment"])
                if mm is None or t["offset"] + t["bytes"] > len(mm):
                    raise ProtocolError("E_BAD_MANIFEST", f"tensor {t['name']} lies outside its segment {t['segment']}")
                return make(mm, t)

            self.tensors = by_name(state, view)
        except BaseException:
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
