"""The torch views an attach makes in bulk (bulk_views.column_views, through torch_by_name): for
every tensor of a mixed-dtype manifest, the same dtype, shape, strides, storage offset and bytes
as the view made for that tensor alone (SegmentViews.view); made in few torch calls where the
layout repeats; and as read-only as before, on a sealed memfd mapped by HostMapping."""

import mmap
import os
import signal
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from weightd_client.columns import TensorColumns  # noqa: E402
from weightd_client.host import segment_views  # noqa: E402
from weightd_client.tensors import torch_by_name  # noqa: E402

# One layer's tensors: plain ones of every width, and the kinds that need SegmentViews.view (a
# packed F4, an empty one, a BF16 at an odd byte).
LAYER = [
    ("norm", "F32", [64]),
    ("w", "BF16", [32, 16]),
    ("scale", "F32", []),
    ("fp8", "F8_E4M3", [8, 4]),
    ("idx", "I64", [3]),
    ("mask", "BOOL", [5]),
    ("packed", "F4", [6]),
    ("empty", "F16", [0, 3]),
    ("w2", "BF16", [32, 16]),
]
LAYERS = 40


def nbytes(dtype, shape):
    n = 1
    for d in shape:
        n *= d
    return n // 2 if dtype == "F4" else n * {"F32": 4, "BF16": 2, "F8_E4M3": 1, "I64": 8, "BOOL": 1, "F16": 2}[dtype]


def manifest(align):
    """A head tensor, LAYERS repeating layers, an odd-offset BF16 in each, and a tail; each tensor
    at the next multiple of ``align`` bytes (1: packed, so runs of BF16 steps are odd)."""
    tensors, offset = [], 0

    def add(name, dtype, shape, at=None):
        nonlocal offset
        start = offset if at is None else at
        tensors.append({"name": name, "dtype": dtype, "shape": shape, "segment": 0, "offset": start, "bytes": nbytes(dtype, shape)})
        offset = -(-(start + nbytes(dtype, shape)) // align) * align

    add("head", "BF16", [7, 3])
    for i in range(LAYERS):
        for name, dtype, shape in LAYER:
            add(f"layers.{i}.{name}", dtype, shape)
        add(f"layers.{i}.odd", "BF16", [3], at=offset + 1)
    add("tail", "F32", [2, 2])
    size = offset
    add("outside", "F32", [4], at=size + 4096)  # past the segment's end: refused, as before
    return tensors[:-1], size, tensors[-1]


def mapped(align):
    tensors, size, outside = manifest(align)
    mm = mmap.mmap(-1, size)
    mm.write(bytes((i * 37 + 11) % 256 for i in range(size)))
    return tensors, mm, outside


@pytest.fixture(params=[256, 1], ids=["aligned", "packed"])
def segment(request):
    return mapped(request.param)


def state_of(tensors):
    return {"tensors": TensorColumns.from_objects(tensors), "aliases": {"lm_head": "layers.0.w"}}


def test_every_view_equals_the_one_made_for_its_tensor_alone(segment):
    tensors, mm, _ = segment
    seg = segment_views(mm)
    got = torch_by_name(state_of(tensors), lambda s: seg)
    assert list(got) == [t["name"] for t in tensors] + ["lm_head"]
    assert got["lm_head"] is got["layers.0.w"]
    for t in tensors:
        view, alone = got[t["name"]], seg.view(t)
        assert (view.dtype, view.shape, view.stride()) == (alone.dtype, alone.shape, alone.stride()), t["name"]
        assert view.data_ptr() == alone.data_ptr() or not t["bytes"], t["name"]
        if view.untyped_storage().data_ptr() == seg.raw.data_ptr():
            assert view.storage_offset() == alone.storage_offset(), t["name"]
        assert bytes(view.reshape(-1).view(torch.uint8).numpy()) == bytes(alone.reshape(-1).view(torch.uint8).numpy()), t["name"]


def test_the_views_are_plain_tensors_over_the_segment_not_autograd_views(segment):
    # Autograd's view tracking was half of each view's cost (bulk_views' docstring).
    tensors, mm, _ = segment
    seg = segment_views(mm)
    got = torch_by_name(state_of(tensors), lambda s: seg)
    for name, view in got.items():
        assert not view._is_view() and view._base is None, name
        assert not view.requires_grad and not view.is_inference(), name
    for t in tensors:
        if seg.view(t).untyped_storage().data_ptr() == seg.raw.data_ptr():  # not one with bytes of its own
            assert got[t["name"]].untyped_storage().data_ptr() == seg.raw.data_ptr(), t["name"]
    # Usable as autograd leaves, as before: a parameter over the same memory, and a graph through it.
    w = got["layers.3.w"]
    assert torch.nn.Parameter(w, requires_grad=False).data_ptr() == w.data_ptr()
    x = torch.ones(16, requires_grad=True)
    (w.float() @ x).sum().backward()
    assert torch.allclose(x.grad, w.float().sum(0), equal_nan=True)


def test_a_repeating_layout_is_viewed_in_few_torch_calls():
    all_tensors, mm, _ = mapped(256)
    # The kinds SegmentViews.view makes one at a time left out: the plain views are what is counted.
    tensors = [t for t in all_tensors if t["name"].rsplit(".", 1)[-1] not in ("packed", "empty", "odd")]
    seg = segment_views(mm)
    calls = []

    class Count(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            calls.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    for dtype in {t["dtype"] for t in tensors}:
        seg.base(dtype)  # the per-dtype bases, made once per segment either way
    with Count():
        torch_by_name(state_of(tensors), lambda s: seg)
    # A few calls per tensor of the layer, for all the layers at once (one at a time: three per tensor).
    assert len(calls) < len(tensors) / 4, f"{len(calls)} torch calls for {len(tensors)} tensors"


def test_without_numpy_each_tensor_is_made_alone_and_the_same(segment, monkeypatch):
    # The run search compares the columns with numpy (torch loads it where it is installed).
    tensors, mm, _ = segment
    seg = segment_views(mm)
    with_numpy = torch_by_name(state_of(tensors), lambda s: seg)
    monkeypatch.setitem(sys.modules, "numpy", None)
    calls = []

    class Count(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            calls.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    with Count():
        got = torch_by_name(state_of(tensors), lambda s: seg)
    assert calls.count("unbind") == 0 and calls.count("as_strided") >= len(tensors) - 3 * LAYERS
    assert list(got) == list(with_numpy)
    for name, view in got.items():
        alone = with_numpy[name]
        assert (view.dtype, view.shape, view.stride(), view.data_ptr()) == (alone.dtype, alone.shape, alone.stride(), alone.data_ptr()), name


def test_a_tensor_past_its_segment_is_refused(segment):
    tensors, mm, outside = segment
    seg = segment_views(mm)
    from weightd_client.protocol import ProtocolError

    with pytest.raises(ProtocolError, match="lies outside its segment"):
        torch_by_name(state_of([*tensors, outside]), lambda s: seg)


WRITER = r"""
import fcntl, os, sys
sys.path.insert(0, sys.argv[1])
from weightd_client.host import HostMapping, SERVED_SEALS
sys.path.insert(0, os.path.dirname(sys.argv[2]))
from test_bulk_views import manifest
tensors, size, _ = manifest(256)
fd = os.memfd_create("weightd-test", os.MFD_ALLOW_SEALING)
os.write(fd, bytes(size))
fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SERVED_SEALS)
m = HostMapping({"segments": [{"segment": 0, "bytes": size, "handle": "fd"}], "tensors": tensors, "aliases": {}}, {0: fd}, "torch")
print("mapped", flush=True)
m.tensors["layers.20.w"].add_(1)
print("written", flush=True)
"""


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="sealed memfds are Linux's")
def test_a_write_through_a_bulk_view_is_refused_by_the_read_only_mapping():
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", WRITER, os.path.dirname(here), os.path.abspath(__file__)], capture_output=True, text=True, timeout=120)
    assert r.stdout.splitlines() == ["mapped"], r.stderr[-2000:]
    assert r.returncode == -signal.SIGSEGV, r.stderr[-2000:]
