#!/usr/bin/env python3
"""Attached.switch_to on a real GPU: a captured CUDA graph reads the new version's weights with
no recapture (issue 31's core mechanism, over two models the daemon serves today).

  python3 test/gpu/switch_graph.py --out-dir DIR [--layers N] [--hidden H]

Writes two Llama checkpoints of the same config (seed 0 and seed 1: the same names, dtypes,
shapes and so the same placement; other weights), runs one daemon serving both with
--cuda-handles fd, and in this process:
  1. attaches version 0 (torch views), builds the model on the meta device with
     load_state_dict(assign=True) and captures one forward in a CUDA graph;
  2. replays it: logits equal to the disk model of version 0 (same kernels);
  3. switch_to(version 1): every data_ptr the same, the replayed graph's logits equal to the disk
     model of version 1, with no recapture;
  4. switch_to(version 0) again: equal to version 0's;
  5. times switch_to (median of 9, each way), plain and after prepare_switch (lease, descriptors
     and imports ahead, outside the time), and says what it remapped (every segment: two
     checkpoints share no memory);
  6. a stranger fingerprint is a Mismatch and changes nothing;
  7. a weight update from a new checkpoint directory, as an engine follows it: `weightd ctl load
     --model v2 --name v0` (hot swap), the engine hears model_ready on its watch and switches to
     it: the same graph gives version 2's logits; the replaced version is freed once the lease
     moved (ctl list); the seconds from `ctl load` to the switch;
  8. detach; the daemon exits 0 on SIGTERM.
DIR/switch.json holds every step (ok, figures); the exit status is 0 when all passed.
Needs torch, transformers, safetensors, and dist/ with node on PATH (test/gpu/ensure-node.sh).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llama_graph import PROMPT, ROOT, capture, disk_logits, meta_llama, start_daemon, stop_daemon, write_checkpoint

sys.path.insert(0, str(ROOT / "clients/python"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    steps: list = []
    result = {"steps": steps}

    def step(what, ok, **fields):
        steps.append({"step": what, "ok": bool(ok), **fields})
        print(("PASS " if ok else "FAIL ") + what + (" " + json.dumps(fields) if fields else ""), flush=True)
        return ok

    import torch
    import transformers
    from weightd_client import expected_fingerprint, load_into

    torch.cuda.set_device(0)
    work = Path(tempfile.mkdtemp(prefix="weightd-switch-", dir="/var/tmp"))
    v0, v1, v2 = work / "v0", work / "v1", work / "v2"
    for path, seed in ((v0, 0), (v1, 1), (v2, 2)):
        write_checkpoint(torch, transformers, path, seed, a.layers, a.hidden)
    sock = work / "s"
    sock.mkdir(mode=0o700)
    log_path = Path(a.out_dir) / "switch-daemon.log"
    args = ["--model", str(v0), "-tp", "1", "--model", str(v1), "-tp", "1", "--device", "cuda", "--cuda-handles", "fd", "--weight-cache-socket-dir", str(sock)]
    try:
        daemon = start_daemon(args, log_path)
    except RuntimeError as err:
        step("the daemon serves both versions", False, error=str(err))
        with open(Path(a.out_dir) / "switch.json", "w") as f:
            json.dump(result, f, indent=1)
        return 1
    try:
        step("the daemon serves both versions (--cuda-handles fd)", True)
        e0, e1 = expected_fingerprint(str(v0), 1, 0), expected_fingerprint(str(v1), 1, 0)
        prompt = torch.tensor(PROMPT, device="cuda:0")

        def disk(path):
            return disk_logits(torch, transformers, path, prompt)

        want0, want1 = disk(v0), disk(v1)
        step("the two versions' disk logits differ", not torch.equal(want0, want1))

        config = transformers.AutoConfig.from_pretrained(str(v0))
        model = meta_llama(torch, transformers, config)
        loaded = load_into(model, str(v0), socket_dir=str(sock), device=0)
        model.eval()
        attached = loaded.attached
        step("load_into maps the model's parameters to the daemon's memory", loaded.source == "weightd" and attached is not None, reason=loaded.reason)
        client = attached._client
        pointers = {n: p.data_ptr() for n, p in model.named_parameters()}

        replay = capture(torch, model, prompt)
        step("replay on version 0 gives version 0's logits", torch.equal(replay(), want0))
        t0 = time.perf_counter()
        attached.switch_to(e1.fingerprint, e1.fields)
        first_switch_ms = (time.perf_counter() - t0) * 1e3
        same = {n: p.data_ptr() for n, p in model.named_parameters()} == pointers
        step("switch_to(version 1) keeps every data_ptr", same, switchMs=round(first_switch_ms, 3))
        got1 = replay()
        step("the same graph, replayed, gives version 1's logits (no recapture)", torch.equal(got1, want1),
             maxAbsDiff=float((got1.float() - want1.float()).abs().max()))
        attached.switch_to(e0.fingerprint, e0.fields)
        step("switch_to(version 0) again gives version 0's logits", torch.equal(replay(), want0))

        # Each way, plain and with prepare_switch first (its lease, descriptors and imports done
        # outside the time, as an engine would at the event): what switch_to itself costs.
        times = {"to1": [], "to0": [], "to1Prepared": [], "to0Prepared": [], "prepare": []}
        did = []
        for _ in range(9):
            for prepared in (False, True):
                for key, e in (("to1", e1), ("to0", e0)):
                    if prepared:
                        t0 = time.perf_counter()
                        attached.prepare_switch(e.fingerprint, e.fields)
                        times["prepare"].append((time.perf_counter() - t0) * 1e3)
                    t0 = time.perf_counter()
                    attached.switch_to(e.fingerprint, e.fields)
                    times[key + ("Prepared" if prepared else "")].append((time.perf_counter() - t0) * 1e3)
                    did.append((len(attached.last_switch["remapped"]), attached.last_switch["skipped"]))
        sizes = {s["segment"]: int(s["bytes"]) for s in attached.state["segments"]}
        seg_bytes = sum(sizes[n] for n in attached.last_switch["remapped"])
        result["switchMs"] = {k: {"median": round(statistics.median(v), 3), "min": round(min(v), 3), "max": round(max(v), 3)} for k, v in times.items()}
        result["remappedBytes"] = seg_bytes
        result["segments"] = len(attached.state["segments"])
        # Two checkpoints share no allocation: every switch remaps every segment.
        result["remappedSkipped"] = sorted(set(did))
        step("switch_to timed (median of 9 each way, plain and prepared)", bool(did) and all(r == (result["segments"], 0) for r in did),
             switchMs=result["switchMs"], remappedGiB=round(seg_bytes / 2**30, 3), segments=result["segments"], remappedSkipped=result["remappedSkipped"])
        step("after the timed switches, version 0's logits", torch.equal(replay(), want0))

        miss = attached.switch_to("0" * 64)
        step("an unserved fingerprint is a Mismatch and changes nothing", type(miss).__name__ == "Mismatch" and torch.equal(replay(), want0))

        # A weight update from a checkpoint directory: the hot swap the daemon already does, followed in place.
        def ctl(*args):
            r = subprocess.run(["node", str(ROOT / "dist/main.js"), "ctl", "--weight-cache-socket-dir", str(sock), *args], capture_output=True, text=True, timeout=300, cwd=ROOT)
            return r.returncode, r.stdout, r.stderr

        want2 = disk(v2)
        client.watch("v0")
        t0 = time.perf_counter()
        rc, out, err = ctl("load", "--model", str(v2), "--name", "v0", "-tp", "1")
        loaded_s = time.perf_counter() - t0
        ready = None
        deadline = time.monotonic() + 60
        while ready is None and time.monotonic() < deadline:
            ready = next((e for e in client.events(timeout=1.0) if e.get("event") == "model_ready"), None)
        step("ctl load of v2 under the name v0: the watching engine hears model_ready", rc == 0 and ready is not None, rc=rc, err=err[-500:], loadSeconds=round(loaded_s, 2))
        t1 = time.perf_counter()
        attached.switch_to(ready["fingerprint"])
        switch_ms = (time.perf_counter() - t1) * 1e3
        got2 = replay()
        step("switch_to(the event's fingerprint): the same graph gives version 2's logits", torch.equal(got2, want2),
             switchMs=round(switch_ms, 3), fromCtlLoadSeconds=round(time.perf_counter() - t0, 2))
        listed = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rc, out, err = ctl("list", "--json")
            listed = [(m["model"], m["state"]) for m in json.loads(out)["models"]] if rc == 0 else []
            freed = not any(os.path.realpath(m) == os.path.realpath(v0) and state != "released" for m, state in listed)
            if freed:
                break
            time.sleep(0.5)
        step("the replaced version is freed once the lease moved off it", freed, listed=listed)

        del replay, model
        attached.tensors = {}
        gc.collect()
        torch.cuda.synchronize()
        loaded.close()
        step("no lease is left on either version", client.stats(e0.fingerprint)["leases"] == [] and client.stats(e1.fingerprint)["leases"] == [])
    except Exception as err:  # a failure is a result here; the JSON says which step
        step("no exception", False, error=repr(err)[:2000])
    finally:
        if daemon.poll() is None:
            code = stop_daemon(daemon)
            step("the daemon exits 0 on SIGTERM", code == 0, exit=code)
        with open(Path(a.out_dir) / "switch.json", "w") as f:
            json.dump(result, f, indent=1)
    return 0 if all(s["ok"] for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
