#!/usr/bin/env python3
"""weightd end to end on real GPUs: the daemon (node dist/main.js) serves a transformers-written
Llama checkpoint and Python clients (clients/python) check every byte against safetensors.

  python3 test/gpu/daemon_suite.py run --out-dir DIR [--device cuda|host] [--ckpt DIR] [--small]
                                       [--scenarios checkpoint,tp1,tp2,two-node,restart,models,models-span]
                                       [--budget S]
                                       [--gpus N] [--swap-clients N]

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
  models      several models on one daemon (--models FILE: "main", the checkpoint, and "draft", a
              smaller Llama): with 2 GPUs main at tp=2 beside draft at tp=1, with one GPU both at
              tp=1 on it (models.json's "variant" says which ran). One client process attaches
              both at once, every tensor bit-equal, no shared memory. A client holds draft, `ctl
              unload --force draft`: it hears lease_revoked, draft is freed. Then --swap-clients
              processes hold main (v1), watch it and re-check it every 0.25 s, and one more keeps
              attaching anew, while `ctl load` brings v2 (the checkpoint with every data byte
              inverted) under the name main: held v1 stays bit-equal, each holder hears
              model_ready (v2) then model_dropping (v1, newer v2) on each rank's socket, the
              re-attaching client never sees a mix (v1, E_DRAINING naming v2, then v2), a new
              process gets v2 bit-equal; half the holders die holding v1, half move to v2: v1
              stays until the last lease ends, then is freed; status bytes and GPU memory back to
              one model's, SIGTERM exit 0 and GPU memory back to its start
  models-span two daemons (--nnodes 2 over 127.0.0.1, one GPU each: a group refuses two nodes
              on one device) serve "main" at tp=2 across them; a swap to v2 that node 1 cannot
              load (its copy cut short) fails on both nodes: v2 attachable on neither, v1 serving
              on bit-equal, GPU memory back to one version's; then a swap both load serves v2 on
              both and frees v1; SIGTERM, exit 0, GPU memory back to its start
Also DIR/summary.json and DIR/processes.log (every daemon's and worker's output).

The orchestration uses the standard library only; the workers (same file: make-ckpt, verify,
model, hold, fill, models-attach, span-attach, swap-hold, swap-churn) need torch and safetensors, and
transformers for the checkpoint and the model check.
`--device host` runs the same orchestration on the host backend (no GPU; CI-machine dry run); it
simulates 8 devices, so `--gpus 1` dry-runs what a one-GPU machine runs.
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
# The models scenario's second model, a draft beside the main one (about 225 MB of bf16): other
# shapes, so a client that got the wrong model's tensors would not even see the right names' shapes.
DRAFT_SHAPE = dict(hidden_size=1024, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8,
                   intermediate_size=2816, vocab_size=32000)
DRAFT_SMALL_SHAPE = dict(hidden_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=344, vocab_size=2048)

# The READY log line: JSON off a terminal, its msg starting with "READY node ".
READY_RE = re.compile(r'"msg":"READY node ')
GROUP_READY = "group ready: every node is serving"

# How far apart two readings of GPU memory may be and still count as the same set of tensors:
# both taken with the daemon as the only process with a CUDA context, so what may differ is the
# driver's rounding of segments and its own bookkeeping (a few MiB), far below one model's bytes.
MEM_TOLERANCE_MIB = 64


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


def write_variant(src, dst):
    """Another version of a checkpoint: the same files, names, shapes and dtypes with every data
    byte inverted (test/helpers/variantCheckpoint.ts's rule), so its content fingerprint and
    every tensor's bytes differ. Standard library only (the orchestrator writes it)."""
    import shutil
    import struct

    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    invert = bytes(255 - i for i in range(256))
    for name in os.listdir(src):
        if not name.endswith(".safetensors"):
            shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
            continue
        with open(os.path.join(src, name), "rb") as fi, open(os.path.join(dst, name), "wb") as fo:
            head = fi.read(8)
            fo.write(head + fi.read(struct.unpack("<Q", head)[0]))
            while chunk := fi.read(64 << 20):
                fo.write(chunk.translate(invert))
    os.sync()


def worker_make_ckpt(a):
    shape = (DRAFT_SMALL_SHAPE if a.small else DRAFT_SHAPE) if a.draft else (SMALL_SHAPE if a.small else FULL_SHAPE)
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


def compare_rank(torch, att, full, tp, rank):
    """Every tensor of one attached rank against the checkpoint's (``full``: name -> tensor): equal
    bits to the full tensor or to its torch.chunk along the split dim the family's rule names.
    Returns the counts and lists; ``ok`` when all are equal and none is missing or extra."""
    manifest = {t["name"]: t for t in att.state["tensors"]}
    aliases = att.state.get("aliases", {})
    res = {"segments": [{"segment": s["segment"], "bytes": s["bytes"]} for s in att.state["segments"]],
           "rankBytes": sum(t["bytes"] for t in att.state["tensors"])}
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
            if len(diff) != 1 or want.shape[diff[0]] != got.shape[diff[0]] * tp:
                mismatched.append({"name": name, "why": f"shape {list(got.shape)} is no 1/{tp} of {list(want.shape)}"})
                continue
            dim = diff[0]
            expected = torch.chunk(want, tp, dim=dim)[rank]
        if tp > 1 and dim != expected_dim(role, want.dim()):
            rule_mismatch.append({"name": name, "role": role, "dim": dim})
        key = "replicated" if dim is None else f"dim{dim}"
        by_dim[key] = by_dim.get(key, 0) + 1
        by_role[role] = by_role.get(role, 0) + 1
        # One process may hold ranks on several GPUs against one copy of the checkpoint.
        if not same_bits(torch, got, expected.to(got.device)):
            mismatched.append({"name": name, "why": "bytes differ"})
    res.update({
        "tensorsChecked": sum(by_dim.values()), "manifestTensors": len(manifest), "aliases": len(aliases),
        "checkpointTensors": len(full), "missing": missing, "extra": extra, "tiedAliases": tied, "mismatched": mismatched[:20],
        "mismatchedCount": len(mismatched), "byRole": by_role, "bySplit": by_dim, "ruleMismatch": rule_mismatch[:20],
        "tensorDevices": sorted(devices),
    })
    res["ok"] = not missing and not extra and not mismatched and not rule_mismatch and res["tensorsChecked"] == len(full)
    return res


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
        res.update(compare_rank(torch, att, full, a.tp, a.rank))
    finally:
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
# Workers: models (issue 17: several models on one daemon, a swap under live clients)
# ----------------------------------------------------------------------------------------------

def rank_clients(socket_dir, tp):
    """One client per rank of a model of tp size ``tp``: its ranks take the first tp devices, so
    rank r is on the socket of device r, the one the node's own rank r serves (node.json)."""
    from weightd_client import WeightdClient, find_socket

    return [WeightdClient(find_socket(global_rank=r, socket_dir=socket_dir), client_name=f"suite-{os.getpid()}") for r in range(tp)]


def version_fingerprints(ckpt, tp):
    """Each rank's fingerprint as the daemon must report it for this checkpoint: what an engine
    sends, computed from the files, not asked of the daemon."""
    from weightd_client import expected_fingerprint

    return [expected_fingerprint(ckpt, tp, r).fingerprint for r in range(tp)]


def attach_ranks(clients, fingerprints):
    """Rank r of one version on clients[r] (CUDA device r of this process): every rank or none.
    Returns (attachments, None), or ([], the Mismatch) when a socket serves no such version."""
    from weightd_client import Mismatch

    held = []
    try:
        for r, (client, fp) in enumerate(zip(clients, fingerprints)):
            att = client.attach(fp, device=r)
            if isinstance(att, Mismatch):
                for h in held:
                    h.detach()
                return [], att
            held.append(att)
    except BaseException:
        for h in held:
            h.detach()
        raise
    return held, None


def compare_version(torch, held, full, tp):
    """compare_rank for every rank of one attachment of a model; ok when all are."""
    ranks = [compare_rank(torch, att, full, tp, r) for r, att in enumerate(held)]
    brief = [{k: x.get(k) for k in ("tensorsChecked", "mismatchedCount", "mismatched", "missing", "extra", "rankBytes")} for x in ranks]
    return all(x["ok"] for x in ranks), brief


def worker_models_attach(a):
    """One process attaches every model of --spec at once (as an engine with a draft model does),
    checks each rank bit-equal to its checkpoint, and that no two models share device memory."""
    torch, cuda, dev = setup_torch(0)
    specs = json.loads(a.spec)
    res = {"ok": False, "models": []}
    clients = {}
    held_by = {}
    try:
        for spec in specs:
            fps = version_fingerprints(spec["ckpt"], spec["tp"])
            conns = [clients.setdefault(c.socket_path, c) for c in rank_clients(a.socket_dir, spec["tp"])]
            held, mismatch = attach_ranks(conns, fps)
            if mismatch is not None:
                raise RuntimeError(f"model {spec['name']} (tp={spec['tp']}): the daemon serves no version with fingerprint {fps}; "
                                   f"mismatch fields {mismatch.fields}, it serves {mismatch.fingerprint}")
            held_by[spec["name"]] = held
            res["models"].append({"name": spec["name"], "tp": spec["tp"], "fingerprints": fps, "devices": [str(next(iter(h.tensors.values())).device) for h in held]})
        ok = True
        for spec, out in zip(specs, res["models"]):
            full = load_checkpoint(spec["ckpt"], dev)
            out["ok"], out["ranks"] = compare_version(torch, held_by[spec["name"]], full, spec["tp"])
            full = None
            ok = ok and out["ok"]
        # Every tensor's device bytes, by model: two models' ranges may not meet.
        spans = sorted((str(t.device), t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), name)
                       for name, held in held_by.items() for att in held for t in att.tensors.values())
        res["overlaps"] = [f"{x[3]} and {y[3]} on {x[0]}" for x, y in zip(spans, spans[1:]) if x[0] == y[0] and x[3] != y[3] and y[1] < x[2]][:10]
        res["ok"] = ok and not res["overlaps"] and len(res["models"]) == len(specs)
    finally:
        for held in held_by.values():
            for att in held:
                att.detach()
        for c in clients.values():
            c.close()
    emit(res)
    return 0 if res["ok"] else 1


def worker_span_attach(a):
    """One node's rank of a model that spans nodes: attaches rank --rank of --ckpt's version on
    this node's socket (device 0 of this process), checks it bit-equal to torch.chunk of the
    checkpoint, and detaches. With --absent, passes when that socket serves no such version."""
    from weightd_client import Mismatch, WeightdClient, expected_fingerprint, find_socket

    torch, cuda, dev = setup_torch(0)
    fp = expected_fingerprint(a.ckpt, a.tp, a.rank).fingerprint
    client = WeightdClient(find_socket(global_rank=a.rank, socket_dir=a.socket_dir), client_name=f"suite-{os.getpid()}")
    res = {"rank": a.rank, "ckpt": a.ckpt, "fingerprint": fp, "ok": False}
    try:
        att = client.attach(fp, device=0)
        if isinstance(att, Mismatch):
            res.update(served=False, ok=a.absent, servedFingerprint=att.fingerprint, fields=att.fields)
        else:
            try:
                cmp = compare_rank(torch, att, load_checkpoint(a.ckpt, dev), a.tp, a.rank)
            finally:
                att.detach()
            res.update(served=True, ok=cmp["ok"] and not a.absent, **{k: cmp.get(k) for k in ("tensorsChecked", "mismatchedCount", "mismatched", "missing", "extra")})
    finally:
        client.close()
    emit(res)
    return 0 if res["ok"] else 1


def worker_swap_hold(a):
    """An engine through a swap: watches --name, attaches every rank of --ckpt's version, checks
    it bit-equal to the checkpoint, then keeps checking it (every --check-every s; 0: never, as
    for a lease that may be revoked) while it serves commands, one per stdin line, one JSON
    line each:
      report           what it holds, its checks so far and the events it heard
      await EVENT FP   waits (15 s at most) until EVENT about rank fingerprint FP was heard
      move             attaches --next-ckpt's version, checks it, then detaches the old one
      exit             detaches and exits;   crash   exits without detaching (a dead engine)"""
    import select

    torch, cuda, dev = setup_torch(0)
    clients = rank_clients(a.socket_dir, a.tp)
    # Each rank's socket tells of its own rank, and a connection that watches is not closed as
    # idle (an idle one is, and this one holds its lease the whole time).
    watching = [c.watch(a.name) for c in clients][0]
    fps = version_fingerprints(a.ckpt, a.tp)
    held, mismatch = attach_ranks(clients, fps)
    if mismatch is not None:
        emit({"step": "attached", "ok": False, "error": f"no version with fingerprint {fps}: mismatch {mismatch.fields}"})
        return 1
    full = load_checkpoint(a.ckpt, dev)
    ok, ranks = compare_version(torch, held, full, a.tp)
    st = {"version": a.ckpt, "fingerprints": fps, "checks": 0, "failedChecks": [], "events": [], "revoked": False}
    emit({"step": "attached", "ok": ok, "ranks": ranks, "fingerprints": fps, "watchedVersions": [v["fingerprint"] for v in watching["versions"]],
          "nextFingerprints": version_fingerprints(a.next_ckpt, a.tp) if a.next_ckpt else None})
    next_check = time.monotonic() + a.check_every

    def tick(wait):
        """Takes the events heard and, when one is due, checks the held version; waits at most ``wait`` s."""
        nonlocal next_check
        for r, c in enumerate(clients):
            for e in c.events(0):
                st["events"].append({"rank": r, **{k: e.get(k) for k in ("event", "model", "fingerprint", "newer", "leaseHash")}})
                # A revoked lease's memory is being freed: its mapping must not be read again.
                st["revoked"] = st["revoked"] or e.get("event") == "lease_revoked"
        checking = a.check_every > 0 and not st["revoked"]
        if checking and time.monotonic() >= next_check:
            good, detail = compare_version(torch, held, full, a.tp)
            st["checks"] += 1
            if not good:
                st["failedChecks"].append({"version": st["version"], "at": st["checks"], "ranks": detail})
            next_check = time.monotonic() + a.check_every
        limit = min(wait, max(0.0, next_check - time.monotonic())) if checking else wait
        return select.select([sys.stdin], [], [], limit)[0]

    def report(step, **more):
        emit({"step": step, "ok": not st["failedChecks"], **{k: v for k, v in st.items() if k != "failedChecks"},
              "failedChecks": st["failedChecks"][:5], **more})

    while True:
        if not tick(0.5):
            continue
        line = sys.stdin.readline()
        cmd = line.split()
        if not cmd or cmd[0] == "exit":
            break
        if cmd[0] == "crash":
            os._exit(0)
        if cmd[0] == "report":
            report("report")
        elif cmd[0] == "await":
            deadline = time.monotonic() + 15
            heard = lambda: any(e["event"] == cmd[1] and e["fingerprint"] == cmd[2] for e in st["events"])
            while not heard() and time.monotonic() < deadline:
                tick(0.05)
            report(line.strip(), heard=heard())
        elif cmd[0] == "move":
            next_fps = version_fingerprints(a.next_ckpt, a.tp)
            new, mismatch = attach_ranks(clients, next_fps)
            if mismatch is not None:
                report("move", ok=False, error=f"no version with fingerprint {next_fps}: mismatch {mismatch.fields}")
                continue
            next_full = load_checkpoint(a.next_ckpt, dev)
            good, ranks = compare_version(torch, new, next_full, a.tp)
            for att in held:
                att.detach()
            held, full = new, next_full
            st.update(version=a.next_ckpt, fingerprints=next_fps)
            report("move", attachedOk=good, ranks=ranks)
        else:
            report(line.strip(), ok=False, error=f"unknown command {cmd[0]!r}")
    for att in held:
        att.detach()
    report("exit")
    return 0


def worker_swap_churn(a):
    """A client that keeps attaching through a swap, as new engines do: it asks for --ckpt's
    version, and when that drains or is gone moves to the one the daemon names (details.newer, or
    the mismatch reply's list); each attachment is checked against both checkpoints, so one that
    is neither version (a mix) shows. Prints a "warm" line after two attaches, and its report
    once it attached --next-ckpt's version --attaches times (or after --max-seconds)."""
    from weightd_client import ServeError

    torch, cuda, dev = setup_torch(0)
    clients = rank_clients(a.socket_dir, a.tp)
    versions = [{"ckpt": c, "fingerprints": version_fingerprints(c, a.tp), "full": load_checkpoint(c, dev)} for c in (a.ckpt, a.next_ckpt)]
    res = {"attaches": [0, 0], "mixes": [], "refusals": [], "mismatches": 0, "warm": False}
    current, deadline = 0, time.monotonic() + a.max_seconds
    while res["attaches"][1] < a.attaches and time.monotonic() < deadline:
        try:
            held, mismatch = attach_ranks(clients, versions[current]["fingerprints"])
        except ServeError as err:
            newer = (err.details or {}).get("newer")
            if current != 0 or newer not in versions[1]["fingerprints"]:
                raise
            res["refusals"].append({"code": err.code, "newer": newer})
            current = 1
            continue
        if mismatch is not None:
            # The old version is gone from the socket: the reply lists what it serves now.
            res["mismatches"] += 1
            if current != 0:
                raise RuntimeError(f"the new version {versions[1]['fingerprints']} is not served: mismatch {mismatch.fields}")
            current = 1
            continue
        good, ranks = compare_version(torch, held, versions[current]["full"], a.tp)
        if not good:
            other, _ = compare_version(torch, held, versions[1 - current]["full"], a.tp)
            res["mixes"].append({"asked": current, "isTheOther": other, "ranks": ranks})
        res["attaches"][current] += 1
        for att in held:
            att.detach()
        if not res["warm"] and sum(res["attaches"]) >= 2:
            res["warm"] = True
            emit({"step": "warm"})
    res["ok"] = not res["mixes"] and res["attaches"][1] >= a.attaches
    emit(res)
    return 0 if res["ok"] else 1


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

    def weightd(self):
        """The weightd command: WEIGHTD_BIN (e.g. bin/weightd of an unpacked `npm run bundle`) or dist/."""
        return [os.environ["WEIGHTD_BIN"]] if os.environ.get("WEIGHTD_BIN") else ["node", os.path.join(ROOT, "dist", "main.js")]

    def start_daemon(self, name, socket_dir, tp, visible, host_devices, extra=(), models=None):
        """models: the daemon's model flags (default: --model <the checkpoint> -tp <tp>)."""
        os.makedirs(socket_dir, mode=0o700, exist_ok=True)
        log_path = os.path.join(self.work, f"{name}.log")
        models = models or ["--model", self.ckpt, "-tp", str(tp)]
        cmd = [*self.weightd(), *models, "--device", self.a.device, "--weight-cache-socket-dir", socket_dir, *extra]
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

    def gpu_used_mib(self, gpus="0"):
        """Memory in use on these GPUs (nvidia-smi -i, summed), every process's; None off cuda."""
        if self.a.device != "cuda":
            return None
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", gpus], capture_output=True, text=True, timeout=20).stdout
        return sum(int(x) for x in out.split())

    def process_gpu_mib(self, pid):
        """What nvidia-smi charges to one process over every GPU; None off cuda or when it does not
        list the pid (a container's pid namespace)."""
        if self.a.device != "cuda":
            return None
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20).stdout
        mine = [int(used) for p, used in (l.split(",") for l in out.strip().splitlines() if "," in l) if p.strip() == str(pid) and used.strip().isdigit()]
        return sum(mine) if mine else None

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

    def spawn_worker(self, args, visible="0"):
        cmd = [sys.executable, os.path.abspath(__file__)] + args
        return subprocess.Popen(cmd, env=self.env(visible), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def record_step(self, steps, scenario, name, ok, **info):
        steps.append({"step": name, "ok": bool(ok), **info})
        self.say(f"{scenario}: {name}: {'ok' if ok else 'FAILED'} {json.dumps(info, default=str)[:300]}")

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
            self.record_step(steps, "restart", name, ok, **info)

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

    # -- models (issue 17): several models on one daemon, a forced unload, a swap under clients --
    def gpus(self):
        """GPUs the scenarios may use: --gpus, else every visible one (the host backend simulates 8)."""
        if self.a.gpus is not None:
            return self.a.gpus
        return visible_gpu_count() if self.a.device == "cuda" else 8

    def ctl(self, sock, args, timeout=120):
        """weightd ctl against the daemon of this socket dir: exit code, output tails, the JSON
        it printed (None for text) and seconds."""
        cmd = [*self.weightd(), "ctl", "--weight-cache-socket-dir", sock, *args]
        t0 = time.monotonic()
        p = subprocess.run(cmd, env=self.env(), capture_output=True, text=True, timeout=self.budget.limit(timeout), cwd=ROOT)
        self.append_log(f"ctl {' '.join(args)} -> rc {p.returncode}", p.stdout + p.stderr)
        try:
            reply = json.loads(p.stdout)
        except ValueError:
            reply = None
        return {"rc": p.returncode, "out": p.stdout.strip()[-300:], "err": p.stderr.strip()[-1000:], "reply": reply, "seconds": round(time.monotonic() - t0, 2)}

    def ctl_versions(self, sock):
        """Every model version `ctl list` shows: name, checkpoint dir (real path), state, bytes, leases."""
        r = self.ctl(sock, ["list", "--json"], 30)
        if r["rc"] != 0 or not r["reply"]:
            raise RuntimeError(f"weightd ctl list exited {r['rc']}: {r['err']}")
        return [{"name": m["name"], "dir": os.path.realpath(m["model"]), "state": m["state"], "bytes": m["bytes"], "leases": m["leases"]}
                for m in r["reply"]["models"]]

    def wait_version_state(self, sock, ckpt, states, timeout):
        """Polls ctl list until the version of checkpoint dir ``ckpt`` is in one of ``states``
        (a version no longer listed counts as released); returns its last entry."""
        deadline = time.monotonic() + self.budget.limit(timeout)
        while True:
            found = [v for v in self.ctl_versions(sock) if v["dir"] == os.path.realpath(ckpt)]
            v = found[-1] if found else {"state": "released", "bytes": 0, "leases": 0, "listed": False}
            if v["state"] in states or time.monotonic() > deadline:
                return v
            time.sleep(0.2)

    def s_models(self, res):
        """Two models served by one daemon (tp=2 beside tp=1 on two GPUs, else two tp=1 on one),
        both attached by one client process; a forced unload under a lease; and a swap of one
        model to a new version while client processes hold the old one (issue 17)."""
        self.need_ckpt()
        steps = res["steps"] = []

        def step(name, ok, **info):
            self.record_step(steps, "models", name, ok, **info)

        two = self.gpus() >= 2
        tp = 2 if two else 1
        visible = "0,1" if two else "0"
        res["variant"] = "main tp=2 on GPUs 0,1 beside draft tp=1 on GPU 0" if two else "main tp=1 beside draft tp=1, both on GPU 0 (one GPU)"
        self.say(f"models: variant: {res['variant']}")
        base = os.path.dirname(os.path.abspath(self.a.ckpt_dir))
        draft, v2 = os.path.join(base, "models-draft"), os.path.join(base, "models-v2")
        r = self.worker("models draft checkpoint", ["make-ckpt", "--dir", draft, "--draft"] + (["--small"] if self.a.small else []), 120, visible="0")
        res["draftCheckpoint"] = {k: r.get(k) for k in ("generator", "bytes", "tensors", "files", "seconds", "exitCode", "stderrTail")}
        if not (r.get("ok") and r.get("exitCode") == 0):
            raise RuntimeError(f"the draft checkpoint was not written: {r.get('stderrTail', '')[-800:]}")
        t0 = time.monotonic()
        write_variant(self.ckpt, v2)
        step("main v2 written: the checkpoint with every data byte inverted", True, seconds=round(time.monotonic() - t0, 2), dir=v2)

        sock = os.path.join(self.work, "m")
        models_file = os.path.join(self.work, "models.json")
        with open(models_file, "w") as f:
            json.dump({"models": [{"name": "main", "dir": self.ckpt, "tensorParallelSize": tp}, {"name": "draft", "dir": draft, "tensorParallelSize": 1}]}, f)
        # GPU memory is read only where the daemon is the one process with a CUDA context, so the
        # clients' contexts (hundreds of MiB each) never enter a comparison.
        mem = res["gpuMiB"] = {"atStart": self.gpu_used_mib(visible)}
        d = self.start_daemon("models", sock, tp, visible, "host-gpu-0,host-gpu-1", models=["--models", models_file])
        pid = d["proc"].pid
        ready = self.wait_for([d], READY_RE, 120, "READY")["models"]

        def gpu(label):
            mem[label] = {"total": self.gpu_used_mib(visible), "daemon": self.process_gpu_mib(pid)}
            return mem[label]["total"]

        def serving(vs):
            return {v["name"]: v for v in vs if v["state"] == "serving"}

        workers = []
        try:
            vs = self.ctl_versions(sock)
            both = serving(vs)
            step("one daemon serves main and draft together", set(both) == {"main", "draft"}, readySeconds=ready, versions=vs)
            gpu("twoModels")
            spec = [{"name": "main", "ckpt": self.ckpt, "tp": tp}, {"name": "draft", "ckpt": draft, "tp": 1}]
            v = self.worker("models attach both", ["models-attach", "--socket-dir", sock, "--spec", json.dumps(spec)], 180, visible=visible)
            res["attachBoth"] = v
            step("one client process holds both models at once: every tensor bit-equal to its checkpoint, no shared memory",
                 v.get("ok") and v.get("exitCode") == 0, models=[{k: m.get(k) for k in ("name", "tp", "ok", "devices", "ranks")} for m in v.get("models", [])],
                 overlaps=v.get("overlaps"), error=v.get("stderrTail", "")[-300:] or None)

            # ctl unload --force under a lease: the holder is told, the memory goes at once.
            h = self.spawn_worker(["swap-hold", "--socket-dir", sock, "--ckpt", draft, "--tp", "1", "--name", "draft", "--check-every", "0"], visible)
            workers.append(h)
            held = self.talk(h, None, 120)
            step("a client holds draft (bit-equal)", held.get("ok"), ranks=held.get("ranks"))
            u = self.ctl(sock, ["unload", "--force", "--json", "draft"])
            unloaded = (u["reply"] or {}).get("unloaded") or []
            step("ctl unload --force draft answers, naming its live lease", u["rc"] == 0 and [x.get("leases") for x in unloaded] == [1],
                 seconds=u["seconds"], unloaded=unloaded, err=u["err"] or None)
            e = self.talk(h, f"await lease_revoked {held['fingerprints'][0]}", 30)
            step("the holder hears lease_revoked for its lease", e.get("heard"), events=e.get("events"))
            self.talk(h, "exit", 30)
            h.wait(timeout=30)
            gone = self.wait_version_state(sock, draft, ("released",), 30)
            single = gpu("oneModel")
            draft_mib = both["draft"]["bytes"] / 2**20
            fell = None if single is None else mem["twoModels"]["total"] - single
            # What a forced unload frees is draft's segments, less the driver's rounding of each.
            step("draft is freed (gone from ctl list); GPU memory fell by its size", gone["state"] == "released" and gone["bytes"] == 0
                 and (fell is None or abs(fell - draft_mib) <= MEM_TOLERANCE_MIB), draft=gone, fellMiB=fell, draftMiB=round(draft_mib, 1))

            # The swap: N engines hold v1 and keep checking it; one more keeps attaching anew.
            n = self.a.swap_clients
            args = ["swap-hold", "--socket-dir", sock, "--ckpt", self.ckpt, "--next-ckpt", v2, "--tp", str(tp), "--name", "main"]
            holders = [self.spawn_worker(args, visible) for _ in range(n)]
            workers.extend(holders)
            attached = [self.talk(h, None, 180) for h in holders]
            v1fp, v2fp = attached[0]["fingerprints"], attached[0]["nextFingerprints"]
            step(f"{n} client processes hold main v1, bit-equal, watching main", all(x.get("ok") for x in attached) and all(x["watchedVersions"] == v1fp[:1] for x in attached),
                 fingerprints=v1fp)
            churn = self.spawn_worker(["swap-churn", "--socket-dir", sock, "--ckpt", self.ckpt, "--next-ckpt", v2, "--tp", str(tp), "--max-seconds", "120"], visible)
            workers.append(churn)
            self.talk(churn, None, 180)
            before = [self.talk(h, "report", 30)["checks"] for h in holders]
            load = self.ctl(sock, ["load", "--model", v2, "--name", "main", "-tp", str(tp)], 180)
            step("ctl load of v2 under the name main answers once v2 serves", load["rc"] == 0, seconds=load["seconds"], out=load["out"], err=load["err"] or None)
            vs = self.ctl_versions(sock)
            mains = {v["dir"]: v for v in vs if v["name"] == "main"}
            old, new = mains.get(os.path.realpath(self.ckpt), {}), mains.get(os.path.realpath(v2), {})
            step("v1 drains under its leases while v2 serves", old.get("state") == "draining" and old.get("leases", 0) >= n and new.get("state") == "serving",
                 v1=old, v2=new)
            gpu("twoVersionsWithClients")  # reported only: the clients' contexts are in it
            heard = [self.talk(h, f"await model_dropping {v1fp[0]}", 30) for h in holders]
            # Per rank's socket: that rank's fingerprints (the await above was rank 0's; give the
            # others the same time to be heard).
            heard = [self.talk(h, f"await model_dropping {v1fp[-1]}", 30) for h in holders]
            order = [[[(e["event"], e["fingerprint"], e.get("newer")) for e in x["events"] if e["model"] == "main" and e["rank"] == r] for r in range(tp)] for x in heard]
            want = [[("model_ready", v2fp[r], None), ("model_dropping", v1fp[r], v2fp[r])] for r in range(tp)]
            step("every holder heard model_ready for v2, then model_dropping for v1 naming v2, on each rank's socket", all(o == want for o in order), events=order[0])
            during = [x["checks"] - b for x, b in zip(heard, before)]
            step("every held v1 attachment stayed bit-equal to v1 through the load", all(x["ok"] and x["version"] == self.ckpt for x in heard) and min(during) > 0,
                 checksDuringLoad=during, failed=[x["failedChecks"] for x in heard if x["failedChecks"]][:2])
            out, err = churn.communicate(timeout=self.budget.limit(120))
            c = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"ok": False, "stderr": err[-1500:]}
            res["churn"] = c
            step("a client attaching anew all along: never a mix; v1 until it drained, then told E_DRAINING naming v2, then v2",
                 c.get("ok") and c.get("refusals") and all(x["code"] == "E_DRAINING" for x in c["refusals"]) and churn.returncode == 0,
                 attaches=c.get("attaches"), refusals=c.get("refusals", [])[:3], mixes=c.get("mixes", [])[:2], stderr=None if c.get("ok") else err[-500:])
            v = self.worker("models attach v2", ["models-attach", "--socket-dir", sock, "--spec", json.dumps([{"name": "main", "ckpt": v2, "tp": tp}])], 180, visible=visible)
            step("a new client process attaches main v2: every tensor bit-equal to v2", v.get("ok") and v.get("exitCode") == 0,
                 ranks=(v.get("models") or [{}])[0].get("ranks"), error=v.get("stderrTail", "")[-300:] or None)

            # The old version goes with its last lease: half the holders die holding it, half move.
            movers, crashers = holders[: n // 2], holders[n // 2:]
            early = [h.poll() for h in holders if h.poll() is not None]
            step("every holder was alive to the end of the swap", not early, exitCodes=early)
            for h in crashers:
                if h.poll() is None:
                    h.stdin.write("crash\n")
                    h.stdin.flush()
                h.wait(timeout=30)
            kept = []
            for i, h in enumerate(movers):
                if i == len(movers) - 1:
                    # Any earlier state would be a version freed under a lease still held.
                    kept.append(self.wait_version_state(sock, self.ckpt, ("draining",), 1)["state"])
                mv = self.talk(h, "move", 120)
                step(f"holder {i} moved to v2 (bit-equal) and detached v1", mv.get("ok") and mv.get("attachedOk") and mv["version"] == v2, ranks=mv.get("ranks"))
            step("v1 stayed resident while any holder held it", kept == ["draining"], states=kept)
            freed = self.wait_version_state(sock, self.ckpt, ("released",), 30)
            step("v1 is freed once its last lease ended (the dead holders' leases expired)", freed["state"] == "released" and freed["bytes"] == 0, v1=freed)
            ends = [self.talk(h, "report", 30) for h in movers]
            step("the moved holders' v2 attachments stayed bit-equal", all(x["ok"] for x in ends), checks=[x["checks"] for x in ends])
            for h in movers:
                self.talk(h, "exit", 30)
                h.wait(timeout=30)
            vs = self.ctl_versions(sock)
            now = serving(vs)
            after = gpu("afterSwap")
            step("ctl list: only main v2 serves, with main v1's bytes", list(now) == ["main"] and now["main"]["dir"] == os.path.realpath(v2)
                 and now["main"]["bytes"] == both["main"]["bytes"] and now["main"]["leases"] == 0, serving=now, v1Bytes=both["main"]["bytes"])
            if single is not None:
                # Same segments as v1, so the same rounding: what is left beyond is driver
                # bookkeeping of the freed version (a few MiB), not a tensor's worth.
                step("GPU memory is back to the one-model figure", abs(after - single) <= MEM_TOLERANCE_MIB, MiB=after, oneModelMiB=single,
                     daemonMiB=mem["afterSwap"]["daemon"], oneModelDaemonMiB=mem["oneModel"]["daemon"], toleranceMiB=MEM_TOLERANCE_MIB)
            codes = self.stop_daemons([d], "models")
            end = self.gpu_used_mib(visible)
            step("SIGTERM: the daemon exits 0" + (", GPU memory back to its start" if end is not None else ""),
                 codes["models"] == 0 and (end is None or end <= mem["atStart"] + MEM_TOLERANCE_MIB), exitCode=codes["models"], MiB=end, atStartMiB=mem["atStart"])
        finally:
            for p in workers:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                self.append_log(f"models: worker {' '.join(p.args[2:])[:300]} -> rc {p.returncode}", "" if p.stderr.closed else p.stderr.read())
        res["status"] = "pass" if steps and all(x["ok"] for x in steps) else "fail"

    # -- models-span (issue 17): a model across two nodes, swapped all or nothing --
    def s_models_span(self, res):
        """Two daemons (--nnodes 2 over 127.0.0.1, one GPU each) serve "main" at tp=2 across
        them. A swap to v2 that node 1 cannot load (its
        copy of v2 is cut short) fails on both nodes: v2 is attachable on neither, both ranks of
        v1 serve on bit-equal, GPU memory is back to one version. Then a swap that both nodes
        load serves v2 on both and frees v1; SIGTERM, both exit 0, GPU memory back to its start."""
        self.need_ckpt()
        steps = res["steps"] = []

        def step(name, ok, **info):
            self.record_step(steps, "models-span", name, ok, **info)

        base = os.path.dirname(os.path.abspath(self.a.ckpt_dir))
        v2, broken = os.path.join(base, "span-v2"), os.path.join(base, "span-v2-cut")
        write_variant(self.ckpt, v2)
        write_variant(self.ckpt, broken)
        shard = ckpt_files(broken)[-1]
        os.truncate(shard, os.path.getsize(shard) - 64)
        step("v2 written (every data byte inverted), and node 1's copy of it cut 64 bytes short", True, v2=v2, cut=shard)

        port = str(self.a.master_port + 1)
        models_file = os.path.join(self.work, "span-models.json")
        with open(models_file, "w") as f:
            json.dump({"models": [{"name": "main", "dir": self.ckpt, "tensorParallelSize": 2}]}, f)
        gpus = "0,1"
        mem = res["gpuMiB"] = {"atStart": self.gpu_used_mib(gpus)}
        nodes = []
        for n in (0, 1):
            sock = os.path.join(self.work, f"span{n}")
            extra = ["--nnodes", "2", "--node-rank", str(n), "--master-addr", "127.0.0.1", "--weight-cache-master-port", port, "--rendezvous-timeout", "90"]
            nodes.append((sock, self.start_daemon(f"span{n}", sock, 2, str(n), f"host-span-{n}", extra, models=["--models", models_file])))
        daemons = [d for _, d in nodes]
        res["readySeconds"] = self.wait_for(daemons, READY_RE, 150, "READY")
        self.wait_for(daemons, re.compile(re.escape(GROUP_READY)), 30, "group ready")

        def attach_each(ckpt, absent=False):
            jobs = [(f"models-span attach node {n}", ["span-attach", "--socket-dir", sock, "--ckpt", ckpt, "--rank", str(n), "--tp", "2"] + (["--absent"] if absent else []), str(n))
                    for n, (sock, _) in enumerate(nodes)]
            return self.workers_parallel(jobs, 150)

        def brief(rs):
            return [{k: r.get(k) for k in ("rank", "served", "ok", "tensorsChecked", "mismatchedCount", "stderrTail")} for r in rs]

        def listed(sock):
            return [(v["name"], v["dir"], v["state"]) for v in self.ctl_versions(sock)]

        def load_both(dirs):
            """ctl load on both nodes at once, as an operator's rollout does; each node's result."""
            procs = [subprocess.Popen([*self.weightd(), "ctl", "--weight-cache-socket-dir", sock, "load", "--model", d, "--name", "main", "-tp", "2"],
                                      env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
                     for (sock, _), d in zip(nodes, dirs)]
            out = []
            for p in procs:
                o, e = p.communicate(timeout=self.budget.limit(180))
                self.append_log(f"models-span: {' '.join(p.args[1:])} -> rc {p.returncode}", o + e)
                out.append({"rc": p.returncode, "out": o.strip()[-300:], "err": e.strip()[-600:]})
            return out

        v1 = os.path.realpath(self.ckpt)
        r = attach_each(self.ckpt)
        step("main v1 serves across both nodes: each node's rank bit-equal to torch.chunk", all(x.get("ok") for x in r), ranks=brief(r))
        one = self.gpu_used_mib(gpus)
        mem["oneVersion"] = one

        # The swap that fails on node 1: both nodes must end where they began.
        f = load_both([v2, broken])
        step("node 1 cannot load its copy of v2: ctl load fails on node 1 with its own error", f[1]["rc"] != 0 and "E_" in f[1]["err"], node1=f[1])
        step("... and on node 0, naming node 1 (E_MODEL_GROUP_PEER_FAILED)", f[0]["rc"] != 0 and "E_MODEL_GROUP_PEER_FAILED" in f[0]["err"] and "node 1" in f[0]["err"], node0=f[0])
        states = [listed(sock) for sock, _ in nodes]
        step("both nodes list main v1 alone, serving", all([x for x in st if x[2] != "released"] == [("main", v1, "serving")] for st in states), lists=states)
        r = attach_each(v2, absent=True)
        step("v2 is attachable on neither node", all(x.get("ok") and x.get("served") is False for x in r), ranks=brief(r))
        r = attach_each(self.ckpt)
        step("v1 serves on, bit-equal on both nodes", all(x.get("ok") for x in r), ranks=brief(r))
        after_fail = mem["afterFailedSwap"] = self.gpu_used_mib(gpus)
        if one is not None:
            step("GPU memory is back to one version's", abs(after_fail - one) <= MEM_TOLERANCE_MIB, MiB=after_fail, oneVersionMiB=one)

        # The swap that both nodes load.
        ok = load_both([v2, v2])
        step("a swap that both nodes load: ctl load answers 0 on both", all(x["rc"] == 0 for x in ok), results=ok)
        r = attach_each(v2)
        step("v2 serves on both nodes, bit-equal", all(x.get("ok") for x in r), ranks=brief(r))
        freed = [self.wait_version_state(sock, self.ckpt, ("released",), 30) for sock, _ in nodes]
        step("v1 (no leases) is freed on both nodes", all(v["state"] == "released" and v["bytes"] == 0 for v in freed), v1=freed)
        after_swap = mem["afterSwap"] = self.gpu_used_mib(gpus)
        if one is not None:
            step("GPU memory is back to one version's", abs(after_swap - one) <= MEM_TOLERANCE_MIB, MiB=after_swap, oneVersionMiB=one)
        codes = self.stop_daemons(daemons, "models-span")
        end = self.gpu_used_mib(gpus)
        step("SIGTERM: both daemons exit 0" + (", GPU memory back to its start" if end is not None else ""),
             all(c == 0 for c in codes.values()) and (end is None or end <= mem["atStart"] + MEM_TOLERANCE_MIB), exitCodes=codes, MiB=end, atStartMiB=mem["atStart"])
        res["status"] = "pass" if steps and all(x["ok"] for x in steps) else "fail"

    def run(self):
        # (name, body, seconds of budget it needs, GPUs it needs): a machine with fewer GPUs
        # reports the scenario as skipped, with why, instead of as a failure of weightd.
        plan = [("checkpoint", self.s_checkpoint, 30, 1), ("tp1", self.s_tp1, 45, 1), ("tp2", self.s_tp2, 30, 2), ("two-node", self.s_two_node, 30, 2),
                ("restart", self.s_restart, 60, 1), ("models", self.s_models, 45, 1),
                ("models-span", self.s_models_span, 45, 2)]
        wanted = self.a.scenarios.split(",")
        gpus = self.gpus()
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
            if name == "models":
                row["variant"] = r.get("variant")
            if name in ("restart", "models", "models-span"):
                row["steps"] = [{k: v for k, v in x.items() if k in ("step", "ok", "readySeconds", "rchar", "readBytes", "firstAttachMs", "attachMsMedian", "exitCode", "seconds", "MiB")}
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
    r.add_argument("--scenarios", default="checkpoint,tp1,tp2,two-node,restart,models,models-span")
    r.add_argument("--gpus", type=int, help="use this many GPUs, not every visible one (the host backend simulates 8): "
                                            "e.g. --gpus 1 for a host dry run of what a one-GPU machine runs")
    r.add_argument("--swap-clients", type=int, default=4, help="models: client processes that hold the old version through the swap")
    r.add_argument("--budget", type=float, default=float(os.environ.get("WEIGHTD_SUITE_BUDGET_S", "420")))
    r.add_argument("--master-port", type=int, default=29611)
    m = sub.add_parser("make-ckpt")
    m.add_argument("--dir", required=True)
    m.add_argument("--small", action="store_true")
    m.add_argument("--draft", action="store_true", help="the models scenario's second model (DRAFT_SHAPE)")
    m.add_argument("--max-shard-size", default="500MB")
    h = sub.add_parser("hold")
    h.add_argument("--socket-dir", required=True)
    h.add_argument("--device-index", type=int, default=0)
    h.add_argument("--rank", type=int, default=0)
    f = sub.add_parser("fill")
    f.add_argument("--device-index", type=int, default=0)
    f.add_argument("--leave-bytes", type=int, required=True)
    sa = sub.add_parser("span-attach")
    sa.add_argument("--socket-dir", required=True)
    sa.add_argument("--ckpt", required=True)
    sa.add_argument("--rank", type=int, required=True)
    sa.add_argument("--tp", type=int, required=True)
    sa.add_argument("--absent", action="store_true", help="pass when the socket serves no such version")
    ma = sub.add_parser("models-attach")
    ma.add_argument("--socket-dir", required=True)
    ma.add_argument("--spec", required=True, help='JSON: [{"name", "ckpt", "tp"}], every model to attach at once')
    for name in ("swap-hold", "swap-churn"):
        w = sub.add_parser(name)
        w.add_argument("--socket-dir", required=True)
        w.add_argument("--ckpt", required=True, help="the version to attach first")
        w.add_argument("--next-ckpt", help="the version that replaces it")
        w.add_argument("--tp", type=int, default=1)
        w.add_argument("--name", default="main", help="the model name to watch")
        w.add_argument("--check-every", type=float, default=0.25, help="seconds between checks of the held version (0: none)")
        w.add_argument("--attaches", type=int, default=3, help="swap-churn: attaches of the next version before it stops")
        w.add_argument("--max-seconds", type=float, default=120)
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
    if a.cmd == "models-attach":
        return worker_models_attach(a)
    if a.cmd == "span-attach":
        return worker_span_attach(a)
    if a.cmd == "swap-hold":
        return worker_swap_hold(a)
    if a.cmd == "swap-churn":
        return worker_swap_churn(a)

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
