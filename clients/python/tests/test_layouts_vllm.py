"""The daemon's `vllm` layout against an oracle of vLLM's own weight loaders.

The oracle shares no code with the planner. It builds each architecture's parameters as vLLM's
model classes create them (names from ``named_parameters()``, per-rank shapes) and fills them
by replaying vLLM's ``load_weights`` over the checkpoint: the stacked-params mapping, then the
weight loaders as vllm/model_executor/layers define them (VocabParallelEmbedding pads to 64 and
zero-fills, QKVParallelLinear replicates KV heads when there are fewer than ranks,
MergedColumnParallelLinear, RowParallelLinear, FusedMoE w13/w2, a loaded_shard_id of None
splitting a pre-fused Phi-3 tensor, block-FP8 scales through the same loaders with offsets in
blocks). Every view the daemon serves (host backend) must match in name, shape, dtype and
bytes, for each architecture at tp 1, 2 and 4 and vocab 32016 and 50257, for block-FP8 and
per-tensor FP8 Llama, Qwen3, Mixtral and Qwen3-MoE at tp 1, 2 and 4 (per-tensor scales through
PerTensorScaleParameter's and FusedMoE's loaders), and for block-FP8 Llama at head_dim 64 at tp
1 and 2; at tp 4, where a rank would cut a block, the daemon serves the checkpoint layout and
names why not the vllm one.

Needs torch and safetensors, and the built daemon (npm run build:ts). With
WEIGHTD_LAYOUTS_DEVICE=cuda (test/gpu) the daemon runs on the CUDA backend instead, at tp sizes up
to the GPU count, with the same padded vocabularies: its padding rows (uninitialised device
memory that the copy engine zeroes) must read back as the oracle's zeros.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import unittest
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

try:
    import torch
    from safetensors.torch import save_file
except ImportError:  # pragma: no cover - the module is skipped below
    torch = None

from weightd_client import WeightdClient
from weightd_client.client import find_socket

from daemon_fixture import MAIN_JS, REPO, Daemon  # noqa: E402

DEVICE = os.environ.get("WEIGHTD_LAYOUTS_DEVICE", "host")
# Both need padding: 32016 pads to 32064 and 50257 to 50304, on the host and the CUDA backend.
VOCABS = (32016, 50257)

ARCHS = [
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
    "Gemma2ForCausalLM", "Phi3ForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM",
]


@dataclass(frozen=True)
class Dims:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    layers: int
    experts: int
    # Block-FP8 (128 x 128 blocks, DeepSeek style) when set: linear weights F8_E4M3 with f32 weight_scale_inv.
    block: int = 0
    # Per-tensor FP8 when set: linear weights F8_E4M3, each with one f32 weight_scale.
    per_tensor: bool = False


# 2 KV heads: split at tp 2, replicated over pairs of ranks at tp 4.
SMALL = Dims(hidden=16, heads=4, kv_heads=2, head_dim=4, inter=32, layers=2, experts=2)
# Every partition whole 128-row blocks at tp 4 (vLLM refuses others); KV heads replicated at tp 4.
FP8 = Dims(hidden=512, heads=4, kv_heads=2, head_dim=128, inter=512, layers=1, experts=2, block=128)
# head_dim 64: 4 KV heads of 64 rows make k_proj two 128-row blocks, one a rank at tp 2; at tp 4 a
# rank would hold half a block, which vLLM refuses, and so the daemon refuses the vllm layout there.
FP8_HD64 = Dims(hidden=512, heads=8, kv_heads=4, head_dim=64, inter=512, layers=1, experts=2, block=128)
FP8_TENSOR = Dims(hidden=64, heads=4, kv_heads=2, head_dim=16, inter=64, layers=2, experts=2, per_tensor=True)


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def random_checkpoint(directory: Path, arch: str, vocab: int, seed: int, d: Dims) -> Dict[str, "torch.Tensor"]:
    """A Hugging Face style checkpoint of `arch`: random bf16 values (norms f32 for Gemma2), or
    with `d.block`, F8_E4M3 linear weights each with its f32 `weight_scale_inv` blocks."""
    g = torch.Generator().manual_seed(seed)
    out: Dict[str, torch.Tensor] = {}

    def t(name: str, *shape: int, dtype: "torch.dtype" = torch.bfloat16) -> None:
        out[name] = torch.randn(*shape, generator=g).to(dtype)

    def lin(name: str, rows: int, cols: int) -> None:
        if d.per_tensor:
            t(name, rows, cols, dtype=torch.float8_e4m3fn)
            out[name.replace(".weight", ".weight_scale")] = torch.rand((), generator=g) + 0.01
            return
        if not d.block:
            return t(name, rows, cols)
        t(name, rows, cols, dtype=torch.float8_e4m3fn)
        t(name.replace(".weight", ".weight_scale_inv"), ceil_div(rows, d.block), ceil_div(cols, d.block), dtype=torch.float32)

    q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
    norm = torch.float32 if arch == "Gemma2ForCausalLM" else torch.bfloat16
    tied = arch == "Gemma2ForCausalLM"
    t("model.embed_tokens.weight", vocab, d.hidden)
    t("model.norm.weight", d.hidden, dtype=norm)
    if not tied:
        t("lm_head.weight", vocab, d.hidden)
    for layer in range(d.layers):
        p = f"model.layers.{layer}"
        t(f"{p}.input_layernorm.weight", d.hidden, dtype=norm)
        t(f"{p}.post_attention_layernorm.weight", d.hidden, dtype=norm)
        lin(f"{p}.self_attn.o_proj.weight", d.hidden, q)
        if arch == "Phi3ForCausalLM":
            lin(f"{p}.self_attn.qkv_proj.weight", q + 2 * kv, d.hidden)
            lin(f"{p}.mlp.gate_up_proj.weight", 2 * d.inter, d.hidden)
            lin(f"{p}.mlp.down_proj.weight", d.hidden, d.inter)
            continue
        lin(f"{p}.self_attn.q_proj.weight", q, d.hidden)
        lin(f"{p}.self_attn.k_proj.weight", kv, d.hidden)
        lin(f"{p}.self_attn.v_proj.weight", kv, d.hidden)
        if arch == "Qwen2ForCausalLM":
            t(f"{p}.self_attn.q_proj.bias", q)
            t(f"{p}.self_attn.k_proj.bias", kv)
            t(f"{p}.self_attn.v_proj.bias", kv)
        if arch.startswith("Qwen3"):
            t(f"{p}.self_attn.q_norm.weight", d.head_dim)
            t(f"{p}.self_attn.k_norm.weight", d.head_dim)
        if arch == "Gemma2ForCausalLM":
            t(f"{p}.pre_feedforward_layernorm.weight", d.hidden, dtype=norm)
            t(f"{p}.post_feedforward_layernorm.weight", d.hidden, dtype=norm)
        if arch == "MixtralForCausalLM":
            t(f"{p}.block_sparse_moe.gate.weight", d.experts, d.hidden)
            for e in range(d.experts):
                lin(f"{p}.block_sparse_moe.experts.{e}.w1.weight", d.inter, d.hidden)
                lin(f"{p}.block_sparse_moe.experts.{e}.w2.weight", d.hidden, d.inter)
                lin(f"{p}.block_sparse_moe.experts.{e}.w3.weight", d.inter, d.hidden)
        elif arch == "Qwen3MoeForCausalLM":
            t(f"{p}.mlp.gate.weight", d.experts, d.hidden)
            for e in range(d.experts):
                lin(f"{p}.mlp.experts.{e}.gate_proj.weight", d.inter, d.hidden)
                lin(f"{p}.mlp.experts.{e}.up_proj.weight", d.inter, d.hidden)
                lin(f"{p}.mlp.experts.{e}.down_proj.weight", d.hidden, d.inter)
        else:
            lin(f"{p}.mlp.gate_proj.weight", d.inter, d.hidden)
            lin(f"{p}.mlp.up_proj.weight", d.inter, d.hidden)
            lin(f"{p}.mlp.down_proj.weight", d.hidden, d.inter)
    config: Dict[str, Any] = {
        "architectures": [arch], "hidden_size": d.hidden, "num_attention_heads": d.heads, "num_key_value_heads": d.kv_heads,
        "head_dim": d.head_dim, "intermediate_size": d.inter, "moe_intermediate_size": d.inter, "num_local_experts": d.experts,
        "num_experts": d.experts, "vocab_size": vocab, "num_hidden_layers": d.layers, "tie_word_embeddings": tied,
        "torch_dtype": "bfloat16",
    }
    if d.block:
        config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [d.block, d.block], "activation_scheme": "dynamic", "fmt": "e4m3"}
    if d.per_tensor:
        config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3"}
    (directory / "config.json").write_text(json.dumps(config))
    # Two files, split mid-layer, as exports are.
    names = list(out)
    half = len(names) // 2
    save_file({n: out[n] for n in names[:half]}, str(directory / "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
    save_file({n: out[n] for n in names[half:]}, str(directory / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    weight_map = {n: ("model-00001-of-00002.safetensors" if i < half else "model-00002-of-00002.safetensors") for i, n in enumerate(names)}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


SCALE = ".weight_scale_inv"


class VllmOracle:
    """vLLM's parameters of one rank, filled the way its weight loaders fill them."""

    def __init__(self, arch: str, vocab: int, tp: int, rank: int, d: Dims, norm_dtype: "torch.dtype"):
        self.arch, self.tp, self.rank, self.d = arch, tp, rank, d
        self.params: Dict[str, torch.Tensor] = {}
        self.loaded: Dict[str, int] = {}
        # QKVParallelLinear.__init__
        self.num_heads = d.heads // tp
        if tp >= d.kv_heads:
            self.num_kv_heads, self.kv_replicas = 1, tp // d.kv_heads
        else:
            self.num_kv_heads, self.kv_replicas = d.kv_heads // tp, 1
        # VocabParallelEmbedding.__init__ with org_num_embeddings == num_embeddings (no LoRA).
        self.vocab = vocab
        padded = (vocab + 63) // 64 * 64
        self.vocab_per_rank = padded // tp
        start = min(rank * self.vocab_per_rank, vocab)
        self.vocab_range = (start, min((rank + 1) * self.vocab_per_rank, vocab))

        def param(name: str, *shape: int, dtype: "torch.dtype" = torch.bfloat16) -> None:
            # Poisoned, so a row no loader writes shows up as a mismatch.
            self.params[name] = torch.full(shape, float("nan"), dtype=dtype)

        def linear(name: str, *shape: int, pieces: int = 1) -> None:
            # Fp8LinearMethod / Fp8MoEMethod with block quant: an fp8 weight and its block scales;
            # per-tensor: an fp8 weight and one scale per piece (`pieces`: qkv 3, gate_up 2; FusedMoE
            # [E, 2] for w13 and [E] for w2, as Fp8MoEMethod.create_weights makes them).
            if d.per_tensor:
                param(name, *shape, dtype=torch.float8_e4m3fn)
                scale = (shape[0], 2) if ".w13_" in name else (shape[0],) if ".w2_" in name else (pieces,)
                param(name + "_scale", *scale, dtype=torch.float32)
                return
            if not d.block:
                return param(name, *shape)
            param(name, *shape, dtype=torch.float8_e4m3fn)
            param(name + "_scale_inv", *shape[:-2], ceil_div(shape[-2], d.block), ceil_div(shape[-1], d.block), dtype=torch.float32)

        tied = arch == "Gemma2ForCausalLM"
        param("model.embed_tokens.weight", self.vocab_per_rank, d.hidden)
        if not tied:
            param("lm_head.weight", self.vocab_per_rank, d.hidden)
        param("model.norm.weight", d.hidden, dtype=norm_dtype)
        qkv_rows = (self.num_heads + 2 * self.num_kv_heads) * d.head_dim
        for layer in range(d.layers):
            p = f"model.layers.{layer}"
            param(f"{p}.input_layernorm.weight", d.hidden, dtype=norm_dtype)
            param(f"{p}.post_attention_layernorm.weight", d.hidden, dtype=norm_dtype)
            linear(f"{p}.self_attn.qkv_proj.weight", qkv_rows, d.hidden, pieces=3)
            if arch == "Qwen2ForCausalLM":
                param(f"{p}.self_attn.qkv_proj.bias", qkv_rows)
            linear(f"{p}.self_attn.o_proj.weight", d.hidden, d.heads * d.head_dim // tp)
            if arch.startswith("Qwen3"):
                param(f"{p}.self_attn.q_norm.weight", d.head_dim)
                param(f"{p}.self_attn.k_norm.weight", d.head_dim)
            if arch == "Gemma2ForCausalLM":
                param(f"{p}.pre_feedforward_layernorm.weight", d.hidden, dtype=norm_dtype)
                param(f"{p}.post_feedforward_layernorm.weight", d.hidden, dtype=norm_dtype)
            moe = {"MixtralForCausalLM": "block_sparse_moe", "Qwen3MoeForCausalLM": "mlp"}.get(arch)
            if moe:
                param(f"{p}.{moe}.gate.weight", d.experts, d.hidden)
                linear(f"{p}.{moe}.experts.w13_weight", d.experts, 2 * d.inter // tp, d.hidden)
                linear(f"{p}.{moe}.experts.w2_weight", d.experts, d.hidden, d.inter // tp)
            else:
                linear(f"{p}.mlp.gate_up_proj.weight", 2 * d.inter // tp, d.hidden, pieces=2)
                linear(f"{p}.mlp.down_proj.weight", d.hidden, d.inter // tp)

    # --- the layers' weight loaders -------------------------------------------------------
    # A BlockQuantScaleParameter goes through the same loaders, offsets and sizes along the
    # output dim divided (rounded up) by block_n: `unit` is that divisor (1 for weights).
    def vocab_loader(self, param: "torch.Tensor", w: "torch.Tensor") -> None:
        start, end = self.vocab_range
        assert w.shape[0] == self.vocab
        shard = w.narrow(0, start, end - start)
        param[: shard.shape[0]].copy_(shard)
        param[shard.shape[0]:].fill_(0)

    def qkv_loader(self, param: "torch.Tensor", w: "torch.Tensor", shard_id: Optional[str], unit: int) -> None:
        d = self.d
        if shard_id is None:
            # A pre-fused checkpoint tensor: split by the total sizes, load each part.
            q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
            for sid, offset, size in (("q", 0, q), ("k", q, kv), ("v", q + kv, kv)):
                self.qkv_loader(param, w.narrow(0, ceil_div(offset, unit), ceil_div(size, unit)), sid, unit)
            return
        sizes = {"q": self.num_heads * d.head_dim, "k": self.num_kv_heads * d.head_dim, "v": self.num_kv_heads * d.head_dim}
        offsets = {"q": 0, "k": sizes["q"], "v": sizes["q"] + sizes["k"]}
        size, offset = ceil_div(sizes[shard_id], unit), ceil_div(offsets[shard_id], unit)
        shard_rank = self.rank if shard_id == "q" else self.rank // self.kv_replicas
        param.narrow(0, offset, size).copy_(w.narrow(0, shard_rank * size, size))

    def merged_loader(self, param: "torch.Tensor", w: "torch.Tensor", shard_id: Optional[int], unit: int) -> None:
        output_sizes = [self.d.inter, self.d.inter]
        if shard_id is None:
            offset = 0
            for i, size in enumerate(output_sizes):
                self.merged_loader(param, w.narrow(0, ceil_div(offset, unit), ceil_div(size, unit)), i, unit)
                offset += size
            return
        size = ceil_div(output_sizes[shard_id], unit) // self.tp
        offset = ceil_div(sum(output_sizes[:shard_id]), unit) // self.tp
        param.narrow(0, offset, size).copy_(w.narrow(0, self.rank * size, size))

    def row_loader(self, param: "torch.Tensor", w: "torch.Tensor") -> None:
        size = param.shape[1]
        param.copy_(w.narrow(1, self.rank * size, size))

    def moe_loader(self, param: "torch.Tensor", w: "torch.Tensor", shard_id: str, expert: int) -> None:
        # FusedMoE._load_w13 / _load_w2: sizes come from the parameter, so scales load alike.
        expert_param = param[expert]
        if shard_id == "w2":
            size = expert_param.shape[1]
            expert_param.copy_(w.narrow(1, self.rank * size, size))
            return
        size = expert_param.shape[0] // 2
        dst = expert_param.narrow(0, 0 if shard_id == "w1" else size, size)
        dst.copy_(w.narrow(0, self.rank * size, size))

    def per_tensor_loader(self, param: "torch.Tensor", w: "torch.Tensor", index: Any) -> None:
        # PerTensorScaleParameter._load_into_shard_id (q/k/v -> 0/1/2, gate/up -> 0/1, a row or
        # column layer's -> 0) and FusedMoE._load_per_tensor_weight_scale ([expert][w1 0, w3 1],
        # w2 [expert]): one scalar, whatever the tp rank.
        assert w.numel() == 1
        param[index] = w.reshape(())

    # --- the models' load_weights ---------------------------------------------------------
    def load(self, checkpoint: Dict[str, "torch.Tensor"]) -> None:
        stacked = [
            (".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k"), (".qkv_proj", ".v_proj", "v"),
            (".gate_up_proj", ".gate_proj", 0), (".gate_up_proj", ".up_proj", 1),
        ]
        if self.arch == "MixtralForCausalLM":
            gate, down, up = "w1", "w2", "w3"
        else:
            gate, down, up = "gate_proj", "down_proj", "up_proj"
        # FusedMoE.make_expert_params_mapping
        experts = [
            ("experts.w13_" if w in (gate, up) else "experts.w2_", f"experts.{e}.{w}.", e, sid)
            for e in range(self.d.experts) for sid, w in (("w1", gate), ("w2", down), ("w3", up))
        ]
        for name, w in checkpoint.items():
            unit = self.d.block if name.endswith(SCALE) else 1
            if name == "lm_head.weight" and "lm_head.weight" not in self.params:
                continue  # tied: vLLM skips the stored copy
            per_tensor = name.endswith(".weight_scale")
            if ".experts." in name:
                for param_prefix, weight_prefix, e, sid in experts:
                    if weight_prefix in name:
                        target = name.replace(weight_prefix, param_prefix)
                        if per_tensor:
                            self.per_tensor_loader(self.params[target], w, e if sid == "w2" else (e, 0 if sid == "w1" else 1))
                        else:
                            self.moe_loader(self.params[target], w, sid, e)
                        break
                else:
                    raise AssertionError(f"no expert mapping for {name}")
            else:
                for param_part, weight_part, sid in stacked:
                    if weight_part in name:
                        target = name.replace(weight_part, param_part)
                        if per_tensor:
                            self.per_tensor_loader(self.params[target], w, "qkv".index(sid) if isinstance(sid, str) else sid)
                        else:
                            (self.qkv_loader if param_part == ".qkv_proj" else self.merged_loader)(self.params[target], w, sid, unit)
                        break
                else:
                    target = name
                    param = self.params[target]
                    if per_tensor:
                        self.per_tensor_loader(param, w, 0)
                    elif name.endswith(("qkv_proj.weight", "qkv_proj" + SCALE)):
                        self.qkv_loader(param, w, None, unit)
                    elif name.endswith(("gate_up_proj.weight", "gate_up_proj" + SCALE)):
                        self.merged_loader(param, w, None, unit)
                    elif name in ("model.embed_tokens.weight", "lm_head.weight"):
                        self.vocab_loader(param, w)
                    elif name.endswith(("o_proj.weight", "down_proj.weight", "o_proj" + SCALE, "down_proj" + SCALE)):
                        self.row_loader(param, w)
                    else:
                        param.copy_(w)  # default_weight_loader: norms, routers
            self.loaded[target] = self.loaded.get(target, 0) + 1


def tp_sizes() -> List[int]:
    gpus = torch.cuda.device_count() if DEVICE == "cuda" else 4
    return [tp for tp in (1, 2, 4) if tp <= gpus]


def fingerprints(model: Path, tp: int) -> List[Dict[str, Any]]:
    out = subprocess.run(["node", str(MAIN_JS), "fingerprint", "--model", str(model), "-tp", str(tp)], cwd=REPO, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["ranks"]


def raw(t: "torch.Tensor") -> bytes:
    return t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


@unittest.skipIf(torch is None, "needs torch and safetensors")
@unittest.skipUnless(MAIN_JS.exists(), "needs the built daemon (npm run build:ts)")
class VllmLayoutOracleTest(unittest.TestCase):
    def check(self, arch: str, vocab: int, d: Dims, tps=(1, 2, 4)) -> None:
        work = Path(tempfile.mkdtemp(prefix="weightd-layouts-"))
        try:
            model = work / "model"
            model.mkdir()
            checkpoint = random_checkpoint(model, arch, vocab, seed=vocab + len(arch), d=d)
            norm_dtype = checkpoint["model.norm.weight"].dtype
            for tp in [t for t in tp_sizes() if t in tps]:
                daemon = Daemon(str(model), ["--layouts", "checkpoint,vllm", "--log-level", "warn"], 300, tp=tp, device=DEVICE,
                                socket_dir=str(work / "sockets"), host_device=f"layouts-{os.getpid()}-{tp}")
                try:
                    expected = fingerprints(model, tp)
                    for rank in range(tp):
                        with self.subTest(arch=arch, vocab=vocab, tp=tp, rank=rank):
                            oracle = VllmOracle(arch, vocab, tp, rank, d, norm_dtype)
                            oracle.load(checkpoint)
                            self.assertEqual(set(oracle.params) - set(oracle.loaded), set(), "oracle: parameters no checkpoint tensor loaded")
                            client = WeightdClient(find_socket(global_rank=rank, socket_dir=str(daemon.socket_dir)))
                            try:
                                fp = expected[rank]
                                attached = client.attach(fp["fingerprint"], fp.get("fingerprintFields"), tensor_format="torch", layout="vllm")
                                self.assertEqual(attached.status, "attached", f"{attached}")
                                with attached:
                                    got = attached.tensors
                                    self.assertEqual(sorted(got), sorted(oracle.params))
                                    for name, want in oracle.params.items():
                                        self.assertEqual(tuple(got[name].shape), tuple(want.shape), name)
                                        self.assertEqual(got[name].dtype, want.dtype, name)
                                        self.assertEqual(raw(got[name]), raw(want), f"{name}: bytes")
                                    del got
                                copied = client.copy(fp["fingerprint"], fp.get("fingerprintFields"), tensor_format="torch", layout="vllm")
                                self.assertEqual(sorted(copied), sorted(oracle.params))
                                self.assertEqual(raw(copied["model.embed_tokens.weight"]), raw(oracle.params["model.embed_tokens.weight"]))
                            finally:
                                client.close()
                finally:
                    daemon.stop()
        finally:
            shutil.rmtree(work, ignore_errors=True)


@unittest.skipIf(torch is None, "needs torch and safetensors")
@unittest.skipUnless(MAIN_JS.exists(), "needs the built daemon (npm run build:ts)")
class RefusedLayoutTest(unittest.TestCase):
    def test_block_fp8_head_dim_64_at_tp_4_serves_the_checkpoint_layout_and_names_why_not_vllm(self):
        if 4 not in tp_sizes():
            self.skipTest("needs 4 ranks")
        work = Path(tempfile.mkdtemp(prefix="weightd-refused-"))
        try:
            model = work / "model"
            model.mkdir()
            random_checkpoint(model, "LlamaForCausalLM", 1000, seed=7, d=FP8_HD64)
            daemon = Daemon(str(model), ["--layouts", "checkpoint,vllm"], 300, tp=4, device=DEVICE, socket_dir=str(work / "s"), host_device=f"refused-{os.getpid()}")
            try:
                self.assertIn("layout vllm is not served", daemon.stderr)
                fp = fingerprints(model, 4)[1]
                client = WeightdClient(find_socket(global_rank=1, socket_dir=str(daemon.socket_dir)))
                try:
                    self.assertEqual(client.ping()["layouts"], ["checkpoint"])
                    with self.assertRaises(Exception) as caught:
                        client.attach(fp["fingerprint"], fp.get("fingerprintFields"), tensor_format="torch", layout="vllm")
                    self.assertIn("would straddle ranks", str(caught.exception))
                    self.assertIn("self_attn.k_proj.weight_scale_inv", str(caught.exception))
                    with client.attach(fp["fingerprint"], fp.get("fingerprintFields"), tensor_format="torch") as got:
                        self.assertEqual(tuple(got.tensors["model.layers.0.self_attn.k_proj.weight"].shape), (64, 512))
                finally:
                    client.close()
            finally:
                daemon.stop()
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _add_cases() -> None:
    for arch in ARCHS:
        for vocab in VOCABS:
            setattr(VllmLayoutOracleTest, f"test_{arch}_vocab_{vocab}", lambda self, a=arch, v=vocab: self.check(a, v, SMALL))
    for arch in ("LlamaForCausalLM", "Qwen3ForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM"):
        setattr(VllmLayoutOracleTest, f"test_{arch}_block_fp8", lambda self, a=arch: self.check(a, 1000, FP8))
        setattr(VllmLayoutOracleTest, f"test_{arch}_per_tensor_fp8", lambda self, a=arch: self.check(a, 1000, FP8_TENSOR))
    setattr(VllmLayoutOracleTest, "test_LlamaForCausalLM_block_fp8_head_dim_64", lambda self: self.check("LlamaForCausalLM", 1000, FP8_HD64, tps=(1, 2)))


_add_cases()

if __name__ == "__main__":
    unittest.main()
