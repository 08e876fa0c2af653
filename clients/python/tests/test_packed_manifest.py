"""A real daemon's packed manifest (docs/spec/manifest-packed.md) is the manifest its JSON forms
carry: the client's attach, which asks for it, gets the tensors, names, dtypes, shapes and places
that a request for columns and one for objects get, under both layouts, and every view reads the
bytes at its place in the segment."""

import mmap
import os

import pytest

torch = pytest.importorskip("torch")

from daemon_fixture import DEVICE, REPO, Daemon  # noqa: E402
from weightd_client import expected_fingerprint  # noqa: E402
from weightd_client.columns import TensorColumns  # noqa: E402
from weightd_client.packed_manifest import unpack_manifest  # noqa: E402

pytestmark = pytest.mark.skipif(DEVICE != "host", reason="reads the segment's bytes through its memfd")
MODEL = str(REPO / "examples" / "tiny-llama")


@pytest.fixture(scope="module")
def daemon():
    with Daemon(MODEL, ["--layouts", "checkpoint,vllm"]) as d:
        yield d


@pytest.mark.parametrize("layout", ["checkpoint", "vllm"])
def test_packed_manifest_is_the_json_manifest_and_every_view_reads_its_bytes(daemon, layout):
    fp = expected_fingerprint(MODEL, 1, 0).fingerprint
    client = daemon.client()
    try:
        body = {"fingerprint": fp, "pid": os.getpid(), "mode": "map", **({} if layout == "checkpoint" else {"layout": layout})}
        packed = client.conn.request("get_state", **body, packed=True, columns=True)
        columns = client.conn.request("get_state", **body, columns=True)
        objects = client.conn.request("get_state", **body)
        assert isinstance(packed["packed"], (bytes, bytearray)), "asked for packed: the frame after the reply"
        assert "columns" in columns and "tensors" in objects and "packed" not in columns and "packed" not in objects
        tensors = unpack_manifest(packed["packed"])
        assert list(tensors) == list(TensorColumns(columns["columns"])) == objects["tensors"]
        assert len(tensors) > 0
        for key in ("aliases", "segments", "layout", "fingerprint"):
            assert packed[key] == columns[key] == objects[key], key

        attached = client.attach(fp, layout=layout, tensor_format="torch")
        fds = client.segment_fds(attached.lease_id)
        try:
            segments = {s: mmap.mmap(fd, 0, prot=mmap.PROT_READ) for s, fd in fds.items()}
            for t in tensors:
                view = attached.tensors[t["name"]]
                assert list(view.shape) == t["shape"], t["name"]
                raw = segments[t["segment"]][t["offset"] : t["offset"] + t["bytes"]]
                assert view.contiguous().view(torch.uint8).numpy().tobytes() == raw, t["name"]
            for m in segments.values():
                m.close()
        finally:
            for fd in fds.values():
                os.close(fd)
            attached.detach()
        for lease in (packed, columns, objects):
            client.detach(lease["leaseId"])
    finally:
        client.close()
