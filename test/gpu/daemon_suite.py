#!/usr/bin/env python3
"""weightd end to end on real GPUs: the daemon (node dist/main.js) serves a transformers-written
Llama checkpoint and Python clients (clients/python) check every byte against safetensors.

  python3 test/gpu/daemon_suite.py run --out-dir DIR [--device cuda|host] [--ckpt DIR] [--small]
                                       [--scenarios checkpoint,tp1,tp2,two-node,restart] [--budget S]

Scenarios, each independent (one failing does not stop the others), each writing DIR/<name>.json:
  checkpoint  LlamaForCausalLM from a LlamaConfig (random bf16 weights, seed 0) saved with
              save_pretrained(max_shard_size="500MB"): several shards and an index
  tp1         -tp 1 on GPU 0: a client attaches zero-copy, every tensor bit-equal to
              safetensors.torch.load_file; attach time (median of 5) and IPC handles vs the
              time to load the same rank from disk; then a model built on the meta device,
              load_state_dict(cache tensors, assign=True), logits equal to from_pretrained's
  tp2         -tp 2 on both GPUs of one node: per rank, every tensor equal to torch.chunk of the
              full tensor along the split dim (replicated: the full tensor)
  two-node    two daemons, one GPU each (--nnodes 2 --node-rank 0/1 over 127.0.0.1): both READY,
              group ready, each node's rank equal to torch.chunk; SIGTERM both, exit 0
  restart     -tp 1 with --keeper spawn (--cuda-handles fd on cuda), through six lives: kill -9 of
              the daemon while an engine holds its tensors (they stay intact); a restart with the
              page cache dropped adopts (READY adoptedRanks=1) and reads a tenth of the checkpoint
              at most (/proc/PID/io), every tensor equal to disk; kill -9 of the keeper (the
              daemon re-creates one, serves on, and the next life adopts from it); the GPU's
              memory taken by another process between lives (adoption needs none; with nothing
              kept, E_OUT_OF_MEMORY); daemon and keeper both killed (the engine's mapping stays);
              then a load from disk, SIGTERM, no keeper left, GPU memory back to its start
Also DIR/summary.json and DIR/processes.log (every daemon's and worker's output).

The orchestration uses the standard library only; the workers (same file: make-ckpt, verify,
model) need torch and safetensors, and transformers for the checkpoint and the model check.
`--device host` runs the same orchestration on the host backend (no GPU; CI-machine dry run).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CLIENT_PATH = os.path.join(ROOT, "clients", "python")

# The model of the checkpoint scenario (the brief's Llama: about 1 GB of bf16).
FULL_SHAPE = dict(hidden_size=2048, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8,
                  intermediate_size=5632, vocab_size=32000)
SMALL_SHAPE = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                   intermediate_size=688, vocab_size=4096)

# The READY log line: JSON off a terminal, its msg starting with "READY node ".
READY_RE = re.compile(r'"msg":"READY node ')
GROUP_READY = "group ready: every node is serving"


# ----------------------------------------------------------------------------------------------
# Shared helpers (workers)
# ----------------------------------------------------------------------------------------------

def visible_gpu_count():
    """GPUs this process may use: nvidia-smi's list, narrowed by CUDA_VISIBLE_DEVICES when set."""
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
    except Exception:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return len(listed) if visible is None else min(len(listed), len([v for v in visible.split(",") if v.strip()]))


def emit(obj):
    """A worker's result: one JSON line on stdout."""
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


# vLLM-style roles of the daemon's llama family table (src/checkpoint/tpRules.ts), for counting.
ROLE_RULES = [
    (re.compile(r"^model\.embed_tokens\.weight$|^lm_head\.weight$"), "vocab"),
    (re.compile(r"\.self_attn\.q_proj\.(weight|bias)$"), "column"),
    (re.compile(r"\.self_attn\.[kv]_proj\.(weight|bias)$"), "kv"),
    (re.compile(r"\.self_attn\.o_proj\.(weight|bias)$"), "row"),
    (re.compile(r"\.mlp\.(gate|up)_proj\.(weight|bias)$"), "column"),
    (re.compile(r"\.mlp\.down_proj\.(weight|bias)$"), "row"),
    (re.compile(r"norm\.(weight|bias)$"), "replicated"),
]


def role_of(name):
    for pattern, role in ROLE_RULES:
        if pattern.search(name):
            return role
    return "unknown"


def expected_dim(role, ndim):
    if role in ("vocab", "column", "kv"):
        return 0
    if role == "row":
        return 1 if ndim >= 2 else None
    return None


def ckpt_files(ckpt):
    return sorted(os.path.join(ckpt, f) for f in os.listdir(ckpt) if f.endswith(".safetensors"))


def load_checkpoint(ckpt, device):
    from safetensors.torch import load_file

    out = {}
    for f in ckpt_files(ckpt):
        out.update(load_file(f, device=device))
    return out


def same_bits(torch, a, b):
    if a.dtype != b.dtype or list(a.shape) != list(b.shape):
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def setup_torch(device_index):
    import torch

    cuda = torch.cuda.is_available()
    dev = f"cuda:{device_index}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device_index)
        torch.zeros(1, device=dev)  # the context, before anything is timed
    return torch, cuda, dev


def sync(torch, cuda):
    if cuda:
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------------------------
# Worker: make-ckpt
# ----------------------------------------------------------------------------------------------

def write_safetensors(path, tensors):
    """A safetensors file written by hand (the fallback when transformers is missing)."""
    import struct

    import torch

    names = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
    header, offset, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, t in tensors.items():
        raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for raw in blobs:
            f.write(raw)
    return offset


def fallback_checkpoint(out, shape, seed):
    """The same names and shapes as save_pretrained, written without transformers."""
    import torch

    g = torch.Generator().manual_seed(seed)
    h, inter, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    hd = h // shape["num_attention_heads"]
    kv = shape["num_key_value_heads"] * hd

    def rnd(*s):
        return (torch.randn(*s, generator=g) * 0.02).to(torch.bfloat16)

    shards = [{"model.embed_tokens.weight": rnd(v, h)}]
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shards.append({
            p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "self_attn.q_proj.weight": rnd(h, h), p + "self_attn.k_proj.weight": rnd(kv, h),
            p + "self_attn.v_proj.weight": rnd(kv, h), p + "self_attn.o_proj.weight": rnd(h, h),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "mlp.gate_proj.weight": rnd(inter, h), p + "mlp.up_proj.weight": rnd(inter, h),
            p + "mlp.down_proj.weight": rnd(h, inter),
        })
    shards.append({"model.norm.weight": torch.ones(h, dtype=torch.bfloat16), "lm_head.weight": rnd(v, h)})
    files, weight_map, total = len(shards), {}, 0
    for k, part in enumerate(shards):
        name = f"model-{k + 1:05d}-of-{files:05d}.safetensors"
        total += write_safetensors(os.path.join(out, name), part)
        weight_map.update({t: name for t in part})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "attention_bias": False,
              "mlp_bias": False, "head_dim": hd, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2, **shape}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)


def worker_make_ckpt(a):
    shape = SMALL_SHAPE if a.small else FULL_SHAPE
    os.makedirs(a.dir, exist_ok=True)
    for f in os.listdir(a.dir):
        os.remove(os.path.join(a.dir, f))
    t0 = time.perf_counter()
    import torch

    info = {"shape": shape, "seed": 0, "torch": torch.__version__}
    try:
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as err:
        transformers = None
        info["generator"] = f"fallback writer (transformers not importable: {err})"
    if transformers is not None:
        try:
            info["transformers"] = transformers.__version__
            _save_pretrained(torch, LlamaConfig, LlamaForCausalLM, shape, a)
            info["generator"] = "transformers save_pretrained"
        except Exception as err:  # keep the other scenarios alive: the same names, written by hand
            info["generator"] = f"fallback writer (save_pretrained failed: {type(err).__name__}: {err})"
            info["saveTraceback"] = traceback.format_exc()[-2000:]
            for f in os.listdir(a.dir):
                os.remove(os.path.join(a.dir, f))
    if not info["generator"].startswith("transformers"):
        fallback_checkpoint(a.dir, shape, 0)
    os.sync()
    files = ckpt_files(a.dir)
    info.update({
        "ok": len(files) >= 1,
        "dir": a.dir,
        "files": [os.path.basename(p) for p in files],
        "fileBytes": [os.path.getsize(p) for p in files],
        "bytes": sum(os.path.getsize(p) for p in files),
        "tensors": sum(len(safetensors_names(p)) for p in files),
        "otherFiles": sorted(f for f in os.listdir(a.dir) if not f.endswith(".safetensors")),
        "seconds": round(time.perf_counter() - t0, 2),
    })
    emit(info)
    return 0 if info["ok"] else 1


def safetensors_names(path):
    import struct

    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return [k for k in json.loads(f.read(n)) if k != "__metadata__"]


def _save_pretrained(torch, LlamaConfig, LlamaForCausalLM, shape, a):
    config = LlamaConfig(**shape, tie_word_embeddings=False, max_position_embeddings=2048)
    torch.manual_seed(0)
    # Initialised on the GPU (seconds instead of a minute on the CPU), saved from the CPU.
    with torch.device("cuda:0" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(config)
    model = model.to(torch.bfloat16).to("cpu")
    model.save_pretrained(a.dir, max_shard_size=a.max_shard_size)


# ----------------------------------------------------------------------------------------------
# Worker: verify (one rank: attach, compare every tensor, time attach vs disk)
# ----------------------------------------------------------------------------------------------

def worker_verify(a):
    sys.path.insert(0, CLIENT_PATH)
    from weightd_client import WeightdClient, find_socket

    torch, cuda, dev = setup_torch(a.device_index)
    res = {"rank": a.rank, "tp": a.tp, "device": dev, "ok": False}
    path = find_socket(global_rank=a.rank, socket_dir=a.socket_dir)
    client = WeightdClient(path)
    ping = client.ping()
    fp = ping["fingerprint"]
    res.update({"socket": path, "fingerprint": fp, "daemonDevice": ping["device"], "daemonRank": ping["rank"]})

    # Attach/detach: the first one apart (it loads the driver library), then a median of N.
    t0 = time.perf_counter()
    att = client.attach(fp, device=a.device_index)
    res["firstAttachMs"] = round((time.perf_counter() - t0) * 1e3, 3)
    att.detach()
    times, handles = [], None
    for _ in range(a.attach_reps):
        t0 = time.perf_counter()
        att = client.attach(fp, device=a.device_index)
        times.append((time.perf_counter() - t0) * 1e3)
        handles = len(att._mapping.pointers) if hasattr(att._mapping, "pointers") else len(att.state["segments"])
        att.detach()
    res.update({"attachMsMedian": round(statistics.median(times), 3), "attachMs": [round(x, 3) for x in times], "ipcHandles": handles})

    # The same bytes from disk, as an engine loads them without the cache (page cache warm: the
    # daemon just read these files).
    disk_times, full = [], None
    for _ in range(a.disk_reps):
        full = None
        sync(torch, cuda)
        t0 = time.perf_counter()
        full = load_checkpoint(a.ckpt, dev)
        sync(torch, cuda)
        disk_times.append((time.perf_counter() - t0) * 1e3)
    res["diskLoadMs"] = [round(x, 1) for x in disk_times]
    res["diskLoadMsMedian"] = round(statistics.median(disk_times), 1)
    res["diskBytes"] = sum(t.numel() * t.element_size() for t in full.values())
    res["diskOverAttach"] = round(res["diskLoadMsMedian"] / res["attachMsMedian"], 1) if res["attachMsMedian"] else None

    att = client.attach(fp, device=a.device_index)
    try:
        manifest = {t["name"]: t for t in att.state["tensors"]}
        aliases = att.state.get("aliases", {})
        res["segments"] = [{"segment": s["segment"], "bytes": s["bytes"]} for s in att.state["segments"]]
        res["rankBytes"] = sum(t["bytes"] for t in att.state["tensors"])
        names = sorted(set(manifest) | set(aliases))
        missing = sorted(set(full) - set(names))
        # A tied weight the checkpoint does not store (lm_head under tie_word_embeddings) is served
        # as an alias: it must be the very same device memory as its target, not an extra tensor.
        tied = sorted(n for n in set(aliases) - set(full) if aliases[n] in full and att.tensors[n].data_ptr() == att.tensors[aliases[n]].data_ptr())
        extra = sorted(set(names) - set(full) - set(tied))
        mismatched, rule_mismatch, by_role, by_dim, devices = [], [], {}, {}, set()
        for name in names:
            if name not in full:
                continue
            got = att.tensors[name]
            devices.add(str(got.device))
            want = full[name]
            role = role_of(name)
            if list(got.shape) == list(want.shape):
                dim = None
                expected = want
            else:
                diff = [d for d in range(want.dim()) if got.dim() == want.dim() and got.shape[d] != want.shape[d]]
                if len(diff) != 1 or want.shape[diff[0]] != got.shape[diff[0]] * a.tp:
                    mismatched.append({"name": name, "why": f"shape {list(got.shape)} is no 1/{a.tp} of {list(want.shape)}"})
                    continue
                dim = diff[0]
                expected = torch.chunk(want, a.tp, dim=dim)[a.rank]
            if a.tp > 1 and dim != expected_dim(role, want.dim()):
                rule_mismatch.append({"name": name, "role": role, "dim": dim})
            key = "replicated" if dim is None else f"dim{dim}"
            by_dim[key] = by_dim.get(key, 0) + 1
            by_role[role] = by_role.get(role, 0) + 1
            if not same_bits(torch, got, expected):
                mismatched.append({"name": name, "why": "bytes differ"})
        res.update({
            "tensorsChecked": sum(by_dim.values()), "manifestTensors": len(manifest), "aliases": len(aliases),
            "checkpointTensors": len(full), "missing": missing, "extra": extra, "tiedAliases": tied, "mismatched": mismatched[:20],
            "mismatchedCount": len(mismatched), "byRole": by_role, "bySplit": by_dim, "ruleMismatch": rule_mismatch[:20],
            "tensorDevices": sorted(devices),
        })
        res["ok"] = not missing and not extra and not mismatched and not rule_mismatch and res["tensorsChecked"] == len(full)
    finally:
        got = None  # the last view: on cuda the handles and the lease wait for every view to be freed
        att.detach()
    stats = client.stats()
    res["leasesLeft"] = len(stats["leases"])
    res["ok"] = res["ok"] and res["leasesLeft"] == 0
    client.close()
    emit(res)
    return 0 if res["ok"] else 1



# ----------------------------------------------------------------------------------------------
# Workers: hold (an engine that keeps its mapping through restarts) and fill (someone else's
# allocation between two lives of the daemon)
# ----------------------------------------------------------------------------------------------

def worker_hold(a):
    """Attaches, keeps every tensor mapped and a private copy of it; then, per line on stdin,
    compares the mapped tensors with the copy ("check") until "exit". One JSON line per step."""
    sys.path.insert(0, CLIENT_PATH)
    from weightd_client import WeightdClient, find_socket

    torch, cuda, dev = setup_torch(a.device_index)
    client = WeightdClient(find_socket(global_rank=a.rank, socket_dir=a.socket_dir))
    fp = client.ping()["fingerprint"]
    att = client.attach(fp, device=a.device_index)
    handle = att.state["segments"][0]["handle"]
    handle = handle if handle in ("fd", "cuda-fd") else "ipc"
    copies = {n: t.clone() for n, t in att.tensors.items()}
    sync(torch, cuda)
    emit({"step": "attached", "ok": True, "tensors": len(copies), "handle": handle, "fingerprint": fp})
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "exit":
            break
        differ = [n for n, t in att.tensors.items() if not same_bits(torch, t, copies[n])]
        sync(torch, cuda)
        emit({"step": cmd, "ok": not differ, "tensors": len(copies), "differ": differ[:10]})
    try:
        copies = None
        att.detach()
        detached = True
    except Exception as err:  # the daemon that leased it may be gone: the mapping is dropped anyway
        detached = f"{type(err).__name__}: {err}"
    emit({"step": "exit", "ok": True, "detached": detached})
    return 0


def worker_fill(a):
    """Takes the GPU's free memory but --leave-bytes, holds it until stdin closes or says exit."""
    import torch

    torch.cuda.set_device(a.device_index)
    free, total = torch.cuda.mem_get_info(a.device_index)
    take = max(0, free - a.leave_bytes)
    blocks, chunk = [], 1 << 30
    while take > 0:
        n = min(chunk, take)
        blocks.append(torch.empty(n, dtype=torch.uint8, device=f"cuda:{a.device_index}"))
        take -= n
    free_after, _ = torch.cuda.mem_get_info(a.device_index)
    emit({"step": "filled", "ok": True, "freeBefore": free, "freeAfter": free_after, "total": total})
    for line in sys.stdin:
        if line.strip() == "exit":
            break
    blocks = None
    emit({"step": "exit", "ok": True})
    return 0

# ----------------------------------------------------------------------------------------------
# Worker: model (meta-device model fed the cache's tensors vs from_pretrained)
# ----------------------------------------------------------------------------------------------

def worker_model(a):
    sys.path.insert(0, CLIENT_PATH)
    from weightd_client import WeightdClient, find_socket

    torch, cuda, dev = setup_torch(a.device_index)
    res = {"device": dev, "ok": False}
    try:
        import transformers
        from transformers import LlamaForCausalLM
    except ImportError as err:
        res.update({"skipped": f"transformers not importable: {err}"})
        emit(res)
        return 3
    res["transformers"] = transformers.__version__

    t0 = time.perf_counter()
    try:
        disk = LlamaForCausalLM.from_pretrained(a.ckpt, dtype=torch.bfloat16)
    except TypeError:
        disk = LlamaForCausalLM.from_pretrained(a.ckpt, torch_dtype=torch.bfloat16)
    if next(disk.parameters()).dtype != torch.bfloat16:  # a transformers that ignored dtype=
        disk = disk.to(torch.bfloat16)
    disk = disk.to(dev).eval()
    sync(torch, cuda)
    res["fromPretrainedSeconds"] = round(time.perf_counter() - t0, 2)
    res["attnImplementation"] = getattr(disk.config, "_attn_implementation", None)

    client = WeightdClient(find_socket(global_rank=0, socket_dir=a.socket_dir))
    fp = client.ping()["fingerprint"]
    t0 = time.perf_counter()
    att = client.attach(fp, device=a.device_index)
    try:
        with torch.device("meta"):
            cached = LlamaForCausalLM(disk.config)
        cached = cached.to(torch.bfloat16)
        keys = cached.load_state_dict(att.tensors, assign=True, strict=False)
        res["missingKeys"], res["unexpectedKeys"] = list(keys.missing_keys), list(keys.unexpected_keys)
        # Non-persistent buffers (the rotary inv_freq) are in no state dict: a module that still
        # holds meta tensors and has no parameters of its own is taken from the disk model.
        replaced = []
        for mname, mod in list(cached.named_modules()):
            if not mname:
                continue
            metas = [b for b in mod.buffers(recurse=False) if b.is_meta]
            if metas and not list(mod.parameters(recurse=False)):
                parent_name, _, child = mname.rpartition(".")
                parent = cached.get_submodule(parent_name) if parent_name else cached
                setattr(parent, child, disk.get_submodule(mname))
                replaced.append(mname)
        res["modulesFromDiskModel"] = replaced
        still_meta = [n for n, p in list(cached.named_parameters()) + list(cached.named_buffers()) if p.is_meta]
        res["stillMeta"] = still_meta[:10]
        cached.eval()
        res["loadSeconds"] = round(time.perf_counter() - t0, 3)
        # Zero-copy: every parameter is the daemon's memory, not a copy.
        params = dict(cached.named_parameters(remove_duplicate=False))
        res["parameters"] = len(params)
        res["zeroCopyParameters"] = sum(1 for n, p in params.items() if n in att.tensors and p.data_ptr() == att.tensors[n].data_ptr())
        disk_params = dict(disk.named_parameters(remove_duplicate=False))
        res["parametersEqualDisk"] = sum(1 for n, p in params.items() if n in disk_params and same_bits(torch, p.data, disk_params[n].data))

        g = torch.Generator().manual_seed(0)
        vocab = disk.config.vocab_size
        ids = torch.randint(0, vocab, (2, a.seq), generator=g).to(dev)
        with torch.inference_mode():
            want = disk(input_ids=ids, use_cache=False).logits
            again = disk(input_ids=ids, use_cache=False).logits
            got = cached(input_ids=ids, use_cache=False).logits
            sync(torch, cuda)
        res["logitsShape"] = list(got.shape)
        res["logitsDtype"] = str(got.dtype)
        res["diskDeterministic"] = bool(torch.equal(want, again))
        res["logitsEqual"] = bool(torch.equal(want, got))
        res["logitsMaxAbsDiff"] = float((want.float() - got.float()).abs().max().item())
        res["logitsFinite"] = bool(torch.isfinite(got).all().item())
        res["ok"] = (res["logitsEqual"] and not res["missingKeys"] and not res["unexpectedKeys"] and not still_meta
                     and res["zeroCopyParameters"] == len(params) and res["parametersEqualDisk"] == len(params))
        del cached, got, want, again, params  # views: detach waits for every one to be freed
    finally:
        att.detach()
        client.close()
    emit(res)
    return 0 if res["ok"] else 1


# ----------------------------------------------------------------------------------------------
# Orchestrator (stdlib only)
# ----------------------------------------------------------------------------------------------

class Budget:
    def __init__(self, seconds):
        self.end = time.monotonic() + seconds

    def left(self):
        return self.end - time.monotonic()

    def limit(self, want):
        return max(1.0, min(want, self.left()))


class Suite:
    def __init__(self, a):
        self.a = a
        self.out = os.path.abspath(a.out_dir)
        os.makedirs(self.out, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix="wd-suite-")  # short: socket paths stay < 108 bytes
        self.budget = Budget(a.budget)
        self.daemons = []  # live Popen objects
        self.proclog = os.path.join(self.out, "processes.log")
        open(self.proclog, "w").close()
        self.results = {}
        self.ckpt = a.ckpt

    # -- logging --
    def say(self, msg):
        print(f"== {time.strftime('%H:%M:%S')} [{self.budget.left():5.0f}s left] {msg}", flush=True)

    def append_log(self, title, text):
        with open(self.proclog, "a") as f:
            f.write(f"\n===== {title} =====\n{text}\n")

    # -- processes --
    def env(self, visible=None, host_devices=None):
        env = dict(os.environ)
        env["PYTHONPATH"] = CLIENT_PATH + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
            env[k] = v
        if self.a.device == "cuda" and visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        if self.a.device == "host" and host_devices is not None:
            env["WEIGHTD_HOST_DEVICES"] = host_devices
        return env

    def worker(self, title, args, timeout, visible=None):
        """Runs this file as a worker; returns its JSON (or an error record)."""
        cmd = [sys.executable, os.path.abspath(__file__)] + args
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, env=self.env(visible), capture_output=True, text=True, timeout=self.budget.limit(timeout))
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = "timeout", _text(e.stdout), _text(e.stderr) + f"\n(killed after {e.timeout:.0f} s)"
        return self.worker_result(title, args, rc, out or "", err or "", t0)

    def worker_result(self, title, args, rc, out, err, t0):
        """Logs a worker's output and returns its last JSON line, with exit code and timing."""
        self.append_log(f"{title}: {' '.join(args)} -> rc {rc}", out + err)
        try:
            result = json.loads(out.strip().splitlines()[-1])
        except Exception:
            result = {"ok": False}
        result["exitCode"] = rc
        result["wallSeconds"] = round(time.monotonic() - t0, 2)
        if rc != 0:
            result["stderrTail"] = err[-2500:]
        return result

    def workers_parallel(self, jobs, timeout):
        """jobs: [(title, args, visible)]; runs them at once; returns their results in order."""
        procs = []
        for title, args, visible in jobs:
            cmd = [sys.executable, os.path.abspath(__file__)] + args
            f_out = tempfile.TemporaryFile(mode="w+")
            f_err = tempfile.TemporaryFile(mode="w+")
            procs.append((title, args, subprocess.Popen(cmd, env=self.env(visible), stdout=f_out, stderr=f_err, text=True), f_out, f_err, time.monotonic()))
        deadline = time.monotonic() + self.budget.limit(timeout)
        results = []
        for title, args, p, f_out, f_err, t0 in procs:
            try:
                rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                rc = "timeout"
            f_out.seek(0)
            f_err.seek(0)
            results.append(self.worker_result(title, args, rc, f_out.read(), f_err.read(), t0))
        return results

    def start_daemon(self, name, socket_dir, tp, visible, host_devices, extra=()):
        os.makedirs(socket_dir, mode=0o700, exist_ok=True)
        log_path = os.path.join(self.work, f"{name}.log")
        # WEIGHTD_BIN: the daemon to test, e.g. bin/weightd of an unpacked `npm run bundle`.
        daemon = [os.environ["WEIGHTD_BIN"]] if os.environ.get("WEIGHTD_BIN") else ["node", os.path.join(ROOT, "dist", "main.js")]
        cmd = [*daemon, "--model", self.ckpt, "--device", self.a.device, "-tp", str(tp),
               "--weight-cache-socket-dir", socket_dir, *extra]
        log = open(log_path, "w")
        p = subprocess.Popen(cmd, env=self.env(visible, host_devices), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        log.close()
        d = {"name": name, "proc": p, "log": log_path, "cmd": " ".join(cmd), "visible": visible, "started": time.monotonic()}
        self.daemons.append(d)
        self.say(f"started {name} (pid {p.pid}): {d['cmd']}" + (f" CUDA_VISIBLE_DEVICES={visible}" if visible else ""))
        return d

    def log_text(self, d):
        try:
            with open(d["log"]) as f:
                return f.read()
        except OSError:
            return ""

    def loaded_line(self, d):
        """The daemon's own account of its load ("all N local ranks loaded: ... (X/s)")."""
        found = None
        for line in self.log_text(d).splitlines():
            if "local ranks loaded" in line:
                try:
                    found = json.loads(line).get("msg")
                except ValueError:
                    found = line[:300]
        return found

    def wait_for(self, daemons, pattern, timeout, what):
        """Waits until every daemon's log matches; returns {name: seconds since its start}."""
        deadline = time.monotonic() + self.budget.limit(timeout)
        seen = {}
        while len(seen) < len(daemons):
            for d in daemons:
                if d["name"] in seen:
                    continue
                if pattern.search(self.log_text(d)):
                    seen[d["name"]] = round(time.monotonic() - d["started"], 2)
                elif d["proc"].poll() is not None:
                    raise RuntimeError(f"{d['name']} exited {d['proc'].returncode} before {what}; log tail:\n{self.log_text(d)[-2000:]}")
            if len(seen) < len(daemons):
                if time.monotonic() > deadline:
                    missing = [d["name"] for d in daemons if d["name"] not in seen]
                    raise RuntimeError(f"no {what} from {missing} within {timeout:.0f} s; log tails:\n"
                                       + "\n".join(f"[{d['name']}] {self.log_text(d)[-1500:]}" for d in daemons if d["name"] in missing))
                time.sleep(0.1)
        return seen

    def stop_daemons(self, daemons, title):
        """SIGTERM, wait (30 s), SIGKILL if need be; returns {name: exit code} and logs them."""
        for d in daemons:
            if d["proc"].poll() is None:
                d["proc"].send_signal(signal.SIGTERM)
        codes = {}
        deadline = time.monotonic() + 30
        for d in daemons:
            try:
                codes[d["name"]] = d["proc"].wait(timeout=max(0.5, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                d["proc"].kill()
                d["proc"].wait()
                codes[d["name"]] = "killed after 30 s without exiting on SIGTERM"
            if d in self.daemons:
                self.daemons.remove(d)
            self.append_log(f"{title}: daemon {d['name']} ({d['cmd']}; CUDA_VISIBLE_DEVICES={d['visible']}) -> exit {codes[d['name']]}", self.log_text(d))
        return codes

    def kill_all(self):
        for d in list(self.daemons):
            try:
                if d["proc"].poll() is None:
                    d["proc"].kill()
                    d["proc"].wait(timeout=10)
            except Exception:
                pass
            self.append_log(f"daemon {d['name']} killed at suite end", self.log_text(d))
            self.daemons.remove(d)

    # -- scenarios --
    def scenario(self, name, fn, min_seconds):
        self.say(f"scenario {name}")
        t0 = time.monotonic()
        res = {"scenario": name, "status": "fail"}
        try:
            if self.budget.left() < min_seconds:
                res.update(status="skipped", error=f"only {self.budget.left():.0f} s of the suite budget left (needs {min_seconds})")
            else:
                fn(res)
        except Exception as err:
            res["error"] = f"{type(err).__name__}: {err}"
            res["traceback"] = traceback.format_exc()[-3000:]
        finally:
            try:
                self.kill_all()
            except Exception:
                pass
            res["seconds"] = round(time.monotonic() - t0, 2)
            self.results[name] = res
            with open(os.path.join(self.out, f"{name}.json"), "w") as f:
                json.dump(res, f, indent=1, default=str)
            self.say(f"scenario {name}: {res['status'].upper()}" + (f" ({res.get('error', '')[:300]})" if res.get("error") else ""))

    def s_checkpoint(self, res):
        if self.ckpt:
            res.update(status="pass", given=self.ckpt, note="--ckpt given: not generated")
            return
        ckpt = self.a.ckpt_dir
        r = self.worker("checkpoint", ["make-ckpt", "--dir", ckpt] + (["--small"] if self.a.small else []), 240, visible="0")
        res["checkpoint"] = r
        if r.get("ok") and r.get("exitCode") == 0:
            self.ckpt = ckpt
            several = len(r.get("files", [])) >= 2
            res["status"] = "pass" if r.get("generator", "").startswith("transformers") and several else "partial"
        else:
            res["error"] = "checkpoint not written"

    def need_ckpt(self):
        if not self.ckpt:
            raise RuntimeError("no checkpoint (the checkpoint scenario failed)")

    def s_tp1(self, res):
        self.need_ckpt()
        sock = os.path.join(self.work, "s1")
        d = self.start_daemon("tp1", sock, 1, "0", "host-gpu-0")
        res["daemon"] = {"cmd": d["cmd"], "CUDA_VISIBLE_DEVICES": "0"}
        res["daemon"]["readySeconds"] = self.wait_for([d], READY_RE, 120, "READY")["tp1"]
        common = ["--socket-dir", sock, "--ckpt", self.ckpt, "--device-index", "0"]
        res["verify"] = v = self.worker("tp1 verify", ["verify", "--rank", "0", "--tp", "1", *common], 150, visible="0")
        res["model"] = m = self.worker("tp1 model", ["model", *common], 200, visible="0")
        res["daemon"]["loaded"] = self.loaded_line(d)
        codes = self.stop_daemons([d], "tp1")
        res["daemon"]["exitCode"] = codes["tp1"]
        model_ok = m.get("ok") is True
        ok = v.get("ok") is True and codes["tp1"] == 0
        res["status"] = "pass" if ok and model_ok else ("partial" if ok and m.get("skipped") else "fail")

    def s_tp2(self, res):
        self.need_ckpt()
        sock = os.path.join(self.work, "s2")
        d = self.start_daemon("tp2", sock, 2, "0,1", "host-gpu-0,host-gpu-1")
        res["daemon"] = {"cmd": d["cmd"], "CUDA_VISIBLE_DEVICES": "0,1"}
        res["daemon"]["readySeconds"] = self.wait_for([d], READY_RE, 120, "READY")["tp2"]
        jobs = [(f"tp2 verify rank {r}", ["verify", "--rank", str(r), "--tp", "2", "--device-index", str(r), "--socket-dir", sock,
                                          "--ckpt", self.ckpt, "--disk-reps", "1"], "0,1") for r in (0, 1)]
        res["ranks"] = ranks = self.workers_parallel(jobs, 150)
        res["daemon"]["loaded"] = self.loaded_line(d)
        codes = self.stop_daemons([d], "tp2")
        res["daemon"]["exitCode"] = codes["tp2"]
        res["status"] = "pass" if all(r.get("ok") is True for r in ranks) and codes["tp2"] == 0 else "fail"

    def s_two_node(self, res):
        self.need_ckpt()
        port = str(self.a.master_port)
        nodes = []
        for n in (0, 1):
            sock = os.path.join(self.work, f"n{n}")
            extra = ["--nnodes", "2", "--node-rank", str(n), "--master-addr", "127.0.0.1", "--weight-cache-master-port", port,
                     "--rendezvous-timeout", "90"]
            nodes.append((sock, self.start_daemon(f"node{n}", sock, 2, str(n), f"host-gpu-{n}", extra)))
        daemons = [d for _, d in nodes]
        res["daemons"] = [{"cmd": d["cmd"], "CUDA_VISIBLE_DEVICES": d["visible"]} for d in daemons]
        res["readySeconds"] = self.wait_for(daemons, READY_RE, 150, "READY")
        res["groupReadySeconds"] = self.wait_for(daemons, re.compile(re.escape(GROUP_READY)), 30, "group ready")
        # Each node's client sees one GPU (its node's): device 0 in that process, global rank n.
        jobs = [(f"two-node verify node {n}", ["verify", "--rank", str(n), "--tp", "2", "--device-index", "0", "--socket-dir", sock,
                                                "--ckpt", self.ckpt, "--disk-reps", "1"], str(n)) for n, (sock, _) in enumerate(nodes)]
        res["ranks"] = ranks = self.workers_parallel(jobs, 150)
        res["exitCodes"] = codes = self.stop_daemons(daemons, "two-node")
        res["loaded"] = {d["name"]: self.loaded_line(d) for d in daemons}
        tp2 = self.results.get("tp2", {}).get("ranks") or []
        if len(tp2) == 2:  # the same plan as one node with tp=2: the same per-rank fingerprints
            res["fingerprintsEqualTp2"] = [r.get("fingerprint") == t.get("fingerprint") for r, t in zip(ranks, tp2)]
        res["status"] = "pass" if all(r.get("ok") is True for r in ranks) and all(c == 0 for c in codes.values()) else "fail"

    # -- restart (issue 14): the keeper keeps the rank through every kind of death --
    def keeper_pids(self, sock):
        """weightd-keeper processes serving this socket dir's keeper.sock (from /proc)."""
        want = os.path.join(sock, "keeper.sock")
        pids = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if argv and os.path.basename(argv[0]) == b"weightd-keeper" and want.encode() in argv:
                pids.append(int(pid))
        return pids

    def wait_keepers_gone(self, sock, timeout):
        """True once no keeper of this socket dir runs (an orphaned one is reaped by init)."""
        deadline = time.monotonic() + timeout
        while self.keeper_pids(sock):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def proc_io(self, pid):
        with open(f"/proc/{pid}/io") as f:
            return {k: int(v) for k, v in (l.split(": ") for l in f.read().splitlines())}

    def gpu_used_mib(self):
        if self.a.device != "cuda":
            return None
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"], capture_output=True, text=True, timeout=20).stdout
        return int(out.strip().splitlines()[0])

    def ready_line(self, d):
        for line in self.log_text(d).splitlines():
            if READY_RE.search(line):
                return json.loads(line)
        return None

    def drop_caches(self):
        try:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            return True
        except OSError:
            return False

    def talk(self, p, line, timeout):
        """Writes a line to a hold/fill worker and returns its next JSON line."""
        if line is not None:
            p.stdin.write(line + "\n")
            p.stdin.flush()
        import select
        r, _, _ = select.select([p.stdout], [], [], self.budget.limit(timeout))
        if not r:
            raise RuntimeError(f"worker {p.args[2]} said nothing within {timeout} s")
        text = p.stdout.readline()
        if not text:
            raise RuntimeError(f"worker {p.args[2]} exited {p.wait()}: {p.stderr.read()[-2000:]}")
        return json.loads(text)

    def spawn_worker(self, args):
        cmd = [sys.executable, os.path.abspath(__file__)] + args
        return subprocess.Popen(cmd, env=self.env("0"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def s_restart(self, res):
        """A tp=1 daemon with --keeper spawn (VMM descriptors on cuda) killed and restarted:
        adoption without reading the checkpoint, bytes equal to disk, an engine holding its
        mapping through everything, the keeper killed and re-created, GPU memory taken by
        someone else between lives, and nothing left behind."""
        self.need_ckpt()
        sock = os.path.join(self.work, "rs")
        flags = ["--keeper", "spawn", "--log-level", "debug"] + (["--cuda-handles", "fd"] if self.a.device == "cuda" else [])
        devices = "host-restart-0"
        ckpt_bytes = sum(os.path.getsize(f) for f in ckpt_files(self.ckpt))
        res["checkpointBytes"] = ckpt_bytes
        res["gpuUsedMiBAtStart"] = self.gpu_used_mib()
        steps = res["steps"] = []
        workers = []
        verify = ["verify", "--rank", "0", "--tp", "1", "--socket-dir", sock, "--ckpt", self.ckpt, "--device-index", "0", "--attach-reps", "3", "--disk-reps", "1"]

        def step(name, ok, **info):
            steps.append({"step": name, "ok": bool(ok), **info})
            self.say(f"restart: {name}: {'ok' if ok else 'FAILED'} {json.dumps(info, default=str)[:300]}")

        def life(name, expect_adopted, drop=False):
            dropped = self.drop_caches() if drop else None
            d = self.start_daemon(name, sock, 1, "0", devices, flags)
            seconds = self.wait_for([d], READY_RE, 120, "READY")[name]
            io = self.proc_io(d["proc"].pid)
            ready = self.ready_line(d) or {}
            adopted = ready.get("adoptedRanks")
            step(f"{name} READY", adopted == expect_adopted, readySeconds=seconds, adoptedRanks=adopted, expected=expect_adopted,
                 rchar=io.get("rchar"), readBytes=io.get("read_bytes"), cacheDropped=dropped)
            return d, io

        def kill9(d):
            d["proc"].kill()
            d["proc"].wait()
            self.daemons.remove(d)
            self.append_log(f"restart: {d['name']} killed -9", self.log_text(d))

        def log_has(d, text, timeout):
            deadline = time.monotonic() + self.budget.limit(timeout)
            while time.monotonic() < deadline:
                if text in self.log_text(d):
                    return True
                time.sleep(0.1)
            return False

        try:
            a, io1 = life("life1", 0)
            keepers = self.keeper_pids(sock)
            step("a keeper was spawned", len(keepers) == 1, pids=keepers)
            holder = self.spawn_worker(["hold", "--socket-dir", sock, "--device-index", "0"])
            workers.append(holder)
            h = self.talk(holder, None, 120)
            step("an engine attached and holds its tensors", h.get("ok"), tensors=h.get("tensors"), handle=h.get("handle"))

            kill9(a)
            h = self.talk(holder, "after life1 was killed -9", 60)
            step("the engine's tensors are intact after kill -9 of the daemon", h.get("ok"), differ=h.get("differ"))

            b, io = life("life2", 1, drop=True)
            # Adoption reads headers and content samples, not the tensors: at least 90% of the
            # checkpoint less than the loading life read (both also read Node's and weightd's modules).
            step("life2 read at most a tenth of the checkpoint (page cache dropped)", io["rchar"] <= io1["rchar"] - 0.9 * ckpt_bytes,
                 rchar=io["rchar"], readBytes=io["read_bytes"], loadingLifeRchar=io1["rchar"], checkpointBytes=ckpt_bytes)
            v = self.worker("restart verify life2", verify, 150, visible="0")
            res["verifyLife2"] = v
            step("a new engine attaches to life2: every tensor equal to disk", v.get("ok") and v.get("exitCode") == 0,
                 tensorsChecked=v.get("tensorsChecked"), mismatched=v.get("mismatchedCount"), firstAttachMs=v.get("firstAttachMs"),
                 attachMsMedian=v.get("attachMsMedian"))
            h = self.talk(holder, "after life2 READY", 60)
            step("the first engine's tensors are intact after the restart", h.get("ok"), differ=h.get("differ"))

            old = self.keeper_pids(sock)
            for pid in old:
                os.kill(pid, signal.SIGKILL)
            noticed = log_has(b, "the keeper ended", 30)
            again = log_has(b, "a keeper answers again", 60)
            new = [p for p in self.keeper_pids(sock) if p not in old]
            step("life2 noticed the keeper's kill -9 and re-created one", noticed and again and len(new) == 1, old=old, new=new)
            v = self.worker("restart verify after keeper kill", verify, 150, visible="0")
            step("life2 serves on after its keeper was killed", v.get("ok") and v.get("exitCode") == 0, mismatched=v.get("mismatchedCount"))

            kill9(b)
            if self.a.device == "cuda":
                # Someone else takes the GPU between two lives: what is kept needs no new memory.
                filler = self.spawn_worker(["fill", "--device-index", "0", "--leave-bytes", str(3 << 30)])
                workers.append(filler)
                f = self.talk(filler, None, 120)
                step("another process took the GPU's free memory but 3 GiB", f.get("ok"), freeAfter=f.get("freeAfter"))
            c, _ = life("life3", 1)
            v = self.worker("restart verify life3", verify, 150, visible="0")
            step("life3 adopted what the re-created keeper holds: every tensor equal to disk", v.get("ok") and v.get("exitCode") == 0,
                 mismatched=v.get("mismatchedCount"))
            if self.a.device == "cuda":
                self.talk(filler, "exit", 60)
                filler.wait(timeout=60)

            # Both killed: the kept memory is gone, except what the engine still maps.
            kill9(c)
            for pid in self.keeper_pids(sock):
                os.kill(pid, signal.SIGKILL)
            gone = self.wait_keepers_gone(sock, 30)
            h = self.talk(holder, "after the daemon and the keeper were both killed -9", 60)
            step("an engine still maps its tensors after the keeper that held them died", h.get("ok") and gone, differ=h.get("differ"), keeperGone=gone)
            self.talk(holder, "exit", 60)
            holder.wait(timeout=60)

            if self.a.device == "cuda":
                rank_bytes = res["verifyLife2"].get("rankBytes") or ckpt_bytes
                filler = self.spawn_worker(["fill", "--device-index", "0", "--leave-bytes", str(rank_bytes // 2)])
                workers.append(filler)
                f = self.talk(filler, None, 120)
                d = self.start_daemon("life4-full", sock, 1, "0", devices, flags)
                try:
                    code = d["proc"].wait(timeout=self.budget.limit(90))
                    self.daemons.remove(d)
                except subprocess.TimeoutExpired:
                    code = "still running after 90 s"  # killed at the scenario's end
                text = self.log_text(d)
                self.append_log("restart: life4-full", text)
                step("with nothing kept and the GPU taken, the daemon exits with E_OUT_OF_MEMORY naming the bytes", code not in (0, "still running after 90 s") and "E_OUT_OF_MEMORY" in text,
                     exitCode=code, freeLeft=f.get("freeAfter"), rankBytes=rank_bytes)
                self.talk(filler, "exit", 60)
                filler.wait(timeout=60)

            e, io = life("life5", 0)
            step("with nothing kept, the next life loads from the checkpoint", io["rchar"] >= ckpt_bytes, rchar=io["rchar"])
            codes = self.stop_daemons([e], "restart life5")
            for pid in self.keeper_pids(sock):
                os.kill(pid, signal.SIGTERM)
            gone = self.wait_keepers_gone(sock, 30)
            step("SIGTERM stops the daemon (exit 0) and the keeper; no keeper is left", codes.get("life5") == 0 and gone,
                 exitCode=codes.get("life5"), keepersLeft=self.keeper_pids(sock))
            used = self.gpu_used_mib()
            if used is not None:
                step("GPU memory is back to its start value", used <= res["gpuUsedMiBAtStart"] + 64, usedMiB=used, atStartMiB=res["gpuUsedMiBAtStart"])
        finally:
            for p in workers:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for pid in self.keeper_pids(sock):
                os.kill(pid, signal.SIGKILL)
        res["status"] = "pass" if steps and all(x["ok"] for x in steps) else "fail"

    def run(self):
        # (name, body, seconds of budget it needs, GPUs it needs): a machine with fewer GPUs
        # reports the scenario as skipped, with why, instead of as a failure of weightd.
        plan = [("checkpoint", self.s_checkpoint, 30, 1), ("tp1", self.s_tp1, 45, 1), ("tp2", self.s_tp2, 30, 2), ("two-node", self.s_two_node, 30, 2),
                ("restart", self.s_restart, 60, 1)]
        wanted = self.a.scenarios.split(",")
        gpus = visible_gpu_count() if self.a.device == "cuda" else 8  # the host backend simulates its devices
        for name, fn, need, need_gpus in plan:
            if name not in wanted:
                continue
            if gpus < need_gpus:
                self.results[name] = {"scenario": name, "status": "skipped", "error": f"needs {need_gpus} GPUs, this machine shows {gpus}"}
                self.say(f"scenario {name}: SKIPPED (needs {need_gpus} GPUs, {gpus} visible)")
                continue
            self.scenario(name, fn, need)
        return self.summary()

    def summary(self):
        rows = []
        for name, r in self.results.items():
            row = {"scenario": name, "status": r["status"], "seconds": r.get("seconds")}
            if name == "checkpoint":
                c = r.get("checkpoint", {})
                row.update({k: c.get(k) for k in ("generator", "transformers", "bytes", "tensors", "files") if k in c})
            if name == "tp1":
                v, m = r.get("verify", {}), r.get("model", {})
                row.update({"tensorsChecked": v.get("tensorsChecked"), "mismatched": v.get("mismatchedCount"), "ipcHandles": v.get("ipcHandles"),
                            "attachMsMedian": v.get("attachMsMedian"), "diskLoadMsMedian": v.get("diskLoadMsMedian"),
                            "diskOverAttach": v.get("diskOverAttach"), "logitsEqual": m.get("logitsEqual"),
                            "logitsMaxAbsDiff": m.get("logitsMaxAbsDiff"), "zeroCopyParameters": m.get("zeroCopyParameters"),
                            "parameters": m.get("parameters"), "exitCode": r.get("daemon", {}).get("exitCode")})
            if name in ("tp2", "two-node"):
                row["ranks"] = [{k: x.get(k) for k in ("rank", "ok", "tensorsChecked", "mismatchedCount", "bySplit", "byRole", "attachMsMedian", "ipcHandles")}
                                for x in r.get("ranks", [])]
                row["exitCodes"] = r.get("exitCodes") or {name: r.get("daemon", {}).get("exitCode")}
            if name == "restart":
                row["steps"] = [{k: v for k, v in x.items() if k in ("step", "ok", "readySeconds", "rchar", "readBytes", "firstAttachMs", "attachMsMedian", "exitCode")}
                                for x in r.get("steps", [])]
            if r.get("error"):
                row["error"] = r["error"][:500]
            rows.append(row)
        for name in self.a.scenarios.split(","):
            if name not in self.results:
                rows.append({"scenario": name, "status": "not run", "error": "the suite was interrupted or out of time before it"})
        passed = sum(1 for r in rows if r["status"] == "pass")
        skipped = sum(1 for r in rows if r["status"] == "skipped")
        try:
            gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
        except Exception as err:
            gpus = [f"nvidia-smi: {err}"]
        summary = {"device": self.a.device, "gpus": gpus, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "scenarios": rows, "passed": passed, "total": len(rows),
                   "skipped": skipped, "budgetLeftSeconds": round(self.budget.left(), 1)}
        with open(os.path.join(self.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1, default=str)
        print(json.dumps(summary, indent=1, default=str), flush=True)
        failed = len(rows) - passed - skipped
        print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""), flush=True)
        return 0 if failed == 0 else 1


def _text(b):
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else b


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out-dir", required=True)
    r.add_argument("--device", choices=["cuda", "host"], default="cuda")
    r.add_argument("--ckpt", help="use this checkpoint instead of writing one")
    r.add_argument("--ckpt-dir", default="/var/tmp/weightd-daemon-suite/ckpt", help="where the checkpoint scenario writes")
    r.add_argument("--small", action="store_true", help="a small model (dry runs)")
    r.add_argument("--scenarios", default="checkpoint,tp1,tp2,two-node,restart")
    r.add_argument("--budget", type=float, default=float(os.environ.get("WEIGHTD_SUITE_BUDGET_S", "420")))
    r.add_argument("--master-port", type=int, default=29611)
    m = sub.add_parser("make-ckpt")
    m.add_argument("--dir", required=True)
    m.add_argument("--small", action="store_true")
    m.add_argument("--max-shard-size", default="500MB")
    h = sub.add_parser("hold")
    h.add_argument("--socket-dir", required=True)
    h.add_argument("--device-index", type=int, default=0)
    h.add_argument("--rank", type=int, default=0)
    f = sub.add_parser("fill")
    f.add_argument("--device-index", type=int, default=0)
    f.add_argument("--leave-bytes", type=int, required=True)
    for name in ("verify", "model"):
        w = sub.add_parser(name)
        w.add_argument("--socket-dir", required=True)
        w.add_argument("--ckpt", required=True)
        w.add_argument("--device-index", type=int, default=0)
        w.add_argument("--rank", type=int, default=0)
        w.add_argument("--tp", type=int, default=1)
        w.add_argument("--attach-reps", type=int, default=5)
        w.add_argument("--disk-reps", type=int, default=3)
        w.add_argument("--seq", type=int, default=128)
    a = ap.parse_args()
    if a.cmd == "make-ckpt":
        return worker_make_ckpt(a)
    if a.cmd == "verify":
        return worker_verify(a)
    if a.cmd == "model":
        return worker_model(a)
    if a.cmd == "hold":
        return worker_hold(a)
    if a.cmd == "fill":
        return worker_fill(a)

    suite = Suite(a)

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    try:
        return suite.run()
    except KeyboardInterrupt as err:
        print(f"interrupted ({err}); writing what was measured", flush=True)
        suite.kill_all()
        suite.summary()
        return 1
    finally:
        suite.kill_all()


if __name__ == "__main__":
    sys.exit(main())
