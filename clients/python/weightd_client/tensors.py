"""Dtype tables and the name -> tensor map shared by both backends.

The dtype tables follow docs/spec/dtypes.md, held to test/vectors/dtypes.json as the TypeScript
client's are. safetensors dtypes without a native counterpart (BF16 in numpy, the F8 family
before torch has them, F16 in a memoryview before Python 3.12) come as same-sized integer views
of the exact bits; packed F4/F6 come as bytes. Any other name is refused: a daemon newer than
this client serves a dtype it cannot know the size of.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any, Callable, Dict, List, Optional

from .bulk_views import column_views
from .columns import TensorColumns
from .protocol import ProtocolError

DTYPES = frozenset((
    "BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "BF16", "F32", "F64", "C64",
    "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2",
))

_NUMPY = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "uint16", "C64": "complex64",
    "I64": "int64", "U64": "uint64", "I32": "int32", "U32": "uint32", "I16": "int16", "U16": "uint16",
    "I8": "int8", "U8": "uint8", "BOOL": "bool",
}

_TORCH = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "C64": "complex64",
    "I64": "int64", "U64": "uint64", "I32": "int32", "U32": "uint32", "I16": "int16", "U16": "uint16",
    "I8": "int8", "U8": "uint8", "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu",
}


def _castable(code: str) -> bool:
    try:
        memoryview(bytes(8)).cast(code)
        return True
    except (TypeError, ValueError):
        return False


# struct format characters for plain memoryviews. F16 is "e" (IEEE half) where memoryview.cast
# takes it (Python 3.12 and later); before, "H": the exact bits, as for BF16.
MEMORYVIEW_FORMAT = {
    "F64": "d", "F32": "f", "F16": "e" if _castable("e") else "H", "BF16": "H", "I64": "q", "U64": "Q", "I32": "i", "U32": "I",
    "I16": "h", "U16": "H", "I8": "b", "U8": "B", "BOOL": "?",
}


def _known(dtype: str) -> str:
    if dtype not in DTYPES:
        raise ProtocolError("E_UNKNOWN_DTYPE", f"tensor dtype {json.dumps(dtype)} is not one this client knows; upgrade the client")
    return dtype


def numpy_dtype(dtype: str) -> str:
    # Everything else (F8_*, F4, F6_*) is 8 bits wide or packed into bytes.
    return _NUMPY.get(_known(dtype), "uint8")


def memoryview_format(dtype: str) -> str:
    # C64 (struct has no complex format), F8_*, F4 and F6_*: the raw bytes.
    return MEMORYVIEW_FORMAT.get(_known(dtype), "B")


def torch_dtype(dtype: str) -> Any:
    import torch

    name = _TORCH.get(_known(dtype))
    found = getattr(torch, name, None) if name else None
    # A dtype this torch lacks (an older torch and F8_E8M0, say): the raw bits as uint8.
    return found if found is not None else torch.uint8


def resolve_format(tensor_format: str) -> str:
    if tensor_format == "auto":
        for candidate in ("torch", "numpy"):
            if importlib.util.find_spec(candidate) is not None:
                return candidate
        return "memoryview"
    if tensor_format not in ("torch", "numpy", "memoryview"):
        raise ValueError(f"tensor_format {tensor_format!r}: use 'auto', 'torch', 'numpy' or 'memoryview'")
    return tensor_format


def by_name(state: Dict[str, Any], make: Callable[[Dict[str, Any]], Any]) -> Dict[str, Any]:
    """Every tensor and alias (tied weights share one object), each made once."""
    return _with_aliases(state, {t["name"]: make(t) for t in state["tensors"]})


def torch_by_name(state: Dict[str, Any], views_of: Callable[[int], "SegmentViews"]) -> Dict[str, Any]:
    """``by_name`` for torch, straight from the manifest's columns (``state["tensors"]``, a
    TensorColumns as WeightdClient.get_state makes it, or a list of dicts): a strided view per
    tensor, made in few torch calls where the layout repeats (bulk_views.column_views), with
    strides worked out once per distinct shape. Anything unusual (out of bounds, empty,
    misaligned, packed) goes through ``SegmentViews.view``, which knows what to do with it."""
    cols = state["tensors"]
    if not isinstance(cols, TensorColumns):
        cols = TensorColumns.from_objects(cols)  # a manifest made by hand, as the tests make them
    layouts = [(shape, *contiguous(shape)) for shape in cols.shapes]
    return _with_aliases(state, dict(zip(cols.name, column_views(cols, layouts, views_of))))


def contiguous(shape: Any) -> Any:
    """A row-major tensor's strides (in elements) and its element count."""
    strides = [0] * len(shape)
    step = 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d] = step
        step *= shape[d]
    return tuple(strides), step


def _with_aliases(state: Dict[str, Any], out: Dict[str, Any]) -> Dict[str, Any]:
    for alias, target in state.get("aliases", {}).items():
        if target not in out:
            raise ProtocolError("E_BAD_MANIFEST", f"alias {alias} names {target}, which the manifest does not hold")
        out[alias] = out[target]
    return out


class SegmentViews:
    """One segment's bytes (a torch uint8 tensor, host or device) and a view of it per dtype, of
    which each tensor in the segment is a strided view: one cheap call per tensor (``as_strided``)
    where a tensor made per tensor, or a slice, a dtype view and a reshape, cost several times
    more, which at tens of thousands of tensors is most of an attach.

    ``own_bytes(t)``: a uint8 tensor of just ``t``'s bytes, for the rare tensor whose offset is no
    multiple of its dtype's size (torch reinterprets bytes as a wider dtype only at one)."""

    def __init__(self, raw: Any, own_bytes: Callable[[Dict[str, Any]], Any]):
        self.raw = raw
        self.own_bytes = own_bytes
        self.by_dtype: Dict[str, Any] = {}

    def base(self, dtype_name: str) -> Any:
        """The segment's bytes as one tensor of ``dtype_name`` (its last partial item left out)."""
        base = self.by_dtype.get(dtype_name)
        if base is None:
            dtype = torch_dtype(dtype_name)
            n = self.raw.numel()
            base = self.by_dtype[dtype_name] = self.raw[: n - n % dtype.itemsize].view(dtype)
        return base

    def view(self, t: Dict[str, Any]) -> Any:
        base = self.base(t["dtype"])
        itemsize = base.element_size()
        offset, nbytes = t["offset"], t["bytes"]
        if offset + nbytes > self.raw.numel():
            raise ProtocolError("E_BAD_MANIFEST", f"tensor {t['name']} ({nbytes} bytes at {offset}) lies outside its segment {t['segment']} of {self.raw.numel()} bytes")
        if nbytes == 0:
            import torch

            return torch.empty(t["shape"], dtype=base.dtype, device=base.device)
        if offset % itemsize:
            return SegmentViews(self.own_bytes(t), self.own_bytes).view({**t, "offset": 0})
        shape = element_shape(t, itemsize)
        return base.as_strided(shape, contiguous(shape)[0], offset // itemsize)


def element_shape(t: Dict[str, Any], itemsize: int) -> List[int]:
    """The tensor's shape, or flat (packed F4/F6, whose elements are not whole items)."""
    n = 1
    for d in t["shape"]:
        n *= d
    return list(t["shape"]) if n * itemsize == t["bytes"] else [t["bytes"] // itemsize]
