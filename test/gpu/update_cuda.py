#!/usr/bin/env python3
"""A writer on a real GPU (issue 31, docs/weight-updates.md "cuda"): a trainer's tensors on the
same GPU copied device to device into a new version of a Llama served at tp=1, which an engine
under a captured CUDA graph follows with switch_to.

  python3 test/gpu/update_cuda.py --out-dir DIR [--layers N] [--hidden H] [--segment-mib M]

Writes two Llama checkpoints of one config (seed 0 and seed 1; ~1 GB at the defaults), runs a
daemon serving seed 0 with --cuda-handles fd and a plan file cutting the arena into segments of
about M MiB, and in this process:
  1. the engine: load_into maps a meta-device model onto version 0 and captures one forward in a
     CUDA graph; replayed, it gives seed 0's disk logits;
  2. the trainer holds seed 1's weights on the GPU (safetensors loaded to cuda:0);
  3. a full update: begin_update (the daemon's staging copies), write every tensor device to
     device (Update.write of a CUDA tensor), commit (the daemon's final copies and digests, the
     version served); the replayed graph still gives seed 0's logits until switch_to, then
     seed 1's with every data_ptr the same;
  4. a one-layer update over it: layer 0 from seed 0 (begin_update(tensors=...), only its
     segments copied); after switch_to the graph gives the logits of seed 1 with seed 0's
     layer 0 (from disk);
  5. the times of begin, write, commit and switch_to for both, beside the device-to-device copy
     of the same bytes (torch, the ceiling) and the segments copied and shared;
  6. detach; the daemon exits 0 on SIGTERM.
Prints one JSON line and writes DIR/update-cuda.json; the exit status is 0 when every step passed.
Needs torch, transformers, safetensors, and dist/ with node on PATH (test/gpu/ensure-node.sh).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

from llama_graph import ATTENTION, PROMPT, ROOT, capture, disk_logits, start_daemon, stop_daemon, write_checkpoint

sys.path.insert(0, str(ROOT / "clients/python"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--segment-mib", type=int, default=64)
    a = ap.parse_args()
    Path(a.out_dir).mkdir(parents=True, exist_ok=True)
    steps: list = []
    result: dict = {"steps": steps}

    def step(what, ok, **fields):
        steps.append({"step": what, "ok": bool(ok), **fields})
        print(("PASS " if ok else "FAIL ") + what + (" " + json.dumps(fields) if fields else ""), flush=True)
        return ok

    import torch
    import transformers
    from safetensors.torch import load_file
    from weightd_client import WeightdClient, find_socket, load_into

    torch.cuda.set_device(0)
    work = Path(tempfile.mkdtemp(prefix="weightd-update-cuda-", dir="/var/tmp"))
    v0, v1 = work / "v0", work / "v1"
    for path, seed in ((v0, 0), (v1, 1)):
        write_checkpoint(torch, transformers, path, seed, a.layers, a.hidden)
    sock = work / "s"
    sock.mkdir(mode=0o700)
    plan = work / "plan.json"
    plan.write_text(json.dumps({"rules": [], "segmentBytes": a.segment_mib << 20}))
    args = ["--model", str(v0), "-tp", "1", "--device", "cuda", "--cuda-handles", "fd", "--plan-file", str(plan), "--weight-cache-socket-dir", str(sock)]
    try:
        daemon = start_daemon(args, Path(a.out_dir) / "update-cuda-daemon.log")
    except RuntimeError as err:
        step("the daemon serves version 0 (--cuda-handles fd)", False, error=str(err))
        daemon = None
    try:
        if daemon is None:
            return 1
        prompt = torch.tensor(PROMPT, device="cuda:0")
        want0, want1 = disk_logits(torch, transformers, v0, prompt), disk_logits(torch, transformers, v1, prompt)
        step("the two seeds' disk logits differ", not torch.equal(want0, want1))

        config = transformers.AutoConfig.from_pretrained(str(v0))
        config._attn_implementation = ATTENTION
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
        loaded = load_into(model, str(v0), socket_dir=str(sock), device=0, plan_file=str(plan))
        model.eval()
        attached = loaded.attached
        step("load_into maps the model's parameters to the daemon's memory", loaded.source == "weightd" and attached is not None, reason=loaded.reason)
        # The trainer's connection (each update takes one more of its own).
        client = WeightdClient(find_socket(global_rank=0, socket_dir=str(sock)))
        pointers = {n: p.data_ptr() for n, p in model.named_parameters()}
        replay = capture(torch, model, prompt)
        step("the engine's graph, replayed, gives version 0's logits", torch.equal(replay(), want0))
        name = client.ping()["name"]
        base = next(m["fingerprint"] for m in client.ping()["models"] if m["name"] == name and m.get("version") == 0)

        # The trainer's new weights, already on the GPU.
        def on_gpu(path):
            out = {}
            for f in sorted(path.glob("*.safetensors")):
                out.update(load_file(str(f), device="cuda:0"))
            return out

        seed1, seed0 = on_gpu(v1), on_gpu(v0)
        total = sum(t.numel() * t.element_size() for t in seed1.values())
        # The ceiling: the same bytes copied device to device by torch.
        flat = torch.empty(total, dtype=torch.uint8, device="cuda:0")
        dst = torch.empty_like(flat)
        for _ in range(2):
            torch.cuda.synchronize()
            t = time.perf_counter()
            dst.copy_(flat)
            torch.cuda.synchronize()
            d2d_s = time.perf_counter() - t
        del flat, dst
        result["modelBytes"] = total
        result["deviceToDeviceSeconds"] = round(d2d_s, 4)
        result["deviceToDeviceGBps"] = round(total / d2d_s / 1e9, 1)

        def update(over, weights, tensors=None):
            """begin, write (device to device), commit: the times and the commit's reply."""
            t0 = time.perf_counter()
            upd = client.begin_update(name, over, tensors=tensors, device=0)
            t1 = time.perf_counter()
            for n in tensors or weights:
                upd.write(n, weights[n])
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            copied = len(upd._cuda.pointers)
            done = upd.commit()
            t3 = time.perf_counter()
            times = {"beginSeconds": round(t1 - t0, 4), "writeSeconds": round(t2 - t1, 4), "commitSeconds": round(t3 - t2, 4), "totalSeconds": round(t3 - t0, 4)}
            return done, times, copied

        full, times, copied = update(base, seed1)
        result["full"] = {**times, "segmentsCopied": copied, "writtenBytes": total}
        step("a full update commits a new version", full.get("version") == 1 and not full["waiting"], reply=full, **times)
        step("the engine reads version 0 until it switches", torch.equal(replay(), want0))
        t = time.perf_counter()
        attached.switch_to(full["fingerprint"])
        result["full"]["switchMs"] = round((time.perf_counter() - t) * 1e3, 3)
        got1 = replay()
        step("after switch_to the same graph gives seed 1's logits, every data_ptr the same",
             torch.equal(got1, want1) and {n: p.data_ptr() for n, p in model.named_parameters()} == pointers,
             maxAbsDiff=float((got1.float() - want1.float()).abs().max()), switchMs=result["full"]["switchMs"])

        layer0 = sorted(n for n in seed0 if n.startswith("model.layers.0."))
        one, times, copied = update(full["fingerprint"], seed0, layer0)
        segments = len(attached.state["segments"])
        layer_bytes = sum(seed0[n].numel() * seed0[n].element_size() for n in layer0)
        result["oneLayer"] = {**times, "segmentsCopied": copied, "segmentsShared": segments - copied, "writtenBytes": layer_bytes}
        step("a one-layer update copies only that layer's segments", one.get("version") == 2 and copied < segments, copied=copied, segments=segments, **times)
        t = time.perf_counter()
        attached.switch_to(one["fingerprint"])
        result["oneLayer"]["switchMs"] = round((time.perf_counter() - t) * 1e3, 3)

        def with_layer0_of_seed0(m):
            with torch.no_grad():
                for n, p in m.named_parameters():
                    if n in seed0 and n.startswith("model.layers.0."):
                        p.copy_(seed0[n])

        want_mixed = disk_logits(torch, transformers, v1, prompt, with_layer0_of_seed0)
        got = replay()
        step("after switch_to the graph gives seed 1 with seed 0's layer 0", torch.equal(got, want_mixed),
             maxAbsDiff=float((got.float() - want_mixed.float()).abs().max()), switchMs=result["oneLayer"]["switchMs"])
        result["fullOverDeviceToDevice"] = round(result["full"]["totalSeconds"] / d2d_s, 2)

        del replay, model, seed0, seed1
        attached.tensors = {}
        gc.collect()
        torch.cuda.synchronize()
        loaded.close()
        step("no lease is left on the versions", all(client.stats(f)["leases"] == [] for f in (base, full["fingerprint"], one["fingerprint"])))
        client.close()
    except Exception as err:  # a failure is a result here; the JSON says which step
        step("no exception", False, error=repr(err)[:2000])
    finally:
        if daemon is not None:
            code = stop_daemon(daemon)
            step("the daemon exits 0 on SIGTERM", code == 0, exit=code)
        with open(Path(a.out_dir) / "update-cuda.json", "w") as f:
            json.dump(result, f, indent=1)
        print(json.dumps({k: v for k, v in result.items() if k != "steps"}), flush=True)
    return 0 if all(s["ok"] for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
