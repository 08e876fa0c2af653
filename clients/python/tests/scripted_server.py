"""A scripted weightd socket for client tests that need a daemon's exact replies (an older
daemon's, a wrong one) rather than a real daemon: one connection, each request answered in turn."""

import os
import shutil
import socket
import tempfile
import threading
import time

from weightd_client.protocol import encode_frame, read_frame


def scripted_server(testcase, replies):
    """Listens on a fresh socket and answers the i-th request with ``{"id", "ok": True,
    **replies[i](request)}``, then closes. Returns the socket's path, the list the requests are
    recorded in, and the serving thread."""
    d = tempfile.mkdtemp()
    testcase.addCleanup(shutil.rmtree, d, True)
    path = os.path.join(d, "s.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen()
    seen = []

    def run():
        conn, _ = srv.accept()
        for reply in replies:
            req = read_frame(conn, time.monotonic() + 5)
            seen.append(req)
            conn.sendall(encode_frame({"id": req["id"], "ok": True, **reply(req)}))
        conn.close()
        srv.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return path, seen, thread
