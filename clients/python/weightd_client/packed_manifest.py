"""A manifest's tensors as packed binary columns (docs/spec/manifest-packed.md), the form this
client asks for: the frame that follows a get_state reply with ``packed``.

At 50k tensors, decoding the JSON columns and checking their types was a third of a first attach
(about 26 ms of 85 here); packed, each numeric column is one copy into an ``array.array`` (no int
object per tensor: TensorColumns makes lists of them only when asked) and the names are one
decode and split. Checked in the spec's order, so a bad payload is refused for the same
fault as the TypeScript twin (src/wire/packedManifest.ts) refuses it; both read
test/vectors/manifest-packed.json.
"""

from __future__ import annotations

import array
import struct
import sys
from typing import List, Union

from .columns import TensorColumns
from .protocol import ProtocolError

MAGIC = b"WGTDPACK"
VERSION = 1
_HEADER = struct.Struct("<8s8I")
# What JSON and a double hold exactly: the most a u64 of the format may be.
_MAX_U64 = (1 << 53) - 1
# How much of a names section is decoded at once (_strings).
_PIECE = 64 << 10


def _bad(at: int, problem: str) -> ProtocolError:
    return ProtocolError(
        "E_BAD_MANIFEST",
        f"packed manifest, at byte {at}: {problem}; the daemon's reply is malformed (upgrade the client or the daemon, or load from disk)",
        {"at": at},
    )


def _column(view: memoryview, start: int, count: int, code: str) -> "array.array[int]":
    """``count`` little-endian integers of ``code``'s width at ``start``: one copy, no int objects."""
    values = array.array(code)
    values.frombytes(view[start : start + count * values.itemsize])
    if sys.byteorder != "little":
        values.byteswap()
    return values


def _largest(column: "array.array[int]") -> int:
    """The largest entry of a non-empty column: through numpy where this process has loaded it
    (torch loads it), else one int object per entry."""
    np = sys.modules.get("numpy")
    if np is None:
        return max(column)
    return int(np.frombuffer(column, dtype=np.uint64 if column.itemsize == 8 else np.uint32).max())


def _first(column: "array.array[int]", limit: int) -> int:
    """The index of the first entry of ``column`` that is ``limit`` or more (one is)."""
    return next(i for i, v in enumerate(column) if v >= limit)


def _strings(payload: Union[bytes, bytearray], start: int, size: int, count: int, what: str) -> List[str]:
    """The ``count`` strings of a section, each ending in a 0 byte (spec §3, check 7)."""
    view, out, at, end = memoryview(payload), [], start, start + size
    try:
        # A piece at a time, each cut after a 0 byte (which no UTF-8 sequence holds): each piece's
        # text is freed before the next is decoded, so they reuse one piece's memory where the
        # whole section's text (2.5 MB at 50k tensors) would be new pages to fault in.
        while at < end:
            cut = payload.find(b"\0", min(at + _PIECE, end) - 1, end) + 1 or end
            out += str(view[at:cut], "utf-8").split("\0")
            out.pop()
            at = cut
    except UnicodeDecodeError:
        raise _bad(start, f"the {what} section is not valid UTF-8") from None
    if size == 0 and count == 0:
        return []
    if size == 0 or payload[end - 1] != 0:
        raise _bad(start + max(size - 1, 0), f"the {what} section does not end with a 0 byte")
    if len(out) != count:
        raise _bad(start, f"the {what} section holds {len(out)} names, not {count}")
    return out


def unpack_manifest(payload: Union[bytes, bytearray]) -> TensorColumns:
    """The tensors of a packed manifest, checked as docs/spec/manifest-packed.md §3 says."""
    if len(payload) < _HEADER.size:
        raise _bad(0, f"{len(payload)} bytes is shorter than the {_HEADER.size}-byte header")
    magic, version, n, d, s, r, t, m, reserved = _HEADER.unpack_from(payload)
    if magic != MAGIC:
        raise _bad(0, 'it does not start with the magic "WGTDPACK"')
    if version != VERSION:
        raise _bad(8, f"version {version} is not one this client reads ({VERSION}); upgrade the client")
    if reserved != 0:
        raise _bad(36, "the reserved field is not 0")
    at_offset = _HEADER.size
    at_bytes = at_offset + 8 * n
    at_dims = at_bytes + 8 * n
    at_segment = at_dims + 8 * r
    at_shape = at_segment + 4 * n
    at_dtype = at_shape + 4 * n
    at_rank = at_dtype + 4 * n
    at_dtypes = at_rank + 4 * s
    at_names = at_dtypes + t
    if at_names + m != len(payload):
        raise _bad(0, f"the header's counts make {at_names + m} bytes, but the manifest is {len(payload)}")
    view = memoryview(payload)
    u64 = {start: _column(view, start, count, "Q") for start, count in ((at_offset, n), (at_bytes, n), (at_dims, r))}
    for start, column in u64.items():
        if column and _largest(column) > _MAX_U64:
            raise _bad(start + 8 * _first(column, _MAX_U64 + 1), "a number is above 2^53 - 1")
    segment, shape, dtype = (_column(view, start, n, "I") for start in (at_segment, at_shape, at_dtype))
    rank = _column(view, at_rank, s, "I")
    for start, column, limit, what in ((at_dtype, dtype, d, "dtype"), (at_shape, shape, s, "shape")):
        if column and _largest(column) >= limit:
            i = _first(column, limit)
            raise _bad(start + 4 * i, f"tensor {i}'s {what} index {column[i]} is out of range ({limit} {what}s)")
    if sum(rank) != r:
        raise _bad(at_rank, f"the shapes' ranks do not add up to the header's {r} dims")
    dtypes = _strings(payload, at_dtypes, t, d, "dtypes")
    names = _strings(payload, at_names, m, n, "names")
    dims = u64[at_dims].tolist()
    shapes, first = [], 0
    for k in rank:
        shapes.append(tuple(dims[first : first + k]))
        first += k
    numbers = {"dtype": dtype, "shape": shape, "segment": segment, "offset": u64[at_offset], "bytes": u64[at_bytes]}
    return TensorColumns.checked(names, dtypes, shapes, numbers)
