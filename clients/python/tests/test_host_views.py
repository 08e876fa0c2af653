"""The host backend's torch views (SegmentViews, made by host.segment_views): one byte tensor per
segment and a strided view per tensor must give exactly what a tensor made from the buffer at
that offset gives, for every kind of entry a manifest holds, share the buffer's memory, and keep
the mapping open while any view lives."""

import mmap

import pytest

torch = pytest.importorskip("torch")

from weightd_client.host import segment_views, view_maker  # noqa: E402


def entry(name, dtype, shape, offset, nbytes):
    return {"name": name, "dtype": dtype, "shape": shape, "segment": 0, "offset": offset, "bytes": nbytes}


# Every kind of entry: 2-D and 1-D, a scalar, an empty tensor, packed F4 (flat bytes), an FP8,
# and a BF16 that starts at an odd byte (no multiple of its size: it needs a tensor of its own).
ENTRIES = [
    entry("w", "BF16", [4, 8], 0, 64),
    entry("b", "F32", [8], 64, 32),
    entry("scale", "F32", [], 96, 4),
    entry("empty", "F16", [0, 3], 100, 0),
    entry("packed", "F4", [6], 100, 3),
    entry("fp8", "F8_E4M3", [2, 3], 103, 6),
    entry("odd", "BF16", [3], 109, 6),
    entry("i64", "I64", [2], 120, 16),
]
SIZE = 136


def reference(buf, t):
    """What a tensor made from the buffer at its offset gives (the straightforward way)."""
    from weightd_client.tensors import torch_dtype

    dtype = torch_dtype(t["dtype"])
    if t["bytes"] == 0:
        return torch.empty(t["shape"], dtype=dtype)
    raw = torch.frombuffer(bytearray(buf[t["offset"] : t["offset"] + t["bytes"]]), dtype=torch.uint8)
    n = 1
    for d in t["shape"]:
        n *= d
    return raw.view(dtype).reshape(t["shape"] if n * dtype.itemsize == t["bytes"] else [-1])


@pytest.fixture
def segment():
    data = bytes((i * 37 + 11) % 256 for i in range(SIZE))
    mm = mmap.mmap(-1, SIZE)
    mm.write(data)
    yield mm, data
    try:
        mm.close()
    except BufferError:
        pass


def test_every_entry_is_viewed_with_the_bytes_dtype_and_shape_of_its_offset(segment):
    mm, data = segment
    seg = segment_views(mm)
    for t in ENTRIES:
        got, want = seg.view(t), reference(data, t)
        assert got.dtype == want.dtype and list(got.shape) == list(want.shape), t["name"]
        assert got.is_contiguous(), t["name"]
        assert bytes(got.reshape(-1).view(torch.uint8).numpy()) == bytes(want.reshape(-1).view(torch.uint8).numpy()), t["name"]


def test_views_share_the_mapping_and_keep_it_open_until_the_last_is_freed(segment):
    mm, _ = segment
    make = view_maker("torch")
    seg = segment_views(mm)
    views = {t["name"]: make(seg, t) for t in ENTRIES}
    mm[0:2] = b"\x80\x3f"  # bf16 1.0 at w[0, 0]: the view sees the mapping, it is no copy
    assert views["w"][0, 0].item() == 1.0
    del seg
    with pytest.raises(BufferError):
        mm.close()
    views.clear()
    mm.close()  # no view left: the mapping closes
