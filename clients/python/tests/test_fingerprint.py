"""weightd_client.expected_fingerprint against the shared vectors (test/vectors/fingerprint).

The TypeScript suite (test/checkpoint/fingerprintVectors.test.ts) reads the same cases.json
and builds each model directory by the same recipe (docs/spec/fingerprint.md, "Test vectors"),
so the two implementations are held to one set of expected fields.
"""

import importlib.util
import json
import os
import shutil
import struct
import tempfile
import unittest

from weightd_client import FingerprintError, expected_fingerprint
from weightd_client.fingerprint import tensor_digests
from weightd_client.fingerprint import SAMPLE_BLOCK_BUDGET, SAMPLE_BLOCK_BYTES, SAMPLE_EDGE_BYTES, sample_ranges

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
VECTORS = os.path.join(REPO, "test", "vectors", "fingerprint", "cases.json")
HAVE_HASHES = all(importlib.util.find_spec(m) for m in ("xxhash", "rfc8785"))
DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4}


def _write_synthetic(model_dir, m):
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(m["config"], f)
    header, cursor = {}, 0
    for name, shape in m["tensors"]:
        n = DTYPE_BYTES[m["dtype"]]
        for d in shape:
            n *= d
        header[name] = {"dtype": m["dtype"], "shape": shape, "data_offsets": [cursor, cursor + n]}
        cursor += n
    text = json.dumps(header, separators=(",", ":")).encode()
    with open(os.path.join(model_dir, m["file"]), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + cursor)
        for p in range(0, cursor, 4096):
            f.seek(8 + len(text) + p)
            f.write(struct.pack("<Q", p // 4096 + 1)[: min(8, cursor - p)])


def _tensor_span(path, tensor):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        begin, end = json.loads(f.read(n))[tensor]["data_offsets"]
    return 8 + n + begin, 8 + n + end


def materialize(vectors, case, root):
    model_dir = os.path.join(root, "model")
    model = vectors["models"][case["model"]]
    if "copyOf" in model:
        shutil.copytree(os.path.join(REPO, model["copyOf"]), model_dir)
    else:
        os.makedirs(model_dir)
        _write_synthetic(model_dir, model["synthetic"])
    for m in case.get("mutations", []):
        if m["op"] == "config":
            path = os.path.join(model_dir, "config.json")
            with open(path) as f:
                config = json.load(f)
            config.update(m["set"])
            with open(path, "w") as f:
                json.dump(config, f)
        elif m["op"] == "truncate":
            path = os.path.join(model_dir, m["file"])
            os.truncate(path, os.path.getsize(path) - m["drop"])
        else:
            path = os.path.join(model_dir, m["file"])
            begin, end = _tensor_span(path, m["tensor"])
            with open(path, "r+b") as f:
                f.seek(begin + m["offset"] if m["offset"] >= 0 else end + m["offset"])
                f.write(bytes([m["byte"]]) * m["length"])
    plan_file = None
    if "planFile" in case:
        plan_file = os.path.join(root, "plan.json")
        with open(plan_file, "w") as f:
            json.dump(case["planFile"], f)
    return model_dir, plan_file


@unittest.skipUnless(HAVE_HASHES, "needs the xxhash and rfc8785 packages (clients/python/requirements-test.txt)")
class SharedVectorsTest(unittest.TestCase):
    def test_every_case(self):
        with open(VECTORS) as f:
            vectors = json.load(f)
        for case in vectors["cases"]:
            with self.subTest(case["name"]), tempfile.TemporaryDirectory() as root:
                model_dir, plan_file = materialize(vectors, case, root)
                if case.get("error"):
                    with self.assertRaisesRegex(FingerprintError, case["error"]):
                        expected_fingerprint(model_dir, case["tpSize"], 0, plan_file=plan_file)
                    continue
                want = case["expected"]
                for rank, r in enumerate(want["ranks"]):
                    got = expected_fingerprint(model_dir, case["tpSize"], rank, plan_file=plan_file)
                    self.assertEqual(got.fields, dict(want["fields"], tpRank=r["tpRank"]))
                    self.assertEqual(got.fingerprint, r["fingerprint"])
                    self.assertEqual(got.checkpoint_fingerprint, want["checkpointFingerprint"])
                self.assertEqual(dict(tensor_digests(model_dir)), want["full"]["tensorDigests"])
                full = expected_fingerprint(model_dir, case["tpSize"], 0, plan_file=plan_file, full=True)
                self.assertEqual(full.fingerprint, want["full"]["rank0"])
                self.assertEqual(full.checkpoint_fingerprint, want["full"]["checkpointFingerprint"])
                self.assertEqual(full.fields["content"], want["full"]["content"])


class ArgumentsTest(unittest.TestCase):
    def test_only_the_checkpoint_layout_exists(self):
        with self.assertRaisesRegex(ValueError, r"layout 'vllm'.*the layouts are: checkpoint"):
            expected_fingerprint(os.path.join(REPO, "examples", "tiny-llama"), 2, 0, layout="vllm")

    def test_rank_out_of_range(self):
        with self.assertRaisesRegex(ValueError, r"tp_rank 2 does not exist with tensor-parallel size 2"):
            expected_fingerprint(os.path.join(REPO, "examples", "tiny-llama"), 2, 2)


class IndexTest(unittest.TestCase):
    def test_an_index_may_not_name_files_outside_the_directory(self):
        with tempfile.TemporaryDirectory() as root:
            with open(os.path.join(root, "config.json"), "w") as f:
                json.dump({"architectures": ["LlamaForCausalLM"]}, f)
            with open(os.path.join(root, "model.safetensors.index.json"), "w") as f:
                json.dump({"weight_map": {"w": "../elsewhere.safetensors"}}, f)
            with self.assertRaisesRegex(FingerprintError, r'"\.\./elsewhere\.safetensors" is not a plain \.safetensors file name'):
                expected_fingerprint(root, 1, 0)


class SampleRangesTest(unittest.TestCase):
    def test_bounded_for_many_tensors(self):
        # 50,000 tensors of 2 MiB: every tensor's two edges plus the block budget.
        n, count = 2 << 20, 50_000
        spans = [(i * n, (i + 1) * n) for i in range(count)]
        ranges = sample_ranges(spans, n * count)
        sampled = sum(e - b for b, e in ranges)
        # The whole budget is spent even though no tensor's own share reaches one block.
        self.assertEqual(sampled, count * 2 * SAMPLE_EDGE_BYTES + SAMPLE_BLOCK_BUDGET * SAMPLE_BLOCK_BYTES)
        half = count // 2
        split = sample_ranges(spans[:half], n * count, 0) + sample_ranges(spans[half:], n * count, n * half)
        self.assertEqual(sum(e - b for b, e in split), sampled)
        self.assertTrue(all(a[1] < b[0] for a, b in zip(ranges, ranges[1:])), "ascending and disjoint")
        for b, e in spans[:100]:
            self.assertTrue(any(rb <= b < re for rb, re in ranges) and any(rb < e <= re for rb, re in ranges))


if __name__ == "__main__":
    unittest.main()


@unittest.skipUnless(HAVE_HASHES, "needs the xxhash and rfc8785 packages (clients/python/requirements-test.txt)")
class FullVersionFallbackTest(unittest.TestCase):
    """A client of the full-content version (3) against a daemon that knows only version 2 (every
    weightd before it): the daemon finds no version of that fingerprint and answers, as such a
    daemon does, with a mismatch against its version 2 fields; the client reports ``content`` and
    ``protocol`` as the differing fields and falls back to disk."""

    def test_new_client_old_daemon(self):
        from scripted_server import scripted_server
        from weightd_client import Mismatch, WeightdClient

        model = os.path.join(REPO, "examples", "tiny-llama")
        sampled = expected_fingerprint(model, 1, 0)
        full = expected_fingerprint(model, 1, 0, full=True)
        self.assertNotEqual(full.fingerprint, sampled.fingerprint)

        def old_daemon_get_state(req):
            ours = sampled.fields
            differ = sorted(k for k in set(ours) | set(req["fingerprintFields"]) if ours.get(k) != req["fingerprintFields"].get(k))
            return {"status": "mismatch", "fields": differ or ["fingerprint"], "fingerprint": sampled.fingerprint, "fingerprintFields": ours}

        ping = lambda req: {"status": "serving", "protocolVersion": 1}
        path, seen, t = scripted_server(self, [ping, old_daemon_get_state])
        client = WeightdClient(path)
        try:
            got = client.attach(full.fingerprint, full.fields)
            self.assertIsInstance(got, Mismatch)
            self.assertEqual(sorted(got.fields), ["content", "protocol"])
            self.assertEqual(got.fingerprint, sampled.fingerprint, "the daemon's own (sampled) fingerprint, which the client may ask for instead")
        finally:
            client.close()
        t.join(5)
        asked = [req["fingerprint"] for req in seen if req["cmd"] != "ping"]
        self.assertEqual(asked, [full.fingerprint])
