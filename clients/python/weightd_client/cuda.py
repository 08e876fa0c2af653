"""CUDA backend: opens the daemon's per-segment handles with the driver API (ctypes over
libcuda.so.1, no CUDA toolkit or torch needed to open them) and builds zero-copy tensors.

One handle per segment, not per tensor: attach time does not grow with the tensor count. A
segment's handle is either a legacy ``CUipcMemHandle`` (64 bytes, base64 on the wire) or
``"cuda-fd"`` (a daemon run with ``--cuda-handles fd``): VMM memory whose POSIX descriptor comes
over the socket (get_segment_fds) and is imported with cuMemImportFromShareableHandle, then mapped
in one address range reserved for all of an attach's segments, side by side (docs/protocol.md). Both are opened in the device's primary
context, the one PyTorch's runtime uses, so the tensors live in torch's own context.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import logging
import threading
import time
import uuid as uuidlib
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional

from .protocol import WeightdError
from .columns import check_same_placement, same_uuid
from .prepared_remap import PreparedRemap
from .retire import Retire, run_now
from .tensors import SegmentViews, by_name, torch_by_name

CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1
CUDA_FD_HANDLE = "cuda-fd"
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1
CU_MEM_ALLOCATION_TYPE_PINNED = 0x1
CU_MEM_LOCATION_TYPE_DEVICE = 0x1
CU_MEM_ACCESS_FLAGS_PROT_READ = 0x1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3
CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0
# The daemon gives every segment whole 2 MiB pages (native/cuda_vmm.h); a client maps as much.
_LARGE_PAGE = 2 << 20

log = logging.getLogger("weightd_client")

# __cuda_array_interface__ typestrs of the dtypes that have one; others are exposed as raw bytes.
_TYPESTR = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "U64": "<u8", "I32": "<i4", "U32": "<u4",
    "I16": "<i2", "U16": "<u2", "I8": "|i1", "U8": "|u1", "BOOL": "|b1", "C64": "<c8",
}


@contextlib.contextmanager
def context_current(d: "_Driver", ctx: Any) -> Iterator[None]:
    """``ctx`` current on this thread for the block. Whatever was made current meanwhile (torch's
    runtime sets the device's primary context), the pop leaves the caller's context on top again."""
    d.check(d.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
    try:
        yield
    finally:
        d.check(d.cuCtxPopCurrent(ctypes.byref(ctypes.c_void_p())), "cuCtxPopCurrent")


class CudaError(WeightdError):
    """A CUDA driver call failed; the message names the call and the driver's error."""


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


# cuda.h's CUmemLocation, CUmemAllocationProp and CUmemAccessDesc (the union of CUmemLocation
# is its int id here: weightd names devices only).
class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocProp(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _MemLocation),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _MemLocation), ("flags", ctypes.c_int)]


_read_write_said = False


def _warn_read_write(d: "_Driver", rc: int) -> None:
    global _read_write_said
    if _read_write_said:
        return
    _read_write_said = True
    name = ctypes.c_char_p()
    d.cuGetErrorName(rc, ctypes.byref(name))
    log.warning(
        "weightd: this CUDA driver refuses read-only device mappings (cuMemSetAccess with CU_MEM_ACCESS_FLAGS_PROT_READ: %s); "
        "segments are mapped read-write, so only the engine's own care keeps the daemon's memory unwritten",
        (name.value or b"?").decode(),
    )


class _Driver:
    _lock = threading.Lock()
    _instance: Optional["_Driver"] = None

    @classmethod
    def get(cls) -> "_Driver":
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as err:
            raise CudaError("E_NO_CUDA", f"cannot load the CUDA driver (libcuda.so.1): {err}; this process needs an NVIDIA driver to map a cuda rank") from err
        lib = self.lib
        p, i, u = ctypes.POINTER, ctypes.c_int, ctypes.c_uint
        self._fn("cuInit", [u])
        self._fn("cuDeviceGet", [p(i), i])
        self._fn("cuDeviceGetUuid", [ctypes.c_char * 16, i], name="cuDeviceGetUuid_v2", fallback="cuDeviceGetUuid")
        self._fn("cuDevicePrimaryCtxRetain", [p(ctypes.c_void_p), i])
        self._fn("cuDevicePrimaryCtxRelease", [i], name="cuDevicePrimaryCtxRelease_v2", fallback="cuDevicePrimaryCtxRelease")
        self._fn("cuCtxPushCurrent", [ctypes.c_void_p], name="cuCtxPushCurrent_v2", fallback="cuCtxPushCurrent")
        self._fn("cuCtxPopCurrent", [p(ctypes.c_void_p)], name="cuCtxPopCurrent_v2", fallback="cuCtxPopCurrent")
        self._fn("cuIpcOpenMemHandle", [p(ctypes.c_uint64), _IpcHandle, u], name="cuIpcOpenMemHandle_v2", fallback="cuIpcOpenMemHandle")
        self._fn("cuIpcCloseMemHandle", [ctypes.c_uint64])
        # A writer's pull (weightd_client.update): the handle of the cudaMalloc allocation holding a tensor.
        self._fn("cuIpcGetMemHandle", [p(_IpcHandle), ctypes.c_uint64])
        self._fn("cuMemGetAddressRange", [p(ctypes.c_uint64), p(ctypes.c_size_t), ctypes.c_uint64], name="cuMemGetAddressRange_v2", fallback="cuMemGetAddressRange")
        self._fn("cuMemcpyDtoH", [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t], name="cuMemcpyDtoH_v2", fallback="cuMemcpyDtoH")
        self._fn("cuMemcpyHtoD", [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t], name="cuMemcpyHtoD_v2", fallback="cuMemcpyHtoD")
        # Virtual memory, for "cuda-fd" segments (every driver since CUDA 10.2 has these).
        u64, size = ctypes.c_uint64, ctypes.c_size_t
        self._fn("cuMemGetAllocationGranularity", [p(size), p(_AllocProp), i])
        self._fn("cuMemImportFromShareableHandle", [p(u64), ctypes.c_void_p, i])
        self._fn("cuMemAddressReserve", [p(u64), size, size, u64, ctypes.c_ulonglong])
        self._fn("cuMemMap", [u64, size, size, u64, ctypes.c_ulonglong])
        self._fn("cuMemSetAccess", [u64, size, p(_AccessDesc), size])
        self._fn("cuMemUnmap", [u64, size])
        self._fn("cuMemAddressFree", [u64, size])
        self._fn("cuMemRelease", [u64])
        self._fn("cuCtxSynchronize", [])
        self._fn("cuGetErrorName", [i, p(ctypes.c_char_p)])
        self._fn("cuGetErrorString", [i, p(ctypes.c_char_p)])
        self.check(lib.cuInit(0), "cuInit")

    def _fn(self, attr: str, argtypes: list, name: Optional[str] = None, fallback: Optional[str] = None) -> None:
        f = getattr(self.lib, name or attr, None) or (getattr(self.lib, fallback, None) if fallback else None)
        if f is None:
            raise CudaError("E_NO_CUDA", f"the CUDA driver lacks {name or attr}; update the NVIDIA driver")
        f.argtypes = argtypes
        f.restype = ctypes.c_int
        setattr(self, attr, f)

    def check(self, rc: int, call: str) -> None:
        if rc == 0:
            return
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        self.cuGetErrorName(rc, ctypes.byref(name))
        self.cuGetErrorString(rc, ctypes.byref(text))
        raise CudaError(
            "E_CUDA",
            f"{call} failed: {(name.value or b'?').decode()} ({rc}): {(text.value or b'').decode()}",
            {"call": call, "result": rc},
        )

    def device(self, ordinal: int) -> int:
        dev = ctypes.c_int()
        self.check(self.cuDeviceGet(ctypes.byref(dev), ordinal), f"cuDeviceGet({ordinal})")
        return dev.value

    def device_uuid(self, dev: int) -> str:
        raw = (ctypes.c_char * 16)()
        self.check(self.cuDeviceGetUuid(raw, dev), "cuDeviceGetUuid")
        return "GPU-" + str(uuidlib.UUID(bytes=bytes(raw)))


def _grant_access(d: "_Driver", dev: int, pointer: int, size: int, writable: bool, what: str) -> bool:
    """Makes [pointer, pointer + size) (one mapping, or several contiguous ones: the driver takes
    any fully mapped range) accessible to device ``dev``: read-only, so that no kernel of this
    process can write into memory every other client maps (a write faults here instead of
    corrupting them), unless ``writable`` (a writer's staging, which no reader maps). A driver
    that refuses read-only device mappings gets read-write, said once in the log. Returns whether
    the range is read-only."""
    location = _MemLocation(CU_MEM_LOCATION_TYPE_DEVICE, dev)
    if not writable:
        access = _AccessDesc(location=location, flags=CU_MEM_ACCESS_FLAGS_PROT_READ)
        rc = d.cuMemSetAccess(pointer, size, ctypes.byref(access), 1)
        if rc == 0:
            return True
        _warn_read_write(d, rc)
    read_write = _AccessDesc(location=location, flags=CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    d.check(d.cuMemSetAccess(pointer, size, ctypes.byref(read_write), 1), f"cuMemSetAccess({what})")
    return False


class FdSegment:
    """One "cuda-fd" segment mapped in this process: the imported allocation and its mapping at
    ``pointer``, ``size`` bytes of an address range its caller reserved (open_fd_segments: one
    range for all the segments of a mapping, so that segments next to each other can be given
    access in one call). ``close()`` unmaps and releases; the address range stays the caller's."""

    def __init__(self, driver: "_Driver", dev: int, fd: int, pointer: int, size: int, segment: int, writable: bool = False, access: bool = True):
        """Imports ``fd`` and maps it at ``pointer``; ``access``: also makes it accessible (else the
        caller does, for several segments at once). A failure gives back what was done."""
        self.driver, self.segment, self.dev, self.writable = driver, segment, dev, writable
        self.pointer, self.size = pointer, size
        self.handle: Optional[int] = None
        self.mapped = False
        self.read_only = False
        try:
            self.handle = self.import_handle(fd)
            # A descriptor of less memory than the manifest says fails here.
            driver.check(driver.cuMemMap(self.pointer, self.size, 0, self.handle, 0), f"cuMemMap(segment {segment}, {self.size} bytes)")
            self.mapped = True
            if access:
                self.read_only = _grant_access(driver, dev, self.pointer, self.size, writable, f"segment {segment}")
        except BaseException:
            with contextlib.suppress(CudaError):  # the failure that stopped the open is the one to report
                self.close()
            raise

    def import_handle(self, fd: int) -> int:
        """Imports an allocation for this segment (also step one of ``swap``): its handle, to
        ``swap`` in or ``release``. A descriptor of less memory than this range maps fails at map."""
        d, handle = self.driver, ctypes.c_uint64()
        # The descriptor goes by value in the pointer-sized parameter (the driver's convention).
        d.check(d.cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), f"cuMemImportFromShareableHandle(segment {self.segment}, fd {fd})")
        return handle.value

    def release(self, handle: int) -> None:
        self.driver.check(self.driver.cuMemRelease(handle), f"cuMemRelease(segment {self.segment})")

    def swap(self, handle: int) -> int:
        """Maps ``handle`` at this segment's address range in place of the current allocation and
        returns the one it replaced (still imported: ``release`` it, or ``swap`` it back). Every
        pointer into the range stays valid, so views and captured CUDA graphs read the new bytes.
        The new mapping has no access yet: the caller grants it (``_grant_access``), for a run of
        segments at once. The caller has synchronized: nothing may run on the range meanwhile. On
        failure the old allocation is mapped again, with access, and the new one is still the caller's."""
        d, old = self.driver, self.handle
        assert old is not None and self.mapped
        d.check(d.cuMemUnmap(self.pointer, self.size), f"cuMemUnmap(segment {self.segment})")
        self.mapped = False
        try:
            d.check(d.cuMemMap(self.pointer, self.size, 0, handle, 0), f"cuMemMap(segment {self.segment}, {self.size} bytes)")
        except CudaError:
            d.check(d.cuMemMap(self.pointer, self.size, 0, old, 0), f"cuMemMap(segment {self.segment}, back to its allocation)")
            self.mapped = True
            self.read_only = _grant_access(d, self.dev, self.pointer, self.size, self.writable, f"segment {self.segment}")
            raise
        self.mapped, self.handle = True, handle
        return old

    def close(self) -> None:
        """Unmaps and releases the import; raises the first failure after trying both."""
        d, seg = self.driver, self.segment
        mapped, handle = self.mapped, self.handle
        self.mapped, self.handle = False, None  # a second close() does nothing
        failures: List[BaseException] = []
        if mapped:
            try:
                d.check(d.cuMemUnmap(self.pointer, self.size), f"cuMemUnmap(segment {seg})")
            except CudaError as err:
                failures.append(err)
        if handle is not None:
            try:
                d.check(d.cuMemRelease(handle), f"cuMemRelease(segment {seg})")
            except CudaError as err:
                failures.append(err)
        if failures:
            raise failures[0]


def contiguous_runs(segments: List[FdSegment]) -> List[List[FdSegment]]:
    """``segments`` grouped into runs that lie next to each other in the address space, in address order."""
    runs: List[List[FdSegment]] = []
    for seg in sorted(segments, key=lambda s: s.pointer):
        if runs and runs[-1][-1].pointer + runs[-1][-1].size == seg.pointer:
            runs[-1].append(seg)
        else:
            runs.append([seg])
    return runs


def grant_runs(segments: List[FdSegment]) -> None:
    """Gives ``segments`` (mapped, of one device and one mode) access: one cuMemSetAccess per run
    of contiguous ones."""
    for run in contiguous_runs(segments):
        first = run[0]
        what = f"segment {first.segment}" if len(run) == 1 else f"segments {run[0].segment}-{run[-1].segment}"
        read_only = _grant_access(first.driver, first.dev, first.pointer, sum(s.size for s in run), first.writable, what)
        for seg in run:
            seg.read_only = read_only


class FdRange:
    """The address range reserved for every "cuda-fd" segment of one mapping, in segment order,
    each at a multiple of the allocation granularity (2 MiB at least: the daemon gives every
    segment whole large pages, native/cuda_vmm.h), so that neighbours are contiguous."""

    def __init__(self, driver: "_Driver", dev: int, sizes: List[int]):
        self.driver = driver
        prop = _AllocProp(type=CU_MEM_ALLOCATION_TYPE_PINNED, requestedHandleTypes=CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, location=_MemLocation(CU_MEM_LOCATION_TYPE_DEVICE, dev))
        gran = ctypes.c_size_t()
        driver.check(driver.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity")
        unit = max(_LARGE_PAGE, gran.value)
        self.sizes = [(n + unit - 1) // unit * unit for n in sizes]
        self.size = sum(self.sizes)
        ptr = ctypes.c_uint64()
        driver.check(driver.cuMemAddressReserve(ctypes.byref(ptr), self.size, unit, 0, 0), f"cuMemAddressReserve({self.size} bytes)")
        self.pointer = ptr.value

    def offsets(self) -> List[int]:
        out, at = [], self.pointer
        for size in self.sizes:
            out.append(at)
            at += size
        return out

    def free(self) -> None:
        pointer, self.pointer = self.pointer, 0
        if pointer:
            self.driver.check(self.driver.cuMemAddressFree(pointer, self.size), "cuMemAddressFree")


def open_fd_segments(fds: List[int], segments: List[Dict[str, Any]], device: int, writable: bool = False) -> "tuple[FdRange, Dict[int, FdSegment]]":
    """Maps "cuda-fd" segments on CUdevice ``device`` side by side in one reserved range:
    ``fds[i]`` is ``segments[i]``'s descriptor (get_segment_fds' order). Needs the device's
    context current. The fds stay the caller's: close them after (the mappings hold the memory).
    The caller closes the segments, then frees the range. A failure gives back all of it."""
    if len(fds) != len(segments):
        raise CudaError("E_BAD_MANIFEST", f"{len(fds)} descriptor(s) came for {len(segments)} cuda-fd segment(s); the daemon must send one per segment")
    d = _Driver.get()
    reserved = FdRange(d, device, [int(seg["bytes"]) for seg in segments])
    opened: Dict[int, FdSegment] = {}
    try:
        for fd, seg, at, size in zip(fds, segments, reserved.offsets(), reserved.sizes):
            opened[seg["segment"]] = FdSegment(d, device, fd, at, size, seg["segment"], writable, access=False)
        grant_runs(list(opened.values()))
    except BaseException:
        with contextlib.suppress(CudaError):
            for s in opened.values():
                s.close()
            reserved.free()
        raise
    return reserved, opened


class CudaBuffer:
    """Device memory described by ``__cuda_array_interface__`` (consumable by torch, CuPy, Numba)."""

    def __init__(self, pointer: int, nbytes: int, dtype: str, shape: list, raw: bool = False):
        self.pointer, self.nbytes, self.dtype, self.shape = pointer, nbytes, dtype, shape
        typestr = None if raw else _TYPESTR.get(dtype)
        self.__cuda_array_interface__ = {
            "version": 2,
            # Writable as far as consumers know (torch refuses read-only CAI), but the memory is
            # shared with every client of this rank: never write to it.
            "data": (pointer, False),
            "shape": tuple(shape) if typestr else (nbytes,),
            "typestr": typestr or "|u1",
            "strides": None,
        }


class CudaMapping:
    """The opened segments of one attach; ``close()`` closes every IPC handle (idempotent) once
    no view of them is left.

    A tensor over an IPC pointer that is closed faults on its next use, and the fault is sticky:
    the CUDA context (torch's, for the whole process) is lost. So a view left alive (a model not
    yet dropped, a traceback's locals) defers the close until the last one is freed; torch and
    CuPy keep the ``CudaBuffer`` they were made from, which is what is counted.

    Every driver call runs with the device's primary context pushed and popped again, so the
    caller's current context (torch's, another library's, or none) is the same afterwards.
    """

    def __init__(self, state: Dict[str, Any], device: Optional[int] = None, tensor_format: str = "auto", segment_fds: Optional[Dict[int, int]] = None, writable: bool = False):
        """``segment_fds``: for a rank served with ``--cuda-handles fd``, each "cuda-fd" segment's
        descriptor by segment number (get_segment_fds' reply); the caller closes them after.
        ``writable``: map them read-write (a writer's staging allocations, weightd_client.update)."""
        self.driver = _Driver.get()
        self.ordinal = device if device is not None else _current_torch_device()
        d = self.driver
        self.dev = d.device(self.ordinal)
        mine = d.device_uuid(self.dev)
        theirs = state["device"]["uuid"]
        if not same_uuid(mine, theirs):
            raise CudaError(
                "E_DEVICE_MISMATCH",
                f"this process's CUDA device {self.ordinal} is {mine}, but the daemon serves rank "
                f"{state['rank']['globalRank']} from {theirs}; attach to your own device's socket (or fix CUDA_VISIBLE_DEVICES)",
            )
        ctx = ctypes.c_void_p()
        d.check(d.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), self.dev), "cuDevicePrimaryCtxRetain")
        self._ctx: Optional[ctypes.c_void_p] = ctx
        self.pointers: Dict[int, int] = {}
        self._fd_segments: Dict[int, FdSegment] = {}
        self._fd_range: Optional[FdRange] = None
        self.tensors: Dict[str, Any] = {}
        self.state = state
        self._segment_bytes = {s["segment"]: int(s["bytes"]) for s in state["segments"]}
        # Views alive (CudaBuffers not yet freed), and what close() asked for while they were.
        self._lock = threading.RLock()
        self._views = 0
        self._close_requested = False
        self._closed = False
        self._then: Optional[Callable[[], None]] = None
        # Switches imported ahead and not yet finished or discarded: their imports go at close.
        self._prepared: "set[PreparedRemap]" = set()
        # Allocations switches replaced, unmapped and not yet released (by segment): the client's
        # retirer releases them right after the switch returns, a close those it has not.
        self._retiring: List["tuple[int, int]"] = []
        #: What the last remap did: segments remapped and skipped, seconds and their split (None before any).
        self.last_switch: Optional[Dict[str, Any]] = None
        try:
            with self._current():
                fd_segs = [seg for seg in state["segments"] if seg["handle"] == CUDA_FD_HANDLE]
                if fd_segs:
                    missing = [seg["segment"] for seg in fd_segs if seg["segment"] not in (segment_fds or {})]
                    if missing:
                        raise CudaError("E_NO_SEGMENT_FDS", f"segment(s) {missing} of rank {state['rank']['globalRank']} are cuda-fd: their descriptors come from get_segment_fds; pass them as segment_fds")
                    self._fd_range, self._fd_segments = open_fd_segments([segment_fds[seg["segment"]] for seg in fd_segs], fd_segs, self.dev, writable)
                    self.pointers.update({n: s.pointer for n, s in self._fd_segments.items()})
                for seg in state["segments"]:
                    if seg["handle"] == CUDA_FD_HANDLE:
                        continue
                    handle = _IpcHandle()
                    raw = base64.b64decode(seg["handle"])
                    if len(raw) != 64:
                        raise CudaError("E_BAD_MANIFEST", f"segment {seg['segment']} handle is {len(raw)} bytes, not a 64-byte CUipcMemHandle")
                    ctypes.memmove(ctypes.byref(handle), raw, 64)
                    ptr = ctypes.c_uint64()
                    d.check(d.cuIpcOpenMemHandle(ctypes.byref(ptr), handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), f"cuIpcOpenMemHandle(segment {seg['segment']})")
                    self.pointers[seg["segment"]] = ptr.value
                self.tensors = self._make_tensors(state, tensor_format)
        except BaseException:
            with contextlib.suppress(CudaError):  # the failure that stopped the attach is the one to report
                self.close()
            raise

    def _refuse_legacy(self) -> None:
        legacy = [s["segment"] for s in self.state["segments"] if s["handle"] != CUDA_FD_HANDLE]
        if legacy:
            raise CudaError(
                "E_REMAP_UNSUPPORTED",
                f"segment(s) {legacy} are legacy CUDA IPC handles, which the driver maps at an address of its choosing; "
                "remapping in place needs a daemon run with --cuda-handles fd",
            )

    def changed_segments(self, state: Dict[str, Any]) -> List[int]:
        """The segments of ``state`` (another version's get_state reply) whose memory is not the
        allocation this maps there: every one but those the daemon names as the same allocation
        (each segment's ``memory``: a version that shares a segment with its base names the
        base's). A segment without a name, on either side, counts as changed. A mapping of legacy
        IPC handles is refused here, before any descriptor is asked for (E_REMAP_UNSUPPORTED)."""
        self._refuse_legacy()
        mapped = {seg["segment"]: seg.get("memory") for seg in self.state["segments"]}
        return [seg["segment"] for seg in state["segments"] if seg.get("memory") is None or mapped.get(seg["segment"]) != seg["memory"]]

    def prepare_remap(self, state: Dict[str, Any], segment_fds: Dict[int, int]) -> "PreparedRemap":
        """Step one of ``remap``, which the engine may run ahead (during a step): checks that
        ``state`` places every tensor exactly where this mapping does and imports the allocation
        of each segment that changes (``changed_segments``); the others are kept as they are
        mapped, and need no descriptor. Nothing is mapped yet: the views still read this
        version. ``segment_fds``: the changed segments' descriptors at least (the caller closes
        them). Pass the result to ``finish_remap``, or ``discard()`` it."""
        with self._lock:
            if self._close_requested or self._closed:
                raise CudaError("E_CLOSED", "this mapping is closed; attach again instead of remapping it")
        self._refuse_legacy()
        check_same_placement(self.state, state, CudaError)
        changed = self.changed_segments(state)
        missing = sorted(set(changed) - set(segment_fds))
        if missing:
            raise CudaError("E_NO_SEGMENT_FDS", f"segment(s) {missing} have no descriptor in segment_fds; pass get_segment_fds' reply for the new lease")
        prepared = PreparedRemap(self, state, len(self._fd_segments) - len(changed))
        with self._current():
            try:
                for n in changed:
                    prepared.held[n] = self._fd_segments[n].import_handle(segment_fds[n])
            except BaseException:
                with contextlib.suppress(CudaError):  # the failure that stopped the import is the one to report
                    self._release_imports(prepared)
                raise
        with self._lock:
            self._prepared.add(prepared)
        return prepared

    def finish_remap(self, prepared: "PreparedRemap", retire: Optional[Retire] = None) -> Dict[str, Any]:
        """Step two of ``remap``: puts ``prepared``'s allocations behind their segments' address
        ranges (unmap, map at the same address, set access), so every ``data_ptr`` (and a CUDA
        graph captured over them) stays valid and reads the new bytes; the replaced allocations
        are released, by ``retire`` when given (it runs the release it is given later, on another
        thread: WeightdClient's), else before it returns. The device is synchronized first, so
        call it between steps. All or nothing: on any failure every segment maps what it mapped
        before, and ``prepared``'s imports are released. Returns what it did: segments remapped
        and skipped, seconds (to the last remap: the release is not in them)."""
        with self._lock:
            stale = prepared.mapping is not self or prepared not in self._prepared
        if stale:
            raise CudaError("E_SWITCH_STALE", "this prepared switch was finished or discarded already, or is of another mapping; prepare it again")
        if prepared.against is not self.state:
            self.discard(prepared)
            raise CudaError("E_SWITCH_STALE", "this mapping switched since the switch was prepared, so what it imported may not be what changes now; prepare it again")
        d = self.driver
        started = time.perf_counter()
        with self._current():
            replaced: Dict[int, int] = {}
            try:
                # Nothing this process queued may still read the old bytes or run over the
                # unmapped range (cuMemUnmap under running work is undefined). A switch that
                # changes no segment touches nothing, so it has nothing to wait for.
                if prepared.held:
                    d.check(d.cuCtxSynchronize(), "cuCtxSynchronize")
                synced = time.perf_counter()
                for n in list(prepared.held):
                    replaced[n] = self._fd_segments[n].swap(prepared.held[n])
                    del prepared.held[n]
                swapped = time.perf_counter()
                # Mapped first, then given access in one call per run of neighbours.
                grant_runs([self._fd_segments[n] for n in replaced])
            except BaseException:
                # Each segment put back on its own, so one that fails does not leave the others on
                # the new version; the failure that stopped the remap is the one to report.
                for n, old in replaced.items():
                    with contextlib.suppress(CudaError):
                        prepared.held[n] = self._fd_segments[n].swap(old)
                with contextlib.suppress(CudaError):
                    grant_runs([self._fd_segments[n] for n in replaced])
                with contextlib.suppress(CudaError):
                    self._release_imports(prepared)
                raise
            finally:
                with self._lock:
                    self._prepared.discard(prepared)
            # The views read the new version from here on: say so before anything else can fail.
            self.state = prepared.state
            done = time.perf_counter()
            # Where the stall went: the device's synchronization, the unmaps and maps, the access grants.
            split = {"syncSeconds": synced - started, "remapSeconds": swapped - synced, "grantSeconds": done - swapped}
            self.last_switch = {"remapped": sorted(replaced), "skipped": prepared.skipped, "seconds": done - started, "split": split}
            with self._lock:
                self._retiring.extend(replaced.items())
        # The replaced allocations are unmapped and only wait to be released: off the switch's
        # stall when the caller gives a thread for it (weightd_client/retire.py), else now.
        (retire or run_now)(self._release_retiring)
        return self.last_switch

    def _release_retiring(self) -> None:
        """Releases the allocations that switches replaced, unmapped since (whatever a close has
        not released already). It retains the primary context for the releases, so a close on
        another thread meanwhile cannot destroy the context under them. It never raises: the
        switch is done (a failure is logged, and what it could not release waits for the close)."""
        with self._lock:
            retiring, self._retiring = self._retiring, []
        if not retiring:
            return
        d, ctx = self.driver, ctypes.c_void_p()
        try:
            d.check(d.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), self.dev), "cuDevicePrimaryCtxRetain")
        except CudaError as err:
            # Put back for the close, which releases them in its own context.
            with self._lock:
                self._retiring.extend(retiring)
            log.warning("weightd: switched, but the previous allocations of %d segment(s) are released only at the mapping's close: %s", len(retiring), err)
            return
        try:
            with context_current(d, ctx):
                for err in self._release_replaced(retiring):
                    log.warning("weightd: switched, but %s", err)
        finally:
            rc = d.cuDevicePrimaryCtxRelease(self.dev)
            if rc:
                log.warning("weightd: releasing the device's primary context after a switch's releases failed (CUresult %d)", rc)

    def _release_replaced(self, replaced: List["tuple[int, int]"]) -> List[CudaError]:
        """Releases allocations switches replaced (by segment; a context current): each one tried,
        the failures returned."""
        failures: List[CudaError] = []
        for n, old in replaced:
            try:
                self.driver.check(self.driver.cuMemRelease(old), f"cuMemRelease(segment {n}'s previous allocation)")
            except CudaError as err:
                failures.append(err)
        return failures

    def remap(self, state: Dict[str, Any], segment_fds: Dict[int, int]) -> Dict[str, Any]:
        """Puts the memory of another served version behind this mapping, in place:
        ``prepare_remap`` then ``finish_remap`` (each says what it does and when to call it)."""
        return self.finish_remap(self.prepare_remap(state, segment_fds))

    def discard(self, prepared: "PreparedRemap") -> None:
        """Gives back what ``prepared`` imported (a switch that will not happen); idempotent."""
        with self._lock:
            if prepared not in self._prepared:
                return
            self._prepared.discard(prepared)
        with self._current():
            self._release_imports(prepared)

    def _release_imports(self, prepared: "PreparedRemap") -> None:
        """Releases every import ``prepared`` still holds (context current); raises the first failure after trying every one."""
        failures: List[BaseException] = []
        for n, handle in list(prepared.held.items()):
            del prepared.held[n]
            try:
                self._fd_segments[n].release(handle)
            except CudaError as err:
                failures.append(err)
        if failures:
            raise failures[0]

    @property
    def read_only(self) -> bool:
        """Whether no kernel of this process can write the daemon's memory through this mapping:
        every segment a cuda-fd one mapped read-only. Legacy IPC handles never are
        (cuIpcOpenMemHandle maps read-write, and the driver offers no way to narrow it)."""
        return len(self._fd_segments) == len(self.pointers) and all(s.read_only for s in self._fd_segments.values())

    def _current(self) -> Any:
        return context_current(self.driver, self._ctx)

    def read(self, t: Dict[str, Any]) -> bytearray:
        """A host copy of one tensor's bytes (synchronous cuMemcpyDtoH; needs no torch)."""
        out = bytearray(t["bytes"])
        if t["bytes"]:
            buf = (ctypes.c_char * t["bytes"]).from_buffer(out)
            with self._current():
                self.driver.check(self.driver.cuMemcpyDtoH(buf, self.pointers[t["segment"]] + t["offset"], t["bytes"]), f"cuMemcpyDtoH({t['name']})")
        return out

    def write(self, t: Dict[str, Any], data: memoryview) -> None:
        """Copies host bytes ``data`` (``t["bytes"]`` of them) into tensor ``t`` (synchronous
        cuMemcpyHtoD; a writable mapping's only)."""
        if t["bytes"]:
            buf = (ctypes.c_char * t["bytes"]).from_buffer_copy(data) if data.readonly else (ctypes.c_char * t["bytes"]).from_buffer(data)
            with self._current():
                self.driver.check(self.driver.cuMemcpyHtoD(self.pointers[t["segment"]] + t["offset"], buf, t["bytes"]), f"cuMemcpyHtoD({t['name']})")

    def synchronize(self) -> None:
        """Waits for every piece of work this process queued on the device (torch's streams
        included: they run in the same primary context), so what was written has landed."""
        with self._current():
            self.driver.check(self.driver.cuCtxSynchronize(), "cuCtxSynchronize")

    def views_alive(self) -> int:
        """How many views (CudaBuffers torch or CuPy hold) of this mapping are still referenced."""
        with self._lock:
            return self._views

    def _make_tensors(self, state: Dict[str, Any], tensor_format: str) -> Dict[str, Any]:
        self.uses_torch = use_torch = tensor_format in ("auto", "torch") and _has_torch()
        if tensor_format == "torch" and not use_torch:
            raise CudaError("E_NO_TORCH", "tensor_format='torch' but torch is not installed")
        if not use_torch:

            def make(t: Dict[str, Any]) -> Any:
                base = self.pointers.get(t["segment"])
                if base is None:
                    raise CudaError("E_BAD_MANIFEST", f"tensor {t['name']} is in segment {t['segment']}, which the manifest does not list")
                return self.track(CudaBuffer(base + t["offset"], t["bytes"], t["dtype"], t["shape"]))

            return by_name(state, make)
        bases: Dict[int, SegmentViews] = {}

        def device_bytes(ptr: int, nbytes: int) -> Any:
            import torch

            return torch.as_tensor(self.track(CudaBuffer(ptr, nbytes, "U8", [nbytes], raw=True)), device=f"cuda:{self.ordinal}")

        def segment_views(segment: int) -> SegmentViews:
            # Building a tensor from __cuda_array_interface__ is the slow step (and torch has no
            # typestr for bf16 or fp8), so it is done once per segment, and each tensor is a
            # strided view of it in its own dtype.
            if segment not in bases:
                ptr = self.pointers.get(segment)
                if ptr is None:
                    raise CudaError("E_BAD_MANIFEST", f"a tensor lies in segment {segment}, which the manifest does not list")
                bases[segment] = SegmentViews(device_bytes(ptr, self._segment_bytes[segment]), lambda t: device_bytes(ptr + t["offset"], t["bytes"]))
            return bases[segment]

        return torch_by_name(state, segment_views)

    def track(self, buf: CudaBuffer) -> CudaBuffer:
        """Counts ``buf`` as a view of this mapping until it is freed (see the class's doc)."""
        with self._lock:
            self._views += 1
        weakref.finalize(buf, self._view_freed)
        return buf

    def close(self, then: Optional[Callable[[], None]] = None) -> None:
        """Closes every handle and releases the context, then runs ``then`` (the lease's end): now
        when no view is left, else when the last one is freed. A close now raises the first
        failure of its steps (after trying every one); a deferred one logs it."""
        self.tensors = {}  # our own references to the views
        with self._lock:
            if self._close_requested:
                return
            self._close_requested, self._then = True, then
            if self._views:
                log.warning(
                    "weightd: %d view(s) of the daemon's GPU memory are still referenced; its IPC handles close and the lease ends when the last one is freed",
                    self._views,
                )
                return
        self._close_now()

    def _view_freed(self) -> None:
        with self._lock:
            self._views -= 1
            due = self._close_requested and self._views == 0 and not self._closed
        if due:
            try:
                self._close_now()
            except BaseException as err:  # a finalizer has no caller to raise to
                log.warning("weightd: closing the CUDA mapping after its last view was freed failed: %s", err)

    def _close_now(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._unmap()
        finally:
            then, self._then = self._then, None
            if then is not None:
                then()

    def _unmap(self) -> None:
        if self._ctx is None:
            return
        d = self.driver
        failures: List[BaseException] = []
        try:
            with self._current():
                with self._lock:
                    pending, self._prepared = list(self._prepared), set()
                    retiring, self._retiring = self._retiring, []
                for prepared in pending:
                    try:
                        self._release_imports(prepared)
                    except CudaError as err:
                        failures.append(err)
                failures += self._release_replaced(retiring)
                for seg, ptr in list(self.pointers.items()):
                    del self.pointers[seg]
                    try:
                        fd_seg = self._fd_segments.pop(seg, None)
                        if fd_seg is not None:
                            fd_seg.close()
                        else:
                            d.check(d.cuIpcCloseMemHandle(ptr), f"cuIpcCloseMemHandle(segment {seg})")
                    except CudaError as err:
                        failures.append(err)
                if self._fd_range is not None:
                    fd_range, self._fd_range = self._fd_range, None
                    fd_range.free()
        except CudaError as err:
            failures.append(err)
        self.pointers.clear()
        self._ctx = None
        try:
            d.check(d.cuDevicePrimaryCtxRelease(self.dev), "cuDevicePrimaryCtxRelease")
        except CudaError as err:
            failures.append(err)
        if failures:
            raise failures[0]


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _current_torch_device() -> int:
    if _has_torch():
        import torch

        if torch.cuda.is_available():
            return torch.cuda.current_device()
    return 0


def synchronize(ordinal: int) -> None:
    """Waits for copies from the mapped memory to finish before its handles are closed."""
    if _has_torch():
        import torch

        torch.cuda.synchronize(ordinal)
