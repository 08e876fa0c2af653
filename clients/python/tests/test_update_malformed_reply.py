"""A begin_update reply that lacks a field (a daemon of another version, a broken one) is refused
with E_BAD_REPLY naming the field, and leaves nothing behind: the connection closed (which is what
ends the update in the daemon), every received descriptor closed, nothing mapped. Against a
scripted server (no daemon needed), which hands over a real memfd."""

import os
import unittest

import pytest

from scripted_server import scripted_server
from weightd_client.protocol import ProtocolError
from weightd_client.update import Update

MEMFD_NAME = "weightd-test-malformed-update"
SEGMENT = {"segment": 0, "bytes": 4096}
TENSOR = {"name": "w", "dtype": "U8", "shape": [16], "segment": 0, "offset": 0, "bytes": 16}
REPLY = {"update": "u1", "model": "m", "base": "fp", "segments": [SEGMENT], "tensors": [TENSOR]}


def without(d, key):
    return {k: v for k, v in d.items() if k != key}


CASES = [(without(REPLY, k), repr(k)) for k in REPLY] + [
    ({**REPLY, "segments": [without(SEGMENT, "bytes")]}, "segment 0 of the begin_update reply lacks 'bytes'"),
    ({**REPLY, "tensors": [without(TENSOR, "offset")]}, "tensor 0 of the begin_update reply lacks 'offset'"),
]


def memfd_uses():
    """This process's descriptors and mappings of the test's memfd."""
    fds = [f for f in os.listdir("/proc/self/fd") if MEMFD_NAME in _link(f"/proc/self/fd/{f}")]
    with open("/proc/self/maps") as f:
        maps = [line for line in f if MEMFD_NAME in line]
    return len(fds), len(maps)


def _link(path):
    try:
        return os.readlink(path)
    except OSError:
        return ""


@pytest.mark.parametrize("reply,named", CASES, ids=[named for _, named in CASES])
def test_a_reply_lacking_a_field_is_refused_naming_it_and_leaves_nothing_open(reply, named):
    case = unittest.TestCase()
    memfd = os.memfd_create(MEMFD_NAME)
    try:
        os.ftruncate(memfd, SEGMENT["bytes"])
        path, seen, thread = scripted_server(case, [lambda req: (reply, [memfd])], wait_close=True)
        with pytest.raises(ProtocolError) as caught:
            Update(path, "m", "fp", timeout=5)
        # Still holding the exception (and through it the half-made Update), so that nothing is
        # let go by the garbage collector instead of by the client.
        assert caught.value.code == "E_BAD_REPLY"
        assert named in str(caught.value)
        thread.join(15)
        assert seen[-1] == "closed by client"
        assert memfd_uses() == (1, 0), "only the test's own descriptor of the memfd, and no mapping"
    finally:
        os.close(memfd)
        case.doCleanups()
