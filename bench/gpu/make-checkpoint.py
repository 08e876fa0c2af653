#!/usr/bin/env python3
"""Writes a Llama-shaped checkpoint of random bf16 weights as sharded safetensors files.

  python3 bench/gpu/make-checkpoint.py --out DIR [--gib 8] [--shards 4] [--hidden 4096] ...

Values come from torch.randn on the GPU when torch and CUDA are there (seconds for 8 GB), else
from numpy (slower; fine for the small checkpoints of local runs). The files are written in the
safetensors layout directly (8-byte header length, JSON header, data), so no safetensors package
is needed, and safetensors' own loader reads them (the bench uses it as its baseline).
With --sparse each tensor is a hole but for 8 KiB of random bytes at its start (planning
benchmarks on a small disk: bench/results/2026-12-06-host-plan-addon-sample).
Writes model.safetensors.index.json and a Llama config.json beside the shards.
Prints one JSON line: files, tensors, bytes, seconds.
"""
import argparse
import json
import os
import struct
import time

import numpy as np


def layer_shapes(i, hidden, inter, kv):
    p = f"model.layers.{i}."
    return [
        (p + "input_layernorm.weight", [hidden]),
        (p + "self_attn.q_proj.weight", [hidden, hidden]),
        (p + "self_attn.k_proj.weight", [kv, hidden]),
        (p + "self_attn.v_proj.weight", [kv, hidden]),
        (p + "self_attn.o_proj.weight", [hidden, hidden]),
        (p + "post_attention_layernorm.weight", [hidden]),
        (p + "mlp.gate_proj.weight", [inter, hidden]),
        (p + "mlp.up_proj.weight", [inter, hidden]),
        (p + "mlp.down_proj.weight", [hidden, inter]),
    ]


def random_bf16_bytes(shape, gen):
    n = int(np.prod(shape))
    if gen is not None:
        import torch

        t = torch.randn(n, dtype=torch.bfloat16, device="cuda", generator=gen)
        return t.view(torch.int16).cpu().numpy().tobytes()
    # bf16 is the top half of a float32.
    f = np.random.default_rng(n).standard_normal(n, dtype=np.float32)
    return (f.view(np.uint32) >> 16).astype(np.uint16).tobytes()


def write_safetensors(path, tensors, gen, sparse=False):
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors:
        nbytes = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes with spaces
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        if sparse:
            # Each tensor a hole but for up to 8 KiB of random bytes at its start.
            base = f.tell()
            for name, _ in tensors:
                begin, end = header[name]["data_offsets"]
                f.seek(base + begin)
                f.write(os.urandom(min(8192, end - begin)))
            f.truncate(base + offset)
        else:
            for name, shape in tensors:
                f.write(random_bf16_bytes(shape, gen))
    return offset


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--gib", type=float, default=8)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--inter", type=int, default=14336)
    ap.add_argument("--kv", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--sparse", action="store_true",
                    help="files of holes but for 8 KiB at each tensor's start: for planning, which reads headers and the content sample, not the weights")
    a = ap.parse_args()

    gen = None
    try:
        import torch

        if torch.cuda.is_available():
            gen = torch.Generator(device="cuda").manual_seed(1234)
    except ImportError:
        pass

    per_layer = sum(int(np.prod(s)) * 2 for _, s in layer_shapes(0, a.hidden, a.inter, a.kv))
    embed = ("model.embed_tokens.weight", [a.vocab, a.hidden])
    layers = max(a.shards, round((a.gib * 2**30 - a.vocab * a.hidden * 2) / per_layer))
    names = [embed] + [t for i in range(layers) for t in layer_shapes(i, a.hidden, a.inter, a.kv)]
    names.append(("model.norm.weight", [a.hidden]))

    os.makedirs(a.out, exist_ok=True)
    t0 = time.perf_counter()
    per_shard = -(-len(names) // a.shards)
    total = 0
    weight_map = {}
    for s in range(a.shards):
        part = names[s * per_shard:(s + 1) * per_shard]
        if part:
            file = f"model-{s + 1:05d}-of-{a.shards:05d}.safetensors"
            total += write_safetensors(os.path.join(a.out, file), part, gen, a.sparse)
            weight_map.update({name: file for name, _ in part})
    # The index and config make it a checkpoint the daemon (and transformers) can load: a Llama
    # with 128-wide heads whose lm_head is tied to the embedding (none is stored).
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": a.hidden,
                   "intermediate_size": a.inter, "num_hidden_layers": layers, "num_attention_heads": a.hidden // 128,
                   "num_key_value_heads": a.kv // 128, "head_dim": 128, "vocab_size": a.vocab, "rms_norm_eps": 1e-5,
                   "max_position_embeddings": 8192, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}, f)
    if not a.sparse:
        os.sync()
    print(json.dumps({"files": a.shards, "tensors": len(names), "bytes": total, "seconds": time.perf_counter() - t0,
                      "generator": "torch-cuda" if gen is not None else "numpy"}))


if __name__ == "__main__":
    main()
