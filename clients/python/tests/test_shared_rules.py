"""The rules both clients implement, checked against the vectors the TypeScript tests read too
(test/vectors, specified in docs/spec): socket file names, process liveness, manifest columns and the
packed manifest."""

import array
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from weightd_client.client import device_file_stem, is_rank_socket_name
from weightd_client.columns import TensorColumns
from weightd_client.packed_manifest import unpack_manifest
from weightd_client.protocol import ProtocolError
from weightd_client.liveness import is_process_alive, start_time_from_stat, start_time_of, state_from_stat

VECTORS = Path(__file__).resolve().parents[3] / "test" / "vectors"


def load(name):
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("v", load("socket-names.json")["vectors"], ids=lambda v: v["why"])
def test_socket_name(v):
    assert device_file_stem(v["id"]) == v["stem"]


@pytest.mark.parametrize("v", load("socket-names.json")["sockets"], ids=lambda v: v["why"])
def test_rank_socket_name(v):
    assert is_rank_socket_name(v["name"]) is v["rank"]


@pytest.mark.parametrize("v", load("liveness.json")["stat"], ids=lambda v: v["why"])
def test_state_and_start_time_from_stat(v):
    assert state_from_stat(v["line"]) == v["state"]
    assert start_time_from_stat(v["line"]) == v["startTime"]


@pytest.fixture(scope="module")
def pids():
    # A child that has exited and been waited for: its pid names no process now.
    reaped = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    # One that has exited and that nobody has waited for: WNOWAIT leaves it a zombie (state Z).
    zombie = subprocess.Popen([sys.executable, "-c", ""])
    os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)
    yield {"self": os.getpid(), "reaped": int(reaped.stdout), "zombie": zombie.pid, "init": 1}
    zombie.wait()


@pytest.mark.parametrize("v", load("liveness.json")["alive"], ids=lambda v: v["why"])
def test_alive(v, pids):
    own = start_time_of(os.getpid())
    assert own, "this test needs /proc"
    pid = pids[v["pid"]] if isinstance(v["pid"], str) else v["pid"]
    start = {"self": own, "zombie": start_time_of(pids["zombie"]), "wrong": own + "1", None: None}[v["startTime"]]
    assert start is not None or v["startTime"] is None, "a zombie still has its /proc/<pid>/stat"
    assert is_process_alive(pid, start) is v["alive"]


@pytest.mark.parametrize("v", load("manifest-columns.json")["valid"], ids=lambda v: v["why"])
def test_manifest_columns_read_back_and_written(v):
    assert list(TensorColumns(v["columns"])) == v["tensors"]
    # An older daemon's objects, turned into columns, give the daemon's own columns.
    back = TensorColumns.from_objects(v["tensors"])
    assert {k: getattr(back, k) for k in ("name", "dtypes", "dtype", "shape", "segment", "offset", "bytes")} == {k: v["columns"][k] for k in ("name", "dtypes", "dtype", "shape", "segment", "offset", "bytes")}
    assert back.shapes == [tuple(s) for s in v["columns"]["shapes"]]


@pytest.mark.parametrize("v", load("manifest-columns.json")["invalid"], ids=lambda v: v["why"])
def test_manifest_columns_refused(v):
    with pytest.raises(ProtocolError) as err:
        TensorColumns(v["columns"])
    assert err.value.code == "E_BAD_MANIFEST"
    if v["mentions"] is not None:
        assert v["mentions"] in str(err.value)


@pytest.fixture(params=["numpy", "no numpy"])
def numpy_loaded(request, monkeypatch):
    """The packed manifest's checks run through numpy where the process has loaded it, else without."""
    if request.param == "numpy":
        pytest.importorskip("numpy")
    else:
        monkeypatch.setitem(sys.modules, "numpy", None)


@pytest.mark.parametrize("v", load("manifest-packed.json")["valid"], ids=lambda v: v["why"])
def test_packed_manifest_read(v, numpy_loaded):
    cols = unpack_manifest(bytes.fromhex(v["packed"]))
    assert list(cols) == v["tensors"]
    # Its numbers are held as arrays, no int object per tensor, and are lists once asked for by name.
    dtypes, shapes = cols.dtypes, cols.shapes
    for key, of in (("dtype", lambda t: dtypes.index(t["dtype"])), ("shape", lambda t: shapes.index(tuple(t["shape"]))), ("segment", None), ("offset", None), ("bytes", None)):
        want = [of(t) if of else t[key] for t in v["tensors"]]
        assert isinstance(cols.column(key), array.array), key
        if sys.modules.get("numpy") is not None:
            assert cols.array(key).tolist() == want, key
        assert getattr(cols, key) == want, key
        assert isinstance(cols.column(key), list) and cols.column(key) == want, key


@pytest.mark.parametrize("v", load("manifest-packed.json")["invalid"], ids=lambda v: v["why"])
def test_packed_manifest_refused(v, numpy_loaded):
    with pytest.raises(ProtocolError) as err:
        unpack_manifest(bytes.fromhex(v["packed"]))
    assert err.value.code == "E_BAD_MANIFEST"
    assert f"at byte {v['at']}: " in str(err.value) and v["mentions"] in str(err.value)


@pytest.mark.parametrize("piece", [1, 7])
def test_packed_manifest_names_decoded_a_piece_at_a_time_read_the_same(piece, monkeypatch):
    import weightd_client.packed_manifest as packed_manifest

    monkeypatch.setattr(packed_manifest, "_PIECE", piece)
    for v in load("manifest-packed.json")["valid"]:
        assert list(unpack_manifest(bytes.fromhex(v["packed"]))) == v["tensors"], v["why"]
    for v in load("manifest-packed.json")["invalid"]:
        with pytest.raises(ProtocolError) as err:
            unpack_manifest(bytes.fromhex(v["packed"]))
        assert f"at byte {v['at']}: " in str(err.value) and v["mentions"] in str(err.value), v["why"]


@pytest.mark.parametrize("v", load("jcs.json")["cases"], ids=lambda v: v["why"])
def test_canonical_json(v):
    rfc8785 = pytest.importorskip("rfc8785", reason="expected_fingerprint's dependency (pip install ./clients/python)")
    assert rfc8785.dumps(json.loads(v["json"])).decode("utf-8") == v["canonical"]


@pytest.mark.parametrize("v", load("jcs.json")["errors"], ids=lambda v: v["why"])
def test_canonical_json_refuses(v):
    rfc8785 = pytest.importorskip("rfc8785", reason="expected_fingerprint's dependency (pip install ./clients/python)")
    with pytest.raises(ValueError):
        rfc8785.dumps(json.loads(v["json"]))
