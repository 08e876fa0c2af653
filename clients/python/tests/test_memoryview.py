"""memoryview tensors (the stdlib-only format): every dtype's view is built on this Python."""

import struct

import pytest

from weightd_client.host import view_maker
from weightd_client.tensors import MEMORYVIEW_FORMAT

make = view_maker("memoryview")


def test_f16_is_half_where_cast_allows_it_else_its_bits():
    data = struct.pack("<4e", 1.5, -2.0, 0.0, 65504.0)
    view = make(bytearray(data), {"name": "w", "dtype": "F16", "shape": [2, 2], "offset": 0, "bytes": 8})
    assert view.tobytes() == data
    assert view.shape == (2, 2)
    try:
        memoryview(b"\0\0").cast("e")
    except ValueError:  # Python before 3.12
        assert view.format == "H"
        assert view.tolist() == [list(struct.unpack("<2H", data[:4])), list(struct.unpack("<2H", data[4:]))]
    else:
        assert view.format == "e"
        assert view.tolist() == [[1.5, -2.0], [0.0, 65504.0]]


@pytest.mark.parametrize("dtype", sorted(MEMORYVIEW_FORMAT))
def test_every_dtype_makes_a_view(dtype):
    size = struct.calcsize(MEMORYVIEW_FORMAT[dtype])
    data = bytes(range(3 * size))
    view = make(bytearray(data), {"name": "t", "dtype": dtype, "shape": [3], "offset": 0, "bytes": 3 * size})
    assert view.tobytes() == data and view.shape == (3,)
