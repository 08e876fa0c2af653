"""A trainer that names its tensors as vLLM does (write_version with ``rename``, engine_names.py)
against a real host daemon serving the ``vllm`` layout: fused parameters (``qkv_proj``,
``gate_up_proj``, FusedMoE ``w13_weight``/``w2_weight`` under vLLM 0.32's ``routed_experts``,
per-tensor FP8 scales one scalar per piece) and the padded vocabulary land in the checkpoint
tensors they are made of. The fused tensors are made by test_layouts_vllm's oracle of vLLM's own
weight loaders, which shares no code with the planner or the split. Names or shapes no layout
knows are refused, naming them, before anything is begun."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from daemon_fixture import DEVICE, MAIN_JS, Daemon
from test_layouts_vllm import FP8_TENSOR, SMALL, Dims, VllmOracle, random_checkpoint
from test_switch import ctl
from test_update import update_memfds
from weightd_client.engine_names import NoRule
from weightd_client.vllm_rules import layout_namer
from weightd_client.write_version import WriteRefused, WriteTarget, serving_fingerprint, write_version

pytestmark = [
    pytest.mark.skipif(DEVICE != "host", reason="writers are built on the host backend"),
    pytest.mark.skipif(not MAIN_JS.exists(), reason="needs the built daemon (npm run build:ts)"),
]
torch = pytest.importorskip("torch")

VLLM_0_32 = layout_namer("0.32.0")
LAYOUTS = ["--layouts", "checkpoint,vllm", "--log-level", "warn"]
QKV = "model.layers.1.self_attn.qkv_proj.weight"


def engine_named(arch: str, vocab: int, d: Dims, checkpoint) -> dict:
    """vLLM's parameters at tp 1 holding ``checkpoint``, by ``named_parameters()`` name under
    vLLM 0.32 (FusedMoE's in its ``routed_experts`` submodule)."""
    oracle = VllmOracle(arch, vocab, 1, 0, d, checkpoint["model.norm.weight"].dtype)
    oracle.load(checkpoint)
    return {n.replace(".experts.w", ".experts.routed_experts.w"): t for n, t in oracle.params.items()}


def raw(t) -> bytes:
    """A tensor's bytes (a scale's scalar too)."""
    return t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()


def versions(daemon, name):
    return sorted((m["version"], m["current"]) for m in json.loads(ctl(daemon, "list", "--json"))["models"] if m["name"] == name and m["state"] == "serving")


def served(daemon, name, version, layout="checkpoint"):
    with daemon.client(0) as client:
        return client.copy(serving_fingerprint(client, name, version), tensor_format="torch", layout=layout)


class Served:
    """A random checkpoint of ``arch`` served with the vllm layout, and other random weights of the same shapes."""

    def __init__(self, work: Path, name: str, arch: str, vocab: int, d: Dims, tp: int = 1):
        self.name = name
        model, other = work / name, work / f"{name}-other"
        model.mkdir()
        other.mkdir()
        random_checkpoint(model, arch, vocab, seed=1, d=d)
        self.other = random_checkpoint(other, arch, vocab, seed=2, d=d)
        self.daemon = Daemon(str(model), LAYOUTS, tp=tp, socket_dir=str(work / f"s-{name}"), host_device=f"w{os.getpid()}-{name}")
        self.target = WriteTarget(self.name, socket_dir=self.daemon.socket_dir)

    def nothing_left(self, before):
        assert versions(self.daemon, self.name) == before, "nothing may be committed"
        assert update_memfds(self.daemon.proc.pid, writable=True) == [], "nothing may be begun"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("wen")


@pytest.fixture(scope="module")
def llama(work):
    s = Served(work, "mix", "LlamaForCausalLM", 32016, SMALL)  # vLLM pads the vocabulary to 32064
    yield s
    s.daemon.stop()


CASES = {
    "llama-padded-vocab": ("LlamaForCausalLM", 32016, SMALL),
    "qwen3moe": ("Qwen3MoeForCausalLM", 512, SMALL),
    "mixtral": ("MixtralForCausalLM", 512, SMALL),
    "qwen3moe-fp8-per-tensor": ("Qwen3MoeForCausalLM", 512, FP8_TENSOR),
}


@pytest.mark.parametrize("case", list(CASES))
def test_vllm_named_tensors_land_in_the_checkpoint_tensors_they_are_made_of(work, case):
    arch, vocab, d = CASES[case]
    s = Served(work, case, arch, vocab, d)
    try:
        engine = engine_named(arch, vocab, d, s.other)
        assert any(".routed_experts." in n for n in engine) == ("Moe" in arch or "Mixtral" in arch)

        # vLLM 0.32's trainer engine hands the metadata first, then the tensors once.
        metadata = [(n, t.dtype, tuple(t.shape)) for n, t in engine.items()]
        info = write_version(iter(engine.items()), s.target, metadata, rename=VLLM_0_32)

        assert info == {"model": s.name, "version": 1}
        got = served(s.daemon, s.name, 1)
        assert sorted(n for n in got if n in s.other) == sorted(s.other)
        for n, want in s.other.items():
            assert raw(got[n]) == raw(want), f"checkpoint tensor {n}"
        # And vLLM's own view of the new version is what its loaders would have made of the other weights.
        got = served(s.daemon, s.name, 1, layout="vllm")
        for n, want in engine.items():
            n = VLLM_0_32(n)
            assert raw(got[n]) == raw(want), f"vllm parameter {n}"
    finally:
        s.daemon.stop()


def test_checkpoint_names_and_the_padded_vocabulary_mix_with_fused_ones(llama):
    s = llama
    base = max(v for v, _ in versions(s.daemon, s.name))
    engine = engine_named("LlamaForCausalLM", 32016, SMALL, s.other)
    embed = engine["model.embed_tokens.weight"]
    assert embed.shape[0] == 32064, "the engine's embedding holds the padded vocabulary"
    up = "model.layers.0.mlp.up_proj.weight"

    info = write_version([("model.embed_tokens.weight", embed), (QKV, engine[QKV]), (up, s.other[up])], s.target, rename=VLLM_0_32)

    got = served(s.daemon, s.name, info["version"])
    for n in ("model.embed_tokens.weight", up, *(QKV.replace("qkv_proj", p) for p in ("q_proj", "k_proj", "v_proj"))):
        assert raw(got[n]) == raw(s.other[n]), n
    padded = served(s.daemon, s.name, info["version"], layout="vllm")["model.embed_tokens.weight"]
    assert torch.count_nonzero(padded[32016:]) == 0, "the padding rows stay zero"
    gate = "model.layers.0.mlp.gate_proj.weight"
    assert raw(got[gate]) == raw(served(s.daemon, s.name, base)[gate]), "a tensor not sent keeps the base's bytes"


def test_a_name_no_layout_has_is_refused_naming_it_before_anything_is_begun(llama):
    s = llama
    before = versions(s.daemon, s.name)
    qkv = engine_named("LlamaForCausalLM", 32016, SMALL, s.other)[QKV]
    wrong = "model.layers.1.self_attn.qkv.weight"
    with pytest.raises(NoRule, match=rf"tensor '{wrong}' is neither a checkpoint tensor of model '{s.name}' nor a parameter of its vllm layout") as err:
        write_version([(QKV, qkv), (wrong, qkv)], s.target, rename=VLLM_0_32)
    assert err.value.code == "E_UNKNOWN_TENSOR" and err.value.details == {"tensor": wrong}
    s.nothing_left(before)


def test_a_fused_tensor_of_another_shape_or_dtype_is_refused_not_cut(llama):
    s = llama
    before = versions(s.daemon, s.name)
    qkv = engine_named("LlamaForCausalLM", 32016, SMALL, s.other)[QKV]
    half = qkv[: qkv.shape[0] // 2]  # a tensor-parallel rank's piece where the model is whole
    with pytest.raises(NoRule, match=r"the trainer's is torch.bfloat16 \[16, 16\], but vllm's parameter .* is torch.bfloat16 \[32, 16\] on this rank, the pieces of model.layers.1.self_attn.q_proj.weight, .*k_proj.weight, .*v_proj.weight back to back") as err:
        write_version([(QKV, half)], s.target, rename=VLLM_0_32)
    assert err.value.code == "E_TENSOR_MISMATCH"
    with pytest.raises(NoRule, match=r"the trainer's is torch.float32, but vllm's parameter .* is torch.bfloat16; convert it first"):
        write_version([(QKV, qkv.float())], s.target, rename=VLLM_0_32)
    s.nothing_left(before)


def test_a_checkpoint_tensor_sent_itself_and_inside_its_fused_parameter_is_refused(llama):
    s = llama
    before = versions(s.daemon, s.name)
    k = QKV.replace("qkv_proj", "k_proj")
    with pytest.raises(WriteRefused, match=rf"checkpoint tensors written more than once .*: {k}") as err:
        write_version([(QKV, engine_named("LlamaForCausalLM", 32016, SMALL, s.other)[QKV]), (k, s.other[k])], s.target, rename=VLLM_0_32)
    assert err.value.code == "E_TENSOR_TWICE"
    s.nothing_left(before)


def test_without_the_vllm_layout_a_fused_name_is_refused_saying_how_to_serve_it(work):
    model = work / "plain"
    model.mkdir()
    checkpoint = random_checkpoint(model, "LlamaForCausalLM", 512, seed=3, d=SMALL)
    qkv = engine_named("LlamaForCausalLM", 512, SMALL, checkpoint)[QKV]
    with Daemon(str(model), socket_dir=str(work / "s-plain"), host_device=f"wen{os.getpid()}-plain") as daemon:
        with pytest.raises(NoRule, match=rf"tensor '{QKV}' is no checkpoint tensor of model 'plain', and the daemon serves no vllm layout .* serve the model with --layouts checkpoint,vllm") as err:
            write_version([(QKV, qkv)], WriteTarget("plain", socket_dir=daemon.socket_dir), rename=VLLM_0_32)
        assert err.value.code == "E_UNKNOWN_TENSOR"
        assert versions(daemon, "plain") == [(0, True)]


def test_tp2_a_fused_name_is_refused_since_every_rank_holds_its_own_piece(work):
    s = Served(work, "tp2", "LlamaForCausalLM", 512, SMALL, tp=2)
    try:
        full = engine_named("LlamaForCausalLM", 512, SMALL, s.other)[QKV]
        piece = full[: full.shape[0] // 2]
        for value in (full, piece):
            with pytest.raises(WriteRefused if value is piece else NoRule, match="tensor-parallel") as err:
                write_version([(QKV, value)], s.target, rename=VLLM_0_32)
            assert err.value.code == "E_TENSOR_MISMATCH"
        s.nothing_left([(0, True)])
    finally:
        s.daemon.stop()


def view(name, dtype, shape, offset, nbytes, segment=0):
    return {"name": name, "dtype": dtype, "shape": list(shape), "segment": segment, "offset": offset, "bytes": nbytes}


def test_views_whose_pieces_do_not_tile_them_are_refused_and_packed_dtypes_are_not_cut():
    """engine_params over manifests as a daemon of another version might send them: a checkpoint
    view that crosses its parameter's edge, or one of another dtype, is a disagreement, never a
    guess; a parameter of a packed dtype (F4: two elements a byte) keeps no pieces, so it is refused."""
    from weightd_client.engine_names import EngineNames, engine_params
    from weightd_client.protocol import ProtocolError
    from weightd_client.tensors import torch_dtype

    fused = view("a.qkv_proj.weight", "BF16", (6, 4), 0, 48)
    ok = engine_params([view("a.q_proj.weight", "BF16", (2, 4), 0, 16), view("a.k_proj.weight", "BF16", (4, 4), 16, 32)], [fused])
    assert [(p.name, p.start, p.numel, p.shape) for p in ok["a.qkv_proj.weight"].pieces] == [("a.q_proj.weight", 0, 8, (2, 4)), ("a.k_proj.weight", 8, 16, (4, 4))]
    for pieces in (
        [view("a.q_proj.weight", "BF16", (2, 4), 0, 16), view("a.k_proj.weight", "BF16", (5, 4), 16, 40)],  # past the edge
        [view("a.q_proj.weight", "BF16", (2, 4), 0, 16), view("a.k_proj.weight", "BF16", (4, 4), 20, 32)],  # a gap
        [view("a.q_proj.weight", "F16", (2, 4), 0, 16)],  # another dtype
    ):
        with pytest.raises(ProtocolError, match="the daemon's layouts disagree") as err:
            engine_params(pieces, [fused])
        assert err.value.code == "E_BAD_MANIFEST"
    packed = engine_params([view("b.q_proj.weight", "F4", (2, 4), 0, 4)], [view("b.qkv_proj.weight", "F4", (2, 4), 0, 4)])
    assert packed["b.qkv_proj.weight"].pieces == ()
    names = EngineNames("m", {"b.q_proj.weight": (2, 4)}, packed, "vllm")
    with pytest.raises(NoRule, match="whose bytes this client does not cut into elements") as err:
        names.param("b.qkv_proj.weight", torch_dtype("F4"), (2, 4))
    assert err.value.code == "E_TENSOR_MISMATCH"
