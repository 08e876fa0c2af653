"""A stand-in for the keeper's socket that passes every request and reply on to the real keeper,
descriptors included, and holds DROP requests on demand: the moment between a daemon asking the
keeper to drop a record and the keeper doing it, made as long as a test needs.

    keeper_proxy.py LISTEN UPSTREAM CONTROL_DIR

While CONTROL_DIR/hold exists, a DROP (docs/spec/keeper-wire.md §3, op 3) is held once the number
of DROPs passed so far reaches the integer the file holds (0: every DROP is held), until the file
is removed; a DROP whose client hung up meanwhile (a daemon killed, or one that gave up after its
5 s) is never passed on, as a keeper would never have seen it. CONTROL_DIR/held counts the DROPs
held so far. The keeper takes the proxy's pid as the owner of what is kept through it: stop the
proxy before a daemon is to adopt those records."""

import os
import select
import socket
import sys
import threading
import time

OP_DROP = 3
listen_path, upstream_path, control = sys.argv[1:4]
hold_file = os.path.join(control, "hold")
held_file = os.path.join(control, "held")
lock = threading.Lock()
counts = {"passed": 0, "held": 0}


def write_held():
    with open(held_file + ".tmp", "w") as f:
        f.write(str(counts["held"]))
    os.replace(held_file + ".tmp", held_file)


def holds_drop():
    """Whether this DROP is held; counts it either way."""
    with lock:
        try:
            with open(hold_file) as f:
                passing = int(f.read().strip() or 0)
        except FileNotFoundError:
            counts["passed"] += 1
            return False
        if counts["passed"] < passing:
            counts["passed"] += 1
            return False
        counts["held"] += 1
        write_held()
        return True


def send_all(sock, data, fds):
    sent = socket.send_fds(sock, [data], fds) if fds else sock.send(data)
    while sent < len(data):
        sent += sock.send(data[sent:])
    for fd in fds:
        os.close(fd)


def pump(src, dst):
    try:
        while True:
            data, fds, _, _ = socket.recv_fds(src, 1 << 16, 253)
            if not data:
                break
            send_all(dst, data, fds)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def client_gone(sock):
    """A held client that hung up: readable with nothing to read (it sends one request a connection)."""
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""


def serve(client):
    first, fds = b"", []
    try:
        while len(first) < 11:
            data, got, _, _ = socket.recv_fds(client, 1 << 16, 253)
            if not data:
                client.close()
                return
            first += data
            fds += got
        if first[10] == OP_DROP and holds_drop():
            while os.path.exists(hold_file):
                if client_gone(client):
                    client.close()
                    return
                time.sleep(0.02)
            if client_gone(client):
                client.close()
                return
        upstream = socket.socket(socket.AF_UNIX)
        upstream.connect(upstream_path)
        send_all(upstream, first, fds)
    except OSError:
        client.close()
        return
    threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
    pump(client, upstream)


server = socket.socket(socket.AF_UNIX)
server.bind(listen_path)
server.listen(64)
write_held()
while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
