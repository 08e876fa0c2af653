"""A scripted weightd socket for client tests that need a daemon's exact replies (an older
daemon's, a wrong one) rather than a real daemon: one connection, each request answered in turn."""

import os
import shutil
import socket
import tempfile
import threading
import time

from weightd_client.protocol import encode_frame, read_frame


def listening_socket(testcase):
    """A Unix socket listening in a fresh directory the test removes: ``(path, socket)``."""
    d = tempfile.mkdtemp()
    testcase.addCleanup(shutil.rmtree, d, True)
    path = os.path.join(d, "s.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen()
    return path, srv


def scripted_server(testcase, replies, wait_close=False):
    """Listens on a fresh socket and answers the i-th request with ``{"id", "ok": True,
    **replies[i](request)}`` (a ``(fields, fds)`` pair sends those descriptors with the frame),
    then closes. Returns the socket's path, the list the requests are recorded in, and the serving
    thread. ``wait_close``: after the replies it waits (10 s at most) for the client to close its
    side first, and records ``"closed by client"`` or ``"left open"`` last."""
    path, srv = listening_socket(testcase)
    seen = []

    def run():
        conn, _ = srv.accept()
        for reply in replies:
            req = read_frame(conn, time.monotonic() + 5)
            seen.append(req)
            fields = reply(req)
            fields, fds = fields if isinstance(fields, tuple) else (fields, [])
            frame = encode_frame({"id": req["id"], "ok": True, **fields})
            if fds:
                socket.send_fds(conn, [frame], fds)
            else:
                conn.sendall(frame)
        if wait_close:
            conn.settimeout(10)
            try:
                seen.append("closed by client" if conn.recv(1) == b"" else "sent more")
            except socket.timeout:
                seen.append("left open")
        conn.close()
        srv.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return path, seen, thread
