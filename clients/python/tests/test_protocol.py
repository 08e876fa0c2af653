"""Unit tests of the Python client's protocol module and dtype tables (no daemon needed)."""

import json
import socket
import struct
import threading
import time
import unittest

from weightd_client.protocol import HEADER, MAGIC, Connection, ProtocolError, ServeError, encode_frame, read_frame
from weightd_client.tensors import by_name, numpy_dtype


class FrameTest(unittest.TestCase):
    def test_header_layout(self):
        frame = encode_frame({"id": 1, "cmd": "ping"})
        magic, version, length = HEADER.unpack(frame[:10])
        self.assertEqual((magic, version, length), (MAGIC, 1, len(frame) - 10))
        self.assertEqual(json.loads(frame[10:]), {"id": 1, "cmd": "ping"})

    def test_round_trip_split_writes(self):
        a, b = socket.socketpair()
        frame = encode_frame({"x": "ünïcødé", "n": [1, 2]})
        for i in range(len(frame)):
            a.send(frame[i : i + 1])
        self.assertEqual(read_frame(b, time.monotonic() + 5), {"x": "ünïcødé", "n": [1, 2]})
        a.close(), b.close()

    def test_bad_header(self):
        for head, code in ((b"XXXX" + struct.pack(">HI", 1, 2), "E_FRAME_MAGIC"), (MAGIC + struct.pack(">HI", 2, 2), "E_FRAME_VERSION"), (MAGIC + struct.pack(">HI", 1, 1 << 30), "E_FRAME_TOO_LARGE")):
            a, b = socket.socketpair()
            a.send(head + b"{}")
            with self.assertRaises(ProtocolError) as cm:
                read_frame(b, time.monotonic() + 5)
            self.assertEqual(cm.exception.code, code)
            a.close(), b.close()

    def test_request_too_large(self):
        with self.assertRaises(ProtocolError):
            encode_frame({"x": "y" * (1 << 20)})


class ConnectionTest(unittest.TestCase):
    """Against a scripted server on a real Unix socket."""

    def serve(self, path, replies):
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(path)
        srv.listen()

        def run():
            for reply in replies:
                conn, _ = srv.accept()
                req = read_frame(conn, time.monotonic() + 5)
                if reply is not None:
                    out = reply(req)
                    # bytes: frames as they are (a reply and its packed manifest).
                    conn.sendall(out if isinstance(out, bytes) else encode_frame(out))
                conn.close()
            srv.close()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    def test_error_reply_and_reconnect(self):
        import os, shutil, tempfile

        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d, True)
        path = os.path.join(d, "s.sock")
        t = self.serve(
            path,
            [
                lambda req: {"id": req["id"], "ok": False, "error": {"code": "E_LEASE_HELD", "message": "held", "details": {"n": 1}}},
                lambda req: {"id": req["id"], "ok": True, "dropped": 0},
            ],
        )
        conn = Connection(path, timeout=5)
        with self.assertRaises(ServeError) as cm:
            conn.request("release")
        self.assertEqual((cm.exception.code, cm.exception.details), ("E_LEASE_HELD", {"n": 1}))
        # The server closed that connection; the next request opens a new one.
        self.assertEqual(conn.request("detach")["dropped"], 0)
        conn.close()
        t.join(5)

    def test_get_state_takes_objects_from_an_older_daemon_and_refuses_bad_columns(self):
        import os, shutil, tempfile

        from weightd_client import WeightdClient

        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d, True)
        path = os.path.join(d, "s.sock")
        tensor = {"name": "w", "dtype": "F32", "shape": [2, 2], "segment": 0, "offset": 0, "bytes": 16}
        state = {"ok": True, "status": "ok", "mode": "map", "leaseId": "L1", "layout": "checkpoint", "aliases": {}, "segments": []}
        seen = []

        def cut(announced):
            """The reply, then the connection's end where its packed manifest should come."""
            def reply(req):
                seen.append(req)
                return encode_frame({"id": req["id"], **state, "packed": announced})
            return reply

        def answer(**fields):
            def reply(req):
                seen.append(req)
                return {"id": req["id"], **fields}
            return reply

        t = self.serve(path, [
            answer(ok=True, status="serving", fingerprint="f"),
            answer(**state, tensors=[tensor]),  # a daemon older than columns
            answer(**state, columns={"name": ["w"], "dtypes": ["F32"], "dtype": [1], "shapes": [[2, 2]], "shape": [0], "segment": [0], "offset": [0], "bytes": [16]}),
            answer(ok=True, dropped=1),
        ])
        client = WeightdClient(path, timeout=5)
        got = client.get_state("f")
        self.assertTrue(seen[1]["columns"], "the client asks for columns")
        self.assertEqual(list(got["tensors"]), [tensor])
        with self.assertRaises(ProtocolError) as cm:
            client.get_state("f")
        self.assertEqual(cm.exception.code, "E_BAD_MANIFEST")
        self.assertIn("dtype index 1", str(cm.exception))
        self.assertEqual((seen[3]["cmd"], seen[3]["leaseId"]), ("detach", "L1"), "the lease of a refused manifest is given back")
        client.conn.close()
        t.join(5)

    def test_get_state_reads_the_packed_manifest_after_its_reply_and_refuses_a_bad_one(self):
        import os, shutil, tempfile
        from pathlib import Path

        from weightd_client import WeightdClient

        vectors = json.loads((Path(__file__).resolve().parents[3] / "test" / "vectors" / "manifest-packed.json").read_text(encoding="utf-8"))
        good = vectors["valid"][1]
        bad = next(v for v in vectors["invalid"] if "dtype index" in v["mentions"])
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d, True)
        path = os.path.join(d, "s.sock")
        state = {"ok": True, "status": "ok", "mode": "map", "leaseId": "L1", "layout": "checkpoint", "aliases": {}, "segments": []}
        seen = []

        def packed(payload, announced=None):
            def reply(req):
                seen.append(req)
                head = encode_frame({"id": req["id"], **state, "packed": len(payload) if announced is None else announced})
                return head + HEADER.pack(MAGIC, 1, len(payload)) + payload
            return reply

        def cut(announced):
            """The reply, then the connection's end where its packed manifest should come."""
            def reply(req):
                seen.append(req)
                return encode_frame({"id": req["id"], **state, "packed": announced})
            return reply

        def answer(**fields):
            def reply(req):
                seen.append(req)
                return {"id": req["id"], **fields}
            return reply

        t = self.serve(path, [
            answer(ok=True, status="serving", fingerprint="f"),
            packed(bytes.fromhex(good["packed"])),
            packed(bytes.fromhex(bad["packed"])),
            answer(ok=True, dropped=1),
            packed(bytes.fromhex(good["packed"]), announced=7),
            answer(ok=True, dropped=1),
            cut(len(bytes.fromhex(good["packed"]))),
            answer(ok=True, dropped=1),
        ])
        client = WeightdClient(path, timeout=5)
        got = client.get_state("f")
        self.assertEqual((seen[1]["packed"], seen[1]["columns"]), (True, True), "the client asks for packed, and for columns from a daemon older than packing")
        self.assertEqual(list(got["tensors"]), good["tensors"])
        with self.assertRaises(ProtocolError) as cm:
            client.get_state("f")
        self.assertEqual(cm.exception.code, "E_BAD_MANIFEST")
        self.assertIn(f"at byte {bad['at']}: ", str(cm.exception))
        self.assertEqual((seen[3]["cmd"], seen[3]["leaseId"]), ("detach", "L1"), "the lease of a refused manifest is given back")
        with self.assertRaises(ProtocolError) as cm:
            client.get_state("f")
        self.assertEqual(cm.exception.code, "E_BAD_REPLY")
        self.assertIn("announced 7", str(cm.exception))
        self.assertEqual((seen[5]["cmd"], seen[5]["leaseId"]), ("detach", "L1"), "the lease of a reply whose packed manifest was cut is given back")
        with self.assertRaises(ProtocolError) as cm:
            client.get_state("f")
        self.assertIn("the packed manifest of the reply to get_state did not arrive", str(cm.exception))
        self.assertEqual((seen[7]["cmd"], seen[7]["leaseId"]), ("detach", "L1"), "the lease of a reply whose packed manifest never came is given back")
        client.conn.close()
        t.join(5)

    def test_missing_socket(self):
        with self.assertRaises(ServeError) as cm:
            Connection("/nonexistent/weightd.sock").request("ping")
        self.assertEqual(cm.exception.code, "E_CONNECT")


class TensorsTest(unittest.TestCase):
    def test_aliases_share_one_object(self):
        state = {"tensors": [{"name": "a"}], "aliases": {"b": "a"}}
        out = by_name(state, lambda t: object())
        self.assertIs(out["a"], out["b"])

    def test_dtypes_without_native_type_are_bits(self):
        self.assertEqual(numpy_dtype("BF16"), "uint16")
        self.assertEqual(numpy_dtype("F8_E4M3"), "uint8")


if __name__ == "__main__":
    unittest.main()
