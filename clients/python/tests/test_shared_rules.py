"""The rules both clients implement, checked against the vectors the TypeScript tests read too
(test/vectors, specified in docs/spec): socket file names and process liveness."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from weightd_client.client import device_file_stem
from weightd_client.liveness import is_process_alive, start_time_from_stat, start_time_of

VECTORS = Path(__file__).resolve().parents[3] / "test" / "vectors"


def load(name):
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("v", load("socket-names.json")["vectors"], ids=lambda v: v["why"])
def test_socket_name(v):
    assert device_file_stem(v["id"]) == v["stem"]


@pytest.mark.parametrize("v", load("liveness.json")["stat"], ids=lambda v: v["why"])
def test_start_time_from_stat(v):
    assert start_time_from_stat(v["line"]) == v["startTime"]


@pytest.fixture(scope="module")
def pids():
    # A child that has exited and been waited for: its pid names no process now.
    reaped = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    return {"self": os.getpid(), "reaped": int(reaped.stdout), "init": 1}


@pytest.mark.parametrize("v", load("liveness.json")["alive"], ids=lambda v: v["why"])
def test_alive(v, pids):
    own = start_time_of(os.getpid())
    assert own, "this test needs /proc"
    pid = pids[v["pid"]] if isinstance(v["pid"], str) else v["pid"]
    start = {"self": own, "wrong": own + "1", None: None}[v["startTime"]]
    assert is_process_alive(pid, start) is v["alive"]
