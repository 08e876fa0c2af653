"""The daemon's `vllm` layout against an oracle of vLLM's own weight loaders.

The oracle shares no code with the planner. It builds each architecture's parameters as vLLM's
model classes create them (names from ``named_parameters()``, per-rank shapes) and fills them
by replaying vLLM's ``load_weights`` over the checkpoint: the stacked-params mapping, then the
weight loaders as vllm/model_executor/layers define them (VocabParallelEmbedding pads to 64 and
zero-fills, QKVParallelLinear replicates KV heads when there are fewer than ranks,
MergedColumnParallelLinear, RowParallelLinear, FusedMoE w13/w2, a loaded_shard_id of None
splitting a pre-fused Phi-3 tensor). Every view the daemon serves (host backend) must match in
name, shape, dtype and bytes, for each architecture at tp 1, 2 and 4 and vocab 32016 and 50257.

Needs torch and safetensors, and the built daemon (npm run build:ts).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

try:
    import torch
    from safetensors.torch import save_file
except ImportError:  # pragma: no cover - the module is skipped below
    torch = None

from weightd_client import WeightdClient
from weightd_client.client import find_socket

REPO = Path(__file__).resolve().parents[3]
MAIN_JS = REPO / "dist" / "main.js"

ARCHS = [
    "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
    "Gemma2ForCausalLM", "Phi3ForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM",
]
# 2 KV heads: split at tp 2, replicated over pairs of ranks at tp 4.
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS, EXPERTS = 16, 4, 2, 4, 32, 2, 2


def random_checkpoint(directory: Path, arch: str, vocab: int, seed: int) -> Dict[str, "torch.Tensor"]:
    """A Hugging Face style checkpoint of `arch`, random bf16 values (norms f32 for Gemma2)."""
    g = torch.Generator().manual_seed(seed)
    out: Dict[str, torch.Tensor] = {}

    def t(name: str, *shape: int, dtype: "torch.dtype" = torch.bfloat16) -> None:
        out[name] = torch.randn(*shape, generator=g).to(dtype)

    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    norm = torch.float32 if arch == "Gemma2ForCausalLM" else torch.bfloat16
    tied = arch == "Gemma2ForCausalLM"
    t("model.embed_tokens.weight", vocab, HIDDEN)
    t("model.norm.weight", HIDDEN, dtype=norm)
    if not tied:
        t("lm_head.weight", vocab, HIDDEN)
    for layer in range(LAYERS):
        p = f"model.layers.{layer}"
        t(f"{p}.input_layernorm.weight", HIDDEN, dtype=norm)
        t(f"{p}.post_attention_layernorm.weight", HIDDEN, dtype=norm)
        t(f"{p}.self_attn.o_proj.weight", HIDDEN, q)
        if arch == "Phi3ForCausalLM":
            t(f"{p}.self_attn.qkv_proj.weight", q + 2 * kv, HIDDEN)
            t(f"{p}.mlp.gate_up_proj.weight", 2 * INTER, HIDDEN)
            t(f"{p}.mlp.down_proj.weight", HIDDEN, INTER)
            continue
        t(f"{p}.self_attn.q_proj.weight", q, HIDDEN)
        t(f"{p}.self_attn.k_proj.weight", kv, HIDDEN)
        t(f"{p}.self_attn.v_proj.weight", kv, HIDDEN)
        if arch == "Qwen2ForCausalLM":
            t(f"{p}.self_attn.q_proj.bias", q)
            t(f"{p}.self_attn.k_proj.bias", kv)
            t(f"{p}.self_attn.v_proj.bias", kv)
        if arch.startswith("Qwen3"):
            t(f"{p}.self_attn.q_norm.weight", HEAD_DIM)
            t(f"{p}.self_attn.k_norm.weight", HEAD_DIM)
        if arch == "Gemma2ForCausalLM":
            t(f"{p}.pre_feedforward_layernorm.weight", HIDDEN, dtype=norm)
            t(f"{p}.post_feedforward_layernorm.weight", HIDDEN, dtype=norm)
        if arch == "MixtralForCausalLM":
            t(f"{p}.block_sparse_moe.gate.weight", EXPERTS, HIDDEN)
            for e in range(EXPERTS):
                t(f"{p}.block_sparse_moe.experts.{e}.w1.weight", INTER, HIDDEN)
                t(f"{p}.block_sparse_moe.experts.{e}.w2.weight", HIDDEN, INTER)
                t(f"{p}.block_sparse_moe.experts.{e}.w3.weight", INTER, HIDDEN)
        elif arch == "Qwen3MoeForCausalLM":
            t(f"{p}.mlp.gate.weight", EXPERTS, HIDDEN)
            for e in range(EXPERTS):
                t(f"{p}.mlp.experts.{e}.gate_proj.weight", INTER, HIDDEN)
                t(f"{p}.mlp.experts.{e}.up_proj.weight", INTER, HIDDEN)
                t(f"{p}.mlp.experts.{e}.down_proj.weight", HIDDEN, INTER)
        else:
            t(f"{p}.mlp.gate_proj.weight", INTER, HIDDEN)
            t(f"{p}.mlp.up_proj.weight", INTER, HIDDEN)
            t(f"{p}.mlp.down_proj.weight", HIDDEN, INTER)
    config = {
        "architectures": [arch], "hidden_size": HIDDEN, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "intermediate_size": INTER, "moe_intermediate_size": INTER, "num_local_experts": EXPERTS,
        "num_experts": EXPERTS, "vocab_size": vocab, "num_hidden_layers": LAYERS, "tie_word_embeddings": tied,
        "torch_dtype": "bfloat16",
    }
    (directory / "config.json").write_text(json.dumps(config))
    # Two files, split mid-layer, as exports are.
    names = list(out)
    half = len(names) // 2
    save_file({n: out[n] for n in names[:half]}, str(directory / "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
    save_file({n: out[n] for n in names[half:]}, str(directory / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    weight_map = {n: ("model-00001-of-00002.safetensors" if i < half else "model-00002-of-00002.safetensors") for i, n in enumerate(names)}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


class VllmOracle:
    """vLLM's parameters of one rank, filled the way its weight loaders fill them."""

    def __init__(self, arch: str, vocab: int, tp: int, rank: int, dtype_of: Callable[[str], "torch.dtype"]):
        self.arch, self.tp, self.rank = arch, tp, rank
        self.params: Dict[str, torch.Tensor] = {}
        self.loaded: Dict[str, int] = {}
        # QKVParallelLinear.__init__
        self.num_heads = HEADS // tp
        if tp >= KV_HEADS:
            self.num_kv_heads, self.kv_replicas = 1, tp // KV_HEADS
        else:
            self.num_kv_heads, self.kv_replicas = KV_HEADS // tp, 1
        # VocabParallelEmbedding.__init__ with org_num_embeddings == num_embeddings (no LoRA).
        self.vocab = vocab
        padded = (vocab + 63) // 64 * 64
        self.vocab_per_rank = padded // tp
        start = min(rank * self.vocab_per_rank, vocab)
        self.vocab_range = (start, min((rank + 1) * self.vocab_per_rank, vocab))

        def param(name: str, *shape: int) -> None:
            # Poisoned, so a row no loader writes shows up as a mismatch.
            self.params[name] = torch.full(shape, float("nan"), dtype=dtype_of(name))

        tied = arch == "Gemma2ForCausalLM"
        param("model.embed_tokens.weight", self.vocab_per_rank, HIDDEN)
        if not tied:
            param("lm_head.weight", self.vocab_per_rank, HIDDEN)
        param("model.norm.weight", HIDDEN)
        qkv_rows = (self.num_heads + 2 * self.num_kv_heads) * HEAD_DIM
        for layer in range(LAYERS):
            p = f"model.layers.{layer}"
            param(f"{p}.input_layernorm.weight", HIDDEN)
            param(f"{p}.post_attention_layernorm.weight", HIDDEN)
            param(f"{p}.self_attn.qkv_proj.weight", qkv_rows, HIDDEN)
            if arch == "Qwen2ForCausalLM":
                param(f"{p}.self_attn.qkv_proj.bias", qkv_rows)
            param(f"{p}.self_attn.o_proj.weight", HIDDEN, HEADS * HEAD_DIM // tp)
            if arch.startswith("Qwen3"):
                param(f"{p}.self_attn.q_norm.weight", HEAD_DIM)
                param(f"{p}.self_attn.k_norm.weight", HEAD_DIM)
            if arch == "Gemma2ForCausalLM":
                param(f"{p}.pre_feedforward_layernorm.weight", HIDDEN)
                param(f"{p}.post_feedforward_layernorm.weight", HIDDEN)
            moe = {"MixtralForCausalLM": "block_sparse_moe", "Qwen3MoeForCausalLM": "mlp"}.get(arch)
            if moe:
                param(f"{p}.{moe}.gate.weight", EXPERTS, HIDDEN)
                param(f"{p}.{moe}.experts.w13_weight", EXPERTS, 2 * INTER // tp, HIDDEN)
                param(f"{p}.{moe}.experts.w2_weight", EXPERTS, HIDDEN, INTER // tp)
            else:
                param(f"{p}.mlp.gate_up_proj.weight", 2 * INTER // tp, HIDDEN)
                param(f"{p}.mlp.down_proj.weight", HIDDEN, INTER // tp)

    # --- the layers' weight loaders -------------------------------------------------------
    def vocab_loader(self, param: "torch.Tensor", w: "torch.Tensor") -> None:
        start, end = self.vocab_range
        assert w.shape[0] == self.vocab
        shard = w.narrow(0, start, end - start)
        param[: shard.shape[0]].copy_(shard)
        param[shard.shape[0]:].fill_(0)

    def qkv_loader(self, param: "torch.Tensor", w: "torch.Tensor", shard_id: Optional[str]) -> None:
        if shard_id is None:
            # A pre-fused checkpoint tensor: split by the total sizes, load each part.
            q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
            for sid, offset, size in (("q", 0, q), ("k", q, kv), ("v", q + kv, kv)):
                self.qkv_loader(param, w.narrow(0, offset, size), sid)
            return
        sizes = {"q": self.num_heads * HEAD_DIM, "k": self.num_kv_heads * HEAD_DIM, "v": self.num_kv_heads * HEAD_DIM}
        offsets = {"q": 0, "k": sizes["q"], "v": sizes["q"] + sizes["k"]}
        size = sizes[shard_id]
        shard_rank = self.rank if shard_id == "q" else self.rank // self.kv_replicas
        param.narrow(0, offsets[shard_id], size).copy_(w.narrow(0, shard_rank * size, size))

    def merged_loader(self, param: "torch.Tensor", w: "torch.Tensor", shard_id: Optional[int]) -> None:
        output_sizes = [INTER, INTER]
        if shard_id is None:
            offset = 0
            for i, size in enumerate(output_sizes):
                self.merged_loader(param, w.narrow(0, offset, size), i)
                offset += size
            return
        size = output_sizes[shard_id] // self.tp
        offset = sum(output_sizes[:shard_id]) // self.tp
        param.narrow(0, offset, size).copy_(w.narrow(0, self.rank * size, size))

    def row_loader(self, param: "torch.Tensor", w: "torch.Tensor") -> None:
        size = param.shape[1]
        param.copy_(w.narrow(1, self.rank * size, size))

    def moe_loader(self, param: "torch.Tensor", w: "torch.Tensor", shard_id: str, expert: int) -> None:
        expert_param = param[expert]
        if shard_id == "w2":
            size = expert_param.shape[1]
            expert_param.copy_(w.narrow(1, self.rank * size, size))
            return
        size = expert_param.shape[0] // 2
        dst = expert_param.narrow(0, 0 if shard_id == "w1" else size, size)
        dst.copy_(w.narrow(0, self.rank * size, size))

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
            for e in range(EXPERTS) for sid, w in (("w1", gate), ("w2", down), ("w3", up))
        ]
        for name, w in checkpoint.items():
            if name == "lm_head.weight" and "lm_head.weight" not in self.params:
                continue  # tied: vLLM skips the stored copy
            if ".experts." in name:
                for param_prefix, weight_prefix, e, sid in experts:
                    if weight_prefix in name:
                        target = name.replace(weight_prefix, param_prefix)
                        self.moe_loader(self.params[target], w, sid, e)
                        break
                else:
                    raise AssertionError(f"no expert mapping for {name}")
            else:
                for param_part, weight_part, sid in stacked:
                    if weight_part in name:
                        target = name.replace(weight_part, param_part)
                        (self.qkv_loader if param_part == ".qkv_proj" else self.merged_loader)(self.params[target], w, sid)
                        break
                else:
                    target = name
                    param = self.params[target]
                    if name.endswith("qkv_proj.weight"):
                        self.qkv_loader(param, w, None)
                    elif name.endswith("gate_up_proj.weight"):
                        self.merged_loader(param, w, None)
                    elif name in ("model.embed_tokens.weight", "lm_head.weight"):
                        self.vocab_loader(param, w)
                    elif name.endswith(("o_proj.weight", "down_proj.weight")):
                        self.row_loader(param, w)
                    else:
                        param.copy_(w)  # default_weight_loader: norms, routers
            self.loaded[target] = self.loaded.get(target, 0) + 1


class Daemon:
    def __init__(self, model: Path, tp: int, work: Path):
        self.socket_dir = work / "sockets"
        env = {**os.environ, "WEIGHTD_HOST_DEVICES": ",".join(f"layouts-{os.getpid()}-{tp}-{i}" for i in range(tp))}
        args = ["node", str(MAIN_JS), "--model", str(model), "-tp", str(tp), "--device", "host", "--layouts", "checkpoint,vllm", "--weight-cache-socket-dir", str(self.socket_dir), "--log-level", "warn"]
        self.proc = subprocess.Popen(args, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.stderr = ""
        for line in self.proc.stderr:
            self.stderr += line
            if line.startswith("READY "):
                return
        self.proc.wait()
        raise AssertionError(f"daemon exited ({self.proc.returncode}) before READY:\n{self.stderr}")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stderr.close()


def fingerprints(model: Path, tp: int) -> List[Dict[str, Any]]:
    out = subprocess.run(["node", str(MAIN_JS), "fingerprint", "--model", str(model), "-tp", str(tp)], cwd=REPO, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["ranks"]


def raw(t: "torch.Tensor") -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


@unittest.skipIf(torch is None, "needs torch and safetensors")
@unittest.skipUnless(MAIN_JS.exists(), "needs the built daemon (npm run build:ts)")
class VllmLayoutOracleTest(unittest.TestCase):
    def check(self, arch: str, vocab: int) -> None:
        work = Path(tempfile.mkdtemp(prefix="weightd-layouts-"))
        try:
            model = work / "model"
            model.mkdir()
            checkpoint = random_checkpoint(model, arch, vocab, seed=vocab + len(arch))
            # vLLM keeps a parameter in the model dtype; this fixture's only other dtype is
            # Gemma2's f32 norms, which the daemon serves as stored.
            def dtype_of(name: str) -> "torch.dtype":
                return checkpoint.get(name, checkpoint["model.embed_tokens.weight"]).dtype

            for tp in (1, 2, 4):
                daemon = Daemon(model, tp, work)
                try:
                    expected = fingerprints(model, tp)
                    for rank in range(tp):
                        with self.subTest(arch=arch, vocab=vocab, tp=tp, rank=rank):
                            oracle = VllmOracle(arch, vocab, tp, rank, dtype_of)
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


def _add_cases() -> None:
    for arch in ARCHS:
        for vocab in (32016, 50257):
            setattr(VllmLayoutOracleTest, f"test_{arch}_vocab_{vocab}", lambda self, a=arch, v=vocab: self.check(a, v))


_add_cases()

if __name__ == "__main__":
    unittest.main()
