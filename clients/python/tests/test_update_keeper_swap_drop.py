"""A hot swap's reply, with ``--keeper``, comes only once the keeper no longer holds the versions
it replaced (issue 31, docs/weight-updates.md, "Replies only once kept"). Before, the drained
versions' records were dropped as the new version served, and the reply did not wait: a crash in
between restarted on the command line's model with its written version current, the one the swap's
reply said was gone. The keeper's DROPs are held here by a proxy in front of it
(keeper_proxy.py), so that moment lasts as long as the test needs.

- Held for a second, then passed on: no reply while held; a crash right after the reply restarts
  on version 0 of the command line's checkpoint. Without the wait the reply comes while the drop
  is held, the crash takes the drop with it, and the restart serves written version 2 as current.
- Held for good (after the first DROP passed): the swap is refused with E_VERSION_NOT_KEPT, nothing
  of it serves, version 2 stays current and every older version's record is kept again (the one
  dropped too), so a crash then restarts on version 2, as the refusal says."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from daemon_fixture import DEVICE, MAIN_JS, Daemon
from test_host_fds import MODEL
from test_switch import wait_for
from test_update_keeper import NAME, end, kept, kept_current, write_two_versions
from test_update_keeper_swap import all_versions, serving_model_dir
from versions import other_version

pytestmark = pytest.mark.skipif(DEVICE != "host", reason="writers are built on the host backend")

PROXY = Path(__file__).with_name("keeper_proxy.py")


@pytest.fixture
def node():
    """A keeper of its own (weightd keeper, in the socket directory), a proxy in front of it, and
    ``start(proxied)``: a daemon with --keeper external on model kv, through the proxy or not."""
    with tempfile.TemporaryDirectory(prefix="weightd-swapdrop-") as tmp:
        tmp = Path(tmp)
        model = str(tmp / NAME)
        other_version(MODEL, model, 0)
        plan = tmp / "plan.json"
        plan.write_text(json.dumps({"rules": [], "segmentBytes": 1 << 20}))
        socket_dir, proxy_dir = tmp / "sockets", tmp / "proxy"
        os.mkdir(socket_dir, 0o700)
        os.mkdir(proxy_dir, 0o700)
        keeper = subprocess.Popen(["node", str(MAIN_JS), "keeper", "--weight-cache-socket-dir", str(socket_dir)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_for(lambda: (socket_dir / "keeper.sock").exists())
        proxy_sock = proxy_dir / "keeper.sock"
        proxy = subprocess.Popen([sys.executable, str(PROXY), str(proxy_sock), str(socket_dir / "keeper.sock"), str(proxy_dir)])
        assert wait_for(lambda: (proxy_dir / "held").exists())
        started = []

        def start(proxied):
            via = ["--keeper-socket", str(proxy_sock)] if proxied else []
            d = Daemon(model, ["--keeper", "external", *via, "--plan-file", str(plan)], socket_dir=str(socket_dir), host_device=f"sd{os.getpid()}")
            started.append(d)
            return d

        def stop_proxy():
            """The keeper holds what was kept through the proxy as the proxy's: gone, a restart adopts it."""
            proxy.kill()
            proxy.wait(30)

        yield start, model, tmp, proxy_dir, stop_proxy
        for d in started:
            d.stop()
        stop_proxy()
        keeper.send_signal(signal.SIGTERM)
        keeper.wait(30)


def swap(daemon, model, tmp):
    """``weightd ctl load`` of ``model`` under kv, in the background."""
    return subprocess.Popen(["node", str(MAIN_JS), "ctl", "--weight-cache-socket-dir", daemon.socket_dir, "load", "--model", model, "--name", NAME, "-tp", "1", "--plan-file", str(tmp / "plan.json")],
                            env={**os.environ, "WEIGHTD_HOST_DEVICES": daemon.device}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def held(proxy_dir):
    return int((proxy_dir / "held").read_text())


def test_a_swap_replies_only_once_the_keeper_dropped_what_it_replaced(node):
    start, model, tmp, proxy_dir, stop_proxy = node
    other = str(tmp / "other")
    other_version(model, other, 0x0F)
    daemon = start(proxied=True)
    write_two_versions(daemon)
    (proxy_dir / "hold").write_text("0")
    swapping = swap(daemon, other, tmp)
    assert wait_for(lambda: held(proxy_dir) >= 1), "the swap asks the keeper to drop the versions it replaces"
    time.sleep(1.0)
    replied_while_held = swapping.poll() is not None
    if replied_while_held:
        # The crash point: the reply is out, the keeper has not dropped the records yet.
        end(daemon, "SIGKILL")
    (proxy_dir / "hold").unlink()
    out, err = swapping.communicate(timeout=120)
    if not replied_while_held:
        assert swapping.returncode == 0, out + err
        assert all_versions(daemon, NAME) == {0: True} and serving_model_dir(daemon, NAME) == {other}
        assert not [s for s in kept(daemon) if s["version"] not in (0, None)], "the reply means the keeper holds no written version of kv"
        end(daemon, "SIGKILL")
    stop_proxy()

    daemon = start(proxied=False)
    # The command line names the first directory, and wins over the swapped-in one's load request.
    assert all_versions(daemon, NAME) == {0: True}, daemon.stderr
    assert serving_model_dir(daemon, NAME) == {model}
    assert not replied_while_held, "the swap replied before the keeper dropped the versions it replaced"


def test_a_swap_the_keeper_does_not_drop_for_is_refused_and_changes_nothing(node):
    start, model, tmp, proxy_dir, stop_proxy = node
    other = str(tmp / "other")
    other_version(model, other, 0x0F)
    daemon = start(proxied=True)
    write_two_versions(daemon)
    # The first DROP passes (a shard of a version the swap replaces), every later one is held for good.
    (proxy_dir / "hold").write_text("1")
    out, err = swap(daemon, other, tmp).communicate(timeout=120)
    assert "E_VERSION_NOT_KEPT" in out + err, out + err
    assert held(proxy_dir) >= 1
    assert all_versions(daemon, NAME) == {0: False, 1: False, 2: True}, "nothing of the swap serves"
    assert serving_model_dir(daemon, NAME) == {model}
    # Every version it would have replaced is kept again, the one whose drop passed too, and 2 is current.
    assert sorted(s["version"] for s in kept(daemon)) == [0, 1, 2] and kept_current(daemon)[0] == 2, kept(daemon)
    end(daemon, "SIGKILL")
    (proxy_dir / "hold").unlink()
    stop_proxy()

    daemon = start(proxied=False)
    assert all_versions(daemon, NAME) == {0: False, 1: False, 2: True}, daemon.stderr
    assert serving_model_dir(daemon, NAME) == {model}
