"""A mapping's next switch, prepared while the engine still computes (issue 31).

An engine that follows versions through calls that give no moment ahead of the switch (vLLM's
``update_weights``: the trainer commits, then asks every engine to switch) would import the new
version's allocations inside its stall: on an H100 a switch of 8.24 GB took 10.9-13.4 ms that way
and 4.7 ms prepared (bench/RESULTS.md). The daemon says when a version is ready (``model_ready``,
sent once every rank committed), which is before any trainer can ask the engines to switch: here a
thread hears it and prepares the switch (``WeightdClient.prepare_switch``: the version's lease, the
imports of the segments it does not share), so the switch itself only remaps.

At most one switch is held prepared, for the newest version heard. It is given back when a newer
version's event comes, when its version drains (``model_dropping``: a held lease would keep a
replaced version's memory), when the switch goes elsewhere, and at ``stop``. A prepare that fails
(another placement under the name, say) is logged and left to the switch, which fails the same way
and says so to its caller. The thread's watch lives on a connection of its own; when the daemon
goes away (a restart) it watches again once a socket answers.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Dict, Iterator, List, Optional

from .client import Mismatch, PendingSwitch, WeightdClient

log = logging.getLogger("weightd_client")

# How long the thread waits for an event before it looks at whether it is stopped, and between
# two tries to reach a daemon that went away.
POLL_SECONDS = 1.0


class SwitchAhead:
    """Watches the names that serve ``mapping``'s version on ``socket_path`` (``names``: those,
    if given) and prepares ``mapping``'s switch to each version they make ready.
    ``switching(fingerprint, client)`` hands the switch what was prepared."""

    def __init__(self, socket_path: str, mapping: Any, layout: str, names: Optional[List[str]] = None) -> None:
        self.socket_path, self.mapping, self.layout = socket_path, mapping, layout
        self._names = names
        # Held while a switch is prepared or done (a prepare never runs beside a switch), and
        # notified when what is held changes.
        self._changed = threading.Condition()
        self._pending: Optional[PendingSwitch] = None
        self._stopping = threading.Event()
        # The watch's connection does nothing else: a request on it could meet a close and go on
        # a new connection, which would watch nothing. The thread's requests go on another.
        self._watch: Optional[WeightdClient] = None
        self._requests: Optional[WeightdClient] = None
        self._thread = threading.Thread(target=self._run, name="weightd-switch-ahead", daemon=True)

    def start(self) -> "SwitchAhead":
        """Connects and watches now, so that a daemon that names none of the mapped version's
        names is said at once (ValueError); the events are heard on the thread from here on."""
        self._watch = self._watching()
        self._thread.start()
        return self

    @property
    def names(self) -> List[str]:
        return list(self._names or [])

    def prepared(self, fingerprint: str, timeout: float = 0.0) -> bool:
        """Whether the switch to ``fingerprint`` is prepared; waits up to ``timeout`` seconds for it."""
        with self._changed:
            return self._changed.wait_for(lambda: self._pending is not None and self._pending.fingerprint == fingerprint, timeout)

    def idle(self, timeout: float = 0.0) -> bool:
        """Whether no switch is held prepared; waits up to ``timeout`` seconds for that."""
        with self._changed:
            return self._changed.wait_for(lambda: self._pending is None, timeout)

    @contextlib.contextmanager
    def switching(self, fingerprint: str, client: WeightdClient) -> Iterator[Optional[PendingSwitch]]:
        """For the block that switches ``mapping`` to ``fingerprint``: the switch prepared for it
        against what the mapping maps now (the block finishes it: ``client.finish_switch``), or
        None (the block prepares it itself). No prepare runs meanwhile. A switch held for
        another version, or against a mapping that switched since, is given back here, on
        ``client``'s connection (a map lease is the process's, on any of its connections)."""
        with self._changed:
            pending, self._pending = self._pending, None
            if pending is not None and (pending.fingerprint != fingerprint or pending.prepared.against is not self.mapping.state):
                _drop(client, self.mapping, pending)
                pending = None
            try:
                yield pending
            finally:
                self._changed.notify_all()

    def stop(self) -> None:
        """Stops the thread and gives back a switch it holds prepared (idempotent)."""
        self._stopping.set()
        watch = self._watch
        if watch is not None:
            watch.conn.interrupt()  # wakes the thread's wait for events
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        with self._changed:
            pending, self._pending = self._pending, None
            self._changed.notify_all()
        if pending is not None:
            self._give_back(pending)

    def _give_back(self, pending: PendingSwitch) -> None:
        """Drops a held switch on a connection of its own (the thread's may be closed): its
        imports always, its lease where the daemon answers (else it ends with the process)."""
        try:
            self.mapping.discard(pending.prepared)
        finally:
            try:
                with WeightdClient(self.socket_path) as client:
                    client.detach(pending.state["leaseId"])
            except Exception as err:  # noqa: BLE001 - nothing waits on a stop
                log.info("weightd: the lease of the switch prepared for %s ends with this process (%s)", pending.fingerprint[:12], err)

    def _watching(self) -> WeightdClient:
        """A client on the socket that watches the names (found from the daemon's models that
        serve the mapped version, when not given)."""
        client = WeightdClient(self.socket_path)
        try:
            if self._names is None:
                mapped = self.mapping.state["fingerprint"]
                self._names = sorted({m["name"] for m in client.ping().get("models") or [] if m.get("fingerprint") == mapped and m.get("name")})
                if not self._names:
                    raise ValueError(f"the daemon at {self.socket_path} names no model that serves the mapped version {mapped[:12]}; pass the names to watch")
            for name in self._names:
                client.watch(name)
        except BaseException:
            client.close()
            raise
        return client

    def _run(self) -> None:
        caught_up = False
        try:
            while not self._stopping.is_set():
                try:
                    if self._watch is None:
                        self._watch, caught_up = self._watching(), False
                    if not caught_up:
                        self._catch_up()
                        caught_up = True
                    for event in self._watch.events(timeout=POLL_SECONDS):
                        self._heard(event)
                    if not self._watch.conn.connected:
                        raise ConnectionError("the daemon closed the watching connection")
                except Exception as err:  # noqa: BLE001 - the thread's own: logged, and it watches again
                    if self._stopping.is_set():
                        break
                    log.info("weightd: watching %s for versions to prepare stopped (%s); watching again once it answers", self.socket_path, err)
                    for client in (self._watch, self._requests):
                        if client is not None:
                            client.close()
                    self._watch = self._requests = None
                    self._stopping.wait(POLL_SECONDS)
        finally:
            for client in (self._watch, self._requests):
                if client is not None:
                    client.close()

    def _catch_up(self) -> None:
        """What a watch made now has not heard: the version that serves as current under each
        name (made ready before the watch began, or while the daemon was away), prepared as if
        its model_ready had come. Asked after the watch, so nothing falls between the two."""
        for m in self._requester().ping().get("models") or []:
            if m.get("name") in self.names and m.get("status") == "serving" and m.get("current", True):
                self._heard({"event": "model_ready", "fingerprint": m["fingerprint"]})

    def _requester(self) -> WeightdClient:
        """The thread's client for requests (made when first needed, again after a failure)."""
        if self._requests is None:
            self._requests = WeightdClient(self.socket_path)
        return self._requests

    def _heard(self, event: Dict[str, Any]) -> None:
        kind, fingerprint = event.get("event"), event.get("fingerprint")
        if kind not in ("model_ready", "model_dropping") or not fingerprint:
            return
        client = self._requester()
        with self._changed:
            pending = self._pending
            if kind == "model_dropping":
                if pending is not None and pending.fingerprint == fingerprint:
                    self._pending = None
                    _drop(client, self.mapping, pending)
                    self._changed.notify_all()
                return
            if pending is not None and pending.fingerprint == fingerprint:
                return
            # A newer version than the one held: that one will not be switched to first.
            if pending is not None:
                self._pending = None
                _drop(client, self.mapping, pending)
                self._changed.notify_all()
            if fingerprint == self.mapping.state["fingerprint"] or self._stopping.is_set():
                return
            try:
                got = client.prepare_switch(self.mapping, fingerprint, None, self.layout)
            except Exception as err:  # noqa: BLE001 - the switch, if asked, fails the same way and says so
                log.info("weightd: preparing the switch to %s failed (%s); a switch to it will do it then", fingerprint[:12], err)
                return
            if isinstance(got, Mismatch):
                return
            self._pending = got
            self._changed.notify_all()


def _drop(client: WeightdClient, mapping: Any, pending: PendingSwitch) -> None:
    """Gives back a held switch: its imports always; its lease on ``client``'s connection, and a
    daemon that does not answer is logged (the lease ends with this process, or the daemon's
    sweep), so that what comes next (the switch, the next prepare) is not failed by it."""
    try:
        client.drop_switch(mapping, pending)
    except Exception as err:  # noqa: BLE001 - see above
        log.info("weightd: the lease of the switch prepared for %s was not dropped (%s); it ends with this process", pending.fingerprint[:12], err)
