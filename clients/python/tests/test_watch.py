"""Watch notifications (docs/protocol.md, Events) over a real daemon: a client that watches a model
name hears, on its connection, that a newer version is ready and that its own is being dropped
(with the version to move to), and its connection answers requests after them."""

import os
import shutil
import struct
import subprocess

from daemon_fixture import MAIN_JS, REPO, Daemon
from weightd_client import expected_fingerprint

MODEL = str(REPO / "examples" / "tiny-llama")


def write_variant(to: str) -> str:
    """Another version of the example: every data byte inverted (test/helpers/variantCheckpoint.ts)."""
    shutil.copytree(MODEL, to)
    for name in os.listdir(to):
        if not name.endswith(".safetensors"):
            continue
        path = os.path.join(to, name)
        with open(path, "rb") as f:
            data = bytearray(f.read())
        start = 8 + struct.unpack("<Q", data[:8])[0]
        data[start:] = bytes(b ^ 0xFF for b in data[start:])
        with open(path, "wb") as f:
            f.write(data)
    return to


def test_a_watcher_hears_the_new_version_ready_and_its_own_dropping(tmp_path):
    v2 = write_variant(str(tmp_path / "v2"))
    with Daemon(MODEL) as daemon:
        client = daemon.client(0)
        v1fp = expected_fingerprint(MODEL, 1, 0).fingerprint
        v2fp = expected_fingerprint(v2, 1, 0).fingerprint
        watching = client.watch("tiny-llama")
        assert watching["watching"] == ["tiny-llama"]
        assert [v["fingerprint"] for v in watching["versions"]] == [v1fp]
        assert client.events() == [], "nothing happened yet"

        load = subprocess.run(
            ["node", str(MAIN_JS), "ctl", "--weight-cache-socket-dir", daemon.socket_dir, "load", "--model", v2, "--name", "tiny-llama"],
            capture_output=True, text=True, timeout=120,
        )
        assert load.returncode == 0, load.stderr
        events = client.events(timeout=30)
        while len(events) < 2:
            more = client.events(timeout=30)
            assert more, f"only {events} heard"
            events += more
        assert [(e["event"], e["fingerprint"], e.get("newer")) for e in events] == [
            ("model_ready", v2fp, None),
            ("model_dropping", v1fp, v2fp),
        ]
        assert client.ping()["fingerprint"] == v2fp, "the connection answers after the events"
        client.close()
