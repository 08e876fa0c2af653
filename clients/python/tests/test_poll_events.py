"""poll_events when the daemon drops a watcher saying why (E_EVENTS_NOT_READ, docs/protocol.md,
Events): the caller gets the daemon's code and message, not a complaint about the frame, and the
events that came before it are not lost, also when a request is what finds the connection closed
(it goes on a new connection)."""

import socket
import threading
import time
import unittest

from scripted_server import listening_socket
from weightd_client.protocol import Connection, ServeError, encode_frame, read_frame

EVENT = {"id": None, "ok": True, "event": "model_ready", "model": "m", "fingerprint": "fp", "version": 1}
DROPPED = {"id": None, "ok": False, "error": {"code": "E_EVENTS_NOT_READ", "message": "this connection left events unread for 61000 ms", "details": {"limitMs": 60000}}}


def dropping_server(testcase):
    """Answers a watch, sends an event and the drop, and closes; then answers one ping on a second connection."""
    path, srv = listening_socket(testcase)
    dropped, answered = threading.Event(), threading.Event()

    def run():
        conn, _ = srv.accept()
        req = read_frame(conn, time.monotonic() + 5)
        conn.sendall(encode_frame({"id": req["id"], "ok": True, "watching": ["m"], "versions": []}))
        conn.sendall(encode_frame(EVENT))
        conn.sendall(encode_frame(DROPPED))
        conn.close()
        dropped.set()
        srv.settimeout(5)
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            return
        req = read_frame(conn, time.monotonic() + 5)
        conn.sendall(encode_frame({"id": req["id"], "ok": True, "status": "serving"}))
        conn.close()
        srv.close()
        answered.set()

    threading.Thread(target=run, daemon=True).start()
    return path, dropped, answered


class PollEventsTest(unittest.TestCase):
    def test_a_drop_with_a_reason_raises_its_code_and_keeps_the_events_before_it(self):
        path, dropped, _ = dropping_server(self)
        c = Connection(path, timeout=5)
        c.request("watch", model="m")
        dropped.wait(5)
        with self.assertRaises(ServeError) as caught:
            c.poll_events(timeout=2)
        self.assertEqual(caught.exception.code, "E_EVENTS_NOT_READ")
        self.assertIn("closed this connection: this connection left events unread for 61000 ms", str(caught.exception))
        self.assertEqual(caught.exception.details, {"limitMs": 60000})
        self.assertEqual([e["fingerprint"] for e in c.poll_events()], ["fp"])

    def test_a_request_that_finds_the_drop_goes_on_a_new_connection_and_the_drop_and_events_wait_for_poll_events(self):
        path, dropped, answered = dropping_server(self)
        c = Connection(path, timeout=5)
        c.request("watch", model="m")
        dropped.wait(5)
        time.sleep(0.1)
        self.assertEqual(c.request("ping")["status"], "serving")
        # The new connection closed (as a daemon closes an idle one) before the caller polls:
        # the drop and the events still come first, whatever the timing.
        answered.wait(5)
        with self.assertRaises(ServeError) as caught:
            c.poll_events()
        self.assertEqual(caught.exception.code, "E_EVENTS_NOT_READ")
        self.assertEqual([e["fingerprint"] for e in c.poll_events()], ["fp"])
        with self.assertRaises(ServeError) as caught:
            c.poll_events()
        self.assertEqual(caught.exception.code, "E_DISCONNECTED", "then the closed connection, said once")
        self.assertEqual(c.poll_events(), [])


if __name__ == "__main__":
    unittest.main()
