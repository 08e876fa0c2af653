"""load_into against the real daemon (host backend) and real transformers models: zero-copy when
the daemon serves the checkpoint, the same tokens as from_pretrained either way, disk otherwise."""

from __future__ import annotations

import gc
import hashlib
import logging
import shutil
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from daemon_fixture import DEVICE, Daemon  # noqa: E402

from weightd_client import WeightdError, get_memory, load_into  # noqa: E402
from weightd_client.client import WeightdClient, find_socket  # noqa: E402

CUDA = DEVICE == "cuda"
#: load_into's CUDA ordinal, and where the reference models run.
ORDINAL = 0 if CUDA else None
DEV = torch.device("cuda", 0) if CUDA else torch.device("cpu")

PROMPT = [[1, 17, 42, 99, 3, 64, 5]]
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def _config(kind: str):
    if kind == "llama":
        return transformers.LlamaConfig(**TINY, tie_word_embeddings=True)
    if kind == "qwen3moe":
        return transformers.Qwen3MoeConfig(**TINY, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16, tie_word_embeddings=False)
    return transformers.MixtralConfig(**TINY, num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)


def _model_class(kind: str):
    return {"llama": transformers.LlamaForCausalLM, "qwen3moe": transformers.Qwen3MoeForCausalLM, "mixtral": transformers.MixtralForCausalLM}[kind]


@pytest.fixture(scope="module")
def workdir():
    d = tempfile.mkdtemp(prefix="weightd-torch-")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def _checkpoint(workdir: Path, kind: str, seed: int) -> str:
    path = workdir / f"{kind}-{seed}"
    if not path.exists():
        torch.manual_seed(seed)
        _model_class(kind)(_config(kind)).save_pretrained(str(path))
    return str(path)


def _meta_model(kind: str):
    with torch.device("meta"):
        return _model_class(kind)(_config(kind))


def _tokens(model) -> list:
    model.eval()
    with torch.no_grad():
        out = model.generate(torch.tensor(PROMPT, device=DEV), max_new_tokens=8, do_sample=False, pad_token_id=0)
    return out[0].tolist()


def _logits(model):
    model.eval()
    with torch.no_grad():
        return model(torch.tensor(PROMPT, device=DEV)).logits


def _disk_tokens(path: str) -> list:
    return _tokens(transformers.AutoModelForCausalLM.from_pretrained(path).to(DEV))


def _disk_logits(path: str):
    return _logits(transformers.AutoModelForCausalLM.from_pretrained(path).to(DEV))


def _allocated() -> int:
    return torch.cuda.memory_allocated(0) if CUDA else 0


def _mapped_ranges():
    """Address ranges of this process's mappings of the daemon's segments (memfds, /proc/self/maps)."""
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/memfd:weightd:"):
                start, end = (int(x, 16) for x in parts[0].split("-"))
                ranges.append((start, end))
    return ranges


def _assert_zero_copy(model, result, allocated_before: int) -> None:
    if CUDA:
        # IPC-mapped memory is not torch's: its allocator grew by the rotary buffers at most.
        weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        assert all(t.is_cuda for t in model.state_dict().values())
        assert torch.cuda.memory_allocated(0) - allocated_before < weights // 10
        return
    ranges = _mapped_ranges()
    assert ranges, "no mapping of the daemon's segments in /proc/self/maps"
    for name, t in model.state_dict().items():
        first, last = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
        assert any(s <= first and last <= e for s, e in ranges), f"{name} is not in the daemon's shared memory"


@pytest.mark.parametrize("kind", ["llama", "qwen3moe", "mixtral"])
def test_zero_copy_from_the_daemon_generates_what_from_pretrained_does(workdir, kind):
    ckpt = _checkpoint(workdir, kind, seed=1)
    # The vllm layout places each fused MoE tensor's pieces back to back (dense models need no layout).
    with Daemon(ckpt, [] if kind == "llama" else ["--layouts", "vllm"]) as daemon:
        model = _meta_model(kind)
        before = _allocated()
        result = load_into(model, ckpt, socket_dir=daemon.socket_dir, device=ORDINAL)
        try:
            assert (result.source, result.reason) == ("weightd", None)
            _assert_zero_copy(model, result, before)
            if kind == "llama":
                assert model.lm_head.weight is model.model.embed_tokens.weight, "tied weights stay one parameter"
            assert _tokens(model) == _disk_tokens(ckpt)
            assert torch.equal(_logits(model), _disk_logits(ckpt)), "the same bytes give the same logits"
            with WeightdClient(result.socket_path) as client:
                # stats shows each lease by a hash of its id, never the id (docs/protocol.md, stats).
                own = hashlib.sha256(result.attached.lease_id.encode()).hexdigest()[:16]
                assert [l["leaseHash"] for l in client.stats()["leases"]] == [own]
            assert get_memory(socket_path=result.socket_path) == sum(s["bytes"] for s in result.attached.state["segments"])
        finally:
            del model
            result.close()
        with WeightdClient(result.socket_path) as client:
            assert client.stats()["leases"] == [], "close() ends the lease"


def test_a_tensor_kept_past_close_stays_valid_and_holds_the_lease_until_freed_on_cuda(workdir):
    # On cuda a tensor over a closed IPC handle faults on its next use and poisons the process's
    # CUDA context; so the handles (and the lease) stay until the last view is freed. A host
    # mapping's pages outlive the lease, which ends at once.
    from safetensors.torch import load_file

    ckpt = _checkpoint(workdir, "llama", seed=1)
    with Daemon(ckpt) as daemon:
        model = _meta_model("llama")
        result = load_into(model, ckpt, socket_dir=daemon.socket_dir, device=ORDINAL)
        assert result.source == "weightd"
        kept = model.model.embed_tokens.weight
        del model
        result.close()
        with WeightdClient(result.socket_path) as client:
            held = len(client.stats()["leases"])
        assert torch.equal(kept.cpu(), load_file(str(Path(ckpt) / "model.safetensors"))["model.embed_tokens.weight"])
        assert held == (1 if CUDA else 0)
        del kept
        gc.collect()
        with WeightdClient(result.socket_path) as client:
            assert client.stats()["leases"] == [], "freeing the last view ends the lease"


def test_moe_whose_pieces_are_apart_loads_from_disk(workdir, caplog):
    ckpt = _checkpoint(workdir, "qwen3moe", seed=1)
    with Daemon(ckpt) as daemon:  # checkpoint layout only: each expert's tensors apart
        model = _meta_model("qwen3moe")
        with caplog.at_level(logging.WARNING, logger="weightd_client"):
            result = load_into(model, ckpt, socket_dir=daemon.socket_dir, device=ORDINAL)
        assert result.source == "disk" and result.fields == ["layout"]
        assert "--layouts vllm" in caplog.text and ".mlp.experts." in caplog.text
        with WeightdClient(find_socket(global_rank=0, socket_dir=daemon.socket_dir)) as client:
            assert client.stats()["leases"] == [], "a refused attach keeps no lease"
        assert _tokens(model) == _disk_tokens(ckpt)


def test_a_daemon_serving_other_weights_is_not_used(workdir, caplog):
    mine, other = _checkpoint(workdir, "llama", seed=1), _checkpoint(workdir, "llama", seed=2)
    with Daemon(other) as daemon:  # same names, shapes and config; other tensor bytes
        model = _meta_model("llama")
        with caplog.at_level(logging.WARNING, logger="weightd_client"):
            result = load_into(model, mine, socket_dir=daemon.socket_dir, device=ORDINAL)
        assert result.source == "disk" and result.fields == ["content"]
        assert "content" in caplog.text
        assert model.lm_head.weight is model.model.embed_tokens.weight
        assert _tokens(model) == _disk_tokens(mine)
        # Tiny random models may agree on greedy tokens; their logits tell them apart.
        assert torch.equal(_logits(model), _disk_logits(mine))
        assert not torch.equal(_logits(model), _disk_logits(other))


def test_no_daemon_loads_from_disk(workdir, caplog):
    ckpt = _checkpoint(workdir, "llama", seed=1)
    empty = tempfile.mkdtemp(prefix="weightd-pytest-")
    try:
        model = _meta_model("llama")
        with caplog.at_level(logging.WARNING, logger="weightd_client"):
            result = load_into(model, ckpt, socket_dir=empty, device=ORDINAL)
        assert result.source == "disk" and result.attached is None
        assert "E_NO_SOCKET" in caplog.text
        assert _tokens(model) == _disk_tokens(ckpt)
    finally:
        shutil.rmtree(empty)


class HomeGrown(torch.nn.Module):
    """An engine's own module, not a PreTrainedModel: the checkpoint's names, its own forward."""

    def __init__(self, config):
        super().__init__()
        self.model = transformers.LlamaModel(config)
        self.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, ids):
        return self.lm_head(self.model(ids).last_hidden_state)


def test_a_home_grown_module_attaches_and_falls_back_to_the_safetensors(workdir, caplog):
    ckpt = _checkpoint(workdir, "llama", seed=1)
    expected = _disk_logits(ckpt)
    with Daemon(ckpt) as daemon:
        engine = HomeGrown(_config("llama"))
        before = _allocated()
        result = load_into(engine, ckpt, socket_dir=daemon.socket_dir, device=ORDINAL)
        assert result.source == "weightd"
        _assert_zero_copy(engine, result, before)
        with torch.no_grad():
            assert torch.equal(engine(torch.tensor(PROMPT, device=DEV)), expected)
        del engine
        result.close()

        # Shapes that are not the checkpoint's: named, then disk cannot fit them either.
        wrong = HomeGrown(transformers.LlamaConfig(**{**TINY, "intermediate_size": 96}, tie_word_embeddings=True))
        with caplog.at_level(logging.WARNING, logger="weightd_client"), pytest.raises(WeightdError) as err:
            load_into(wrong, ckpt, socket_dir=daemon.socket_dir, device=ORDINAL)
        assert err.value.code == "E_MODEL_MISMATCH"
        assert "model.layers.0.mlp.down_proj.weight shape [64, 128] != model's [64, 96]" in caplog.text
    engine = HomeGrown(_config("llama"))
    result = load_into(engine, ckpt, socket_dir=daemon.socket_dir, device=ORDINAL)  # the daemon is gone
    assert result.source == "disk"
    assert engine.lm_head.weight is engine.model.embed_tokens.weight
    with torch.no_grad():
        assert torch.equal(engine(torch.tensor(PROMPT, device=DEV)), expected)


def test_a_meta_buffer_nothing_can_compute_is_refused_before_any_assignment(workdir):
    ckpt = _checkpoint(workdir, "llama", seed=1)
    with torch.device("meta"):
        engine = HomeGrown(_config("llama"))  # rotary frequencies on meta, no _init_weights
    with pytest.raises(WeightdError) as err:
        load_into(engine, ckpt, socket_dir=tempfile.gettempdir() + "/weightd-pytest-none")
    assert err.value.code == "E_META_BUFFER" and "rotary_emb.inv_freq" in str(err.value)
    assert all(t.device.type == "meta" for t in engine.state_dict().values()), "nothing was assigned"
