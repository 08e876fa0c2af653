"""A manifest's tensors as columns (docs/spec/manifest-columns.md), the form this client asks for.

At 50k tensors a dict per tensor is 7 MB of JSON whose decoding was most of a first attach; the
columns are lists of numbers, several times cheaper to decode, and the torch views are built
straight from them (tensors.torch_by_name). ``TensorColumns`` is also a sequence of the per-tensor
dicts older daemons send (``state["tensors"]`` keeps meaning what it meant), made on demand.
The TypeScript twin is src/wire/tensorColumns.ts; both read test/vectors/manifest-columns.json.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Sequence, Tuple

from .protocol import ProtocolError

_PER_TENSOR = ("dtype", "shape", "segment", "offset", "bytes")


def _bad(message: str) -> ProtocolError:
    return ProtocolError(
        "E_BAD_MANIFEST", f"manifest columns: {message}; the daemon's reply is malformed (upgrade the client or the daemon, or load from disk)"
    )


def _counts(value: Any, what: str) -> List[int]:
    # type() per entry through map and set: a check per tensor in C, not in a Python loop.
    if not isinstance(value, list) or not set(map(type, value)) <= {int} or (value and min(value) < 0):
        raise _bad(f"{what} is not a list of integers >= 0")
    return value


def _strings(value: Any, what: str) -> List[str]:
    if not isinstance(value, list) or not set(map(type, value)) <= {str}:
        raise _bad(f"{what} is not a list of strings")
    return value


def _index(column: List[int], table: List[Any], key: str, names: List[str]) -> None:
    if column and max(column) >= len(table):
        i = next(i for i, k in enumerate(column) if k >= len(table))
        raise _bad(f'tensor {names[i]!r} has {key} index {column[i]}, but "{key}s" has {len(table)}')


class TensorColumns(Sequence):
    """The tensors of one manifest, a list per field. ``shapes`` holds each distinct shape once,
    as a tuple, and ``shape`` a tensor's index into it; ``dtypes`` and ``dtype`` likewise.

    The per-tensor numbers (``dtype``, ``shape``, ``segment``, ``offset``, ``bytes``) may be held
    as ``array.array`` columns (the packed manifest's, read with one copy each) and become lists
    when first asked for by name: at 50k tensors a list of offsets is 50k int objects, which an
    attach never needs (``array`` gives the views their columns as numpy arrays instead)."""

    __slots__ = ("name", "dtypes", "shapes", "_numbers")

    def __init__(self, columns: Any):
        if not isinstance(columns, dict):
            raise _bad("they are not an object")
        name = _strings(columns.get("name"), '"name"')
        dtypes = _strings(columns.get("dtypes"), '"dtypes"')
        shapes = columns.get("shapes")
        if not isinstance(shapes, list):
            raise _bad('"shapes" is not a list of shapes')
        for k, shape in enumerate(shapes):
            _counts(shape, f'"shapes"[{k}]')
        per = {key: _counts(columns.get(key), f'"{key}"') for key in _PER_TENSOR}
        for key in _PER_TENSOR:
            if len(per[key]) != len(name):
                raise _bad(f'"{key}" has {len(per[key])} entries but "name" has {len(name)}')
        _index(per["dtype"], dtypes, "dtype", name)
        _index(per["shape"], shapes, "shape", name)
        self.name: List[str] = name
        self.dtypes: List[str] = dtypes
        self.shapes: List[Tuple[int, ...]] = [tuple(shape) for shape in shapes]
        self._numbers: Dict[str, Any] = per

    @classmethod
    def checked(cls, name: List[str], dtypes: List[str], shapes: List[Tuple[int, ...]], numbers: Dict[str, Any]) -> "TensorColumns":
        """Columns a decoder has already checked (packed_manifest: its types hold by construction,
        its indices it checks). ``numbers``: each of dtype, shape, segment, offset and bytes, as a
        list or an ``array.array``."""
        self = cls.__new__(cls)
        self.name, self.dtypes, self.shapes, self._numbers = name, dtypes, shapes, numbers
        return self

    def _list(self, key: str) -> List[int]:
        column = self._numbers[key]
        if not isinstance(column, list):
            column = self._numbers[key] = column.tolist()
        return column

    dtype = property(lambda self: self._list("dtype"))
    shape = property(lambda self: self._list("shape"))
    segment = property(lambda self: self._list("segment"))
    offset = property(lambda self: self._list("offset"))
    bytes = property(lambda self: self._list("bytes"))

    def column(self, key: str) -> Any:
        """One per-tensor column as held: a list or an ``array.array`` (either indexes to ints)."""
        return self._numbers[key]

    def array(self, key: str) -> Any:
        """One per-tensor column as a numpy array, of int64 (or uint32 for a packed u32 column):
        no copy of an ``array.array`` column (every u64 of a manifest is below 2^53, so it reads
        as an int64 alike)."""
        import numpy as np

        column = self._numbers[key]
        if isinstance(column, list):
            return np.array(column, dtype=np.int64)
        return np.frombuffer(column, dtype=np.int64 if column.itemsize == 8 else np.uint32)

    @classmethod
    def from_objects(cls, tensors: Any) -> "TensorColumns":
        """The columns of a manifest that came as one object per tensor (a daemon older than columns)."""
        if not isinstance(tensors, list) or not all(isinstance(t, dict) for t in tensors):
            raise ProtocolError("E_BAD_MANIFEST", "the manifest's tensors are not a list of objects; the daemon's reply is malformed")
        dtypes: Dict[str, int] = {}
        shapes: Dict[Tuple[int, ...], int] = {}
        try:
            columns: Dict[str, Any] = {
                "name": [t["name"] for t in tensors],
                "dtype": [dtypes.setdefault(t["dtype"], len(dtypes)) for t in tensors],
                "shape": [shapes.setdefault(tuple(t["shape"]), len(shapes)) for t in tensors],
                "segment": [t["segment"] for t in tensors],
                "offset": [t["offset"] for t in tensors],
                "bytes": [t["bytes"] for t in tensors],
            }
        except (KeyError, TypeError) as err:
            raise ProtocolError("E_BAD_MANIFEST", f"a tensor of the manifest lacks a field or has one of the wrong type ({err!r}); the daemon's reply is malformed") from err
        columns["dtypes"] = list(dtypes)
        columns["shapes"] = [list(shape) for shape in shapes]
        return cls(columns)

    def placement(self) -> Tuple[List[Any], ...]:
        """Where every tensor lies, as lists that compare in C: two manifests with equal
        placements can be swapped behind the same views (CudaMapping.remap)."""
        return (self.name, [self.dtypes[k] for k in self.dtype], [self.shapes[k] for k in self.shape], self.segment, self.offset, self.bytes)

    def __len__(self) -> int:
        return len(self.name)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = self._numbers
        return {
            "name": self.name[i], "dtype": self.dtypes[n["dtype"][i]], "shape": list(self.shapes[n["shape"][i]]),
            "segment": n["segment"][i], "offset": n["offset"][i], "bytes": n["bytes"][i],
        }

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return f"TensorColumns({len(self)} tensors)"


def check_same_placement(current: Dict[str, Any], new: Dict[str, Any], error: Any) -> None:
    """Raises ``error("E_LAYOUT_CHANGED", ...)``, naming the first difference, unless ``new`` has
    the same device, segments (numbers, sizes, handle kinds) and tensors (names, dtypes, shapes,
    places) as ``current``: then one version's memory can sit behind the other's views."""

    def segments(state: Dict[str, Any]) -> List[Any]:
        return [(s["segment"], int(s["bytes"]), s["handle"]) for s in state["segments"]]

    def placement(state: Dict[str, Any]) -> Any:
        tensors = state["tensors"]
        return (tensors if isinstance(tensors, TensorColumns) else TensorColumns.from_objects(list(tensors))).placement()

    def refuse(what: str) -> Any:
        return error("E_LAYOUT_CHANGED", f"the new version {what}, so its memory cannot sit behind the same views; attach it afresh instead")

    if not same_uuid(current["device"]["uuid"], new["device"]["uuid"]):
        raise refuse(f"is served from device {new['device']['uuid']}, not {current['device']['uuid']}")
    if segments(current) != segments(new):
        raise refuse(f"has segments {segments(new)}, not {segments(current)}")
    ours, theirs = placement(current), placement(new)
    if ours != theirs:
        fields = ("name", "dtype", "shape", "segment", "offset", "bytes")
        k, column = next((k, c) for k, c in enumerate(fields) if ours[k] != theirs[k])
        if len(ours[k]) != len(theirs[k]):
            raise refuse(f"has {len(theirs[k])} tensors, not {len(ours[k])}")
        i = next(i for i, (a, b) in enumerate(zip(ours[k], theirs[k])) if a != b)
        raise refuse(f"places tensor {ours[0][i]!r} differently ({column} {theirs[k][i]!r}, not {ours[k][i]!r})")


def same_uuid(a: str, b: str) -> bool:
    """Whether two device UUIDs name one device (the driver's and nvidia-smi's spellings differ)."""
    norm = lambda s: s.lower().removeprefix("gpu-")  # noqa: E731
    return norm(a) == norm(b)
