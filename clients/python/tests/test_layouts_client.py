"""The client side of layouts, against a scripted server (no daemon needed): the layout asked for
goes out in get_state, and a reply in another layout (a daemon older than layouts ignores the
field) is refused after dropping the lease it granted."""

import unittest

from scripted_server import scripted_server
from weightd_client import WeightdClient
from weightd_client.protocol import ProtocolError

STATE = {"status": "ok", "mode": "map", "leaseId": "L1", "fingerprint": "f", "backend": "host", "tensors": [], "aliases": {}, "segments": []}


class LayoutRequestTest(unittest.TestCase):
    def serve(self, replies):
        path, seen, _ = scripted_server(self, replies)
        return path, seen

    def test_layout_is_sent_and_checked(self):
        ping = lambda req: {"status": "serving"}
        path, seen = self.serve([ping, lambda req: {**STATE, "layout": req.get("layout", "checkpoint")}, lambda req: {**STATE}])
        client = WeightdClient(path, timeout=5)
        self.assertEqual(client.get_state("f", layout="vllm")["layout"], "vllm")
        self.assertEqual(seen[1]["layout"], "vllm")
        self.assertEqual(client.get_state("f")["leaseId"], "L1")
        self.assertNotIn("layout", seen[2], "checkpoint is the default: not sent, so older daemons see the same request")
        client.close()

    def test_old_daemon_reply_is_refused_and_its_lease_dropped(self):
        ping = lambda req: {"status": "serving"}
        path, seen = self.serve([ping, lambda req: {**STATE}, lambda req: {"dropped": 1}])
        client = WeightdClient(path, timeout=5)
        with self.assertRaises(ProtocolError) as cm:
            client.attach("f", layout="vllm")
        self.assertEqual(cm.exception.code, "E_LAYOUT_NOT_SERVED")
        self.assertIn("'vllm'", str(cm.exception))
        self.assertEqual((seen[2]["cmd"], seen[2]["leaseId"]), ("detach", "L1"))
        client.close()


if __name__ == "__main__":
    unittest.main()
