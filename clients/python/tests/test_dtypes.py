"""The dtype tables (docs/spec/dtypes.md) against test/vectors/dtypes.json, which the TypeScript
tests read too: the safetensors names the client views, the numpy, torch and memoryview type of
each, and the names it refuses."""

import json
from pathlib import Path

import pytest

from weightd_client.protocol import ProtocolError
from weightd_client.tensors import DTYPES, memoryview_format, numpy_dtype, torch_dtype

VECTORS = json.loads((Path(__file__).resolve().parents[3] / "test" / "vectors" / "dtypes.json").read_text(encoding="utf-8"))
ids = lambda d: d["name"] or "empty"  # noqa: E731


def test_the_dtypes_are_exactly_the_vectors():
    assert sorted(DTYPES) == sorted(d["name"] for d in VECTORS["dtypes"])


@pytest.mark.parametrize("d", VECTORS["dtypes"], ids=ids)
def test_numpy_view(d):
    np = pytest.importorskip("numpy")
    assert numpy_dtype(d["name"]) == d["numpy"]
    # A packed dtype (F4, F6_*) comes as its bytes; every other one an item per element.
    assert np.dtype(d["numpy"]).itemsize * 8 == max(d["bits"], 8)


@pytest.mark.parametrize("d", VECTORS["dtypes"], ids=ids)
def test_torch_view(d):
    torch = pytest.importorskip("torch")
    # A torch without the type (an older one and F8_E8M0, say) gives the raw bits as uint8.
    assert torch_dtype(d["name"]) == getattr(torch, d["torch"], torch.uint8)
    assert torch_dtype(d["name"]).itemsize * 8 == max(d["bits"], 8)


@pytest.mark.parametrize("d", VECTORS["dtypes"], ids=ids)
def test_memoryview_format(d):
    try:
        memoryview(bytes(2)).cast("e")
        half = "e"
    except ValueError:  # Python before 3.12: F16 comes as its bits
        half = "H"
    assert memoryview_format(d["name"]) == (half if d["memoryview"] == "e" else d["memoryview"])


@pytest.mark.parametrize("v", VECTORS["refused"], ids=lambda v: v["why"])
def test_refused(v):
    for view in (numpy_dtype, torch_dtype, memoryview_format):
        with pytest.raises(ProtocolError) as e:
            view(v["name"])
        assert e.value.code == "E_UNKNOWN_DTYPE"
        assert json.dumps(v["name"]) in str(e.value)
