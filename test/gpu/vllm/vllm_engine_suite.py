"""The vLLM plugin on a real CUDA vLLM (test/gpu/vllm/run.sh says how to run it).

Per model (a dense Llama, vocabulary 32016; a Qwen3-MoE; FP8 Llamas made from the dense one:
block FP8 at head_dim 128 and 64, per-tensor FP8), with a daemon on the GPU serving
`--layouts checkpoint,vllm --cuda-handles fd`:
- disk (load_format auto), then weightd in map mode twice (a restart) and in copy mode: the same
  greedy tokens and top-5 logprobs as the disk load, from the daemon (the plugin's log line);
- the daemon's memory digest (every checkpoint tensor's bytes, read through a copy attach)
  equal before and after the engines ran;
then the fallbacks (no daemon; a daemon serving other bytes of the same shapes) load from disk
with the same tokens, and a write into a mapped weight fails in its own process while the
daemon's bytes stay unchanged. The follow cases (issue 31): an engine mapped from the daemon
switches to another version loaded under its name and back, in place (``follow``: the dense
Llama; ``follow-graphs``: the same with captured CUDA graphs; ``follow-fp8-tensor``: per-tensor
FP8, whose private copies are requantized from the new bytes). ``follow-trainer``: the trainer's
own model (transformers, the other weights, on the GPU) goes through vLLM 0.26's static
``trainer_send_weights`` (written as a new version device to device, then followed); a name the
daemon does not hold is refused with nothing committed. Skipped, not failed, while the daemon
refuses cuda writers (E_UPDATE_UNSUPPORTED).

``fp8-tensor-published`` (issue 30 §2, processed layouts): per-tensor FP8 started three times
against one daemon; the first engine processes its linear layers and publishes what it computed,
the second and third map that and process none (counted), each with the disk load's tokens and
logprobs, the daemon's version digest unchanged (the daemon runs with --cuda-handles fd, which
cuda publishes need); the restart time saved is the first start's against the later ones'.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "clients" / "python" / "tests"))

import torch  # noqa: E402

from daemon_fixture import Daemon  # noqa: E402
from fp8_checkpoints import quantize_fp8  # noqa: E402
from weightd_client import WeightdClient, expected_fingerprint, find_socket  # noqa: E402

PROMPT = [1, 2, 3, 4, 5, 77, 301, 499]
DAEMON_ARGS = ["--layouts", "checkpoint,vllm", "--cuda-handles", "fd"]
SUITE = ("llama", "moe", "fallbacks", "fp8-block", "fp8-block-hd64", "fp8-tensor", "follow", "follow-graphs", "follow-fp8-tensor", "follow-trainer", "fp8-tensor-published")
#: The follow cases (issue 31): the engine's model and the other version it switches to and back.
FOLLOW = {"follow": ("llama", "llama-other"), "follow-graphs": ("llama", "llama-other"), "follow-fp8-tensor": ("fp8-tensor", "fp8-tensor-other"), "follow-trainer": ("llama", "llama-other")}
BASE = dict(hidden_size=1024, intermediate_size=2048, num_hidden_layers=2, max_position_embeddings=512, initializer_range=0.2)


def make_models(work: Path) -> Dict[str, Path]:
    from transformers import AutoConfig, AutoModelForCausalLM

    out = {}

    def save(name: str, cfg, seed: int) -> Path:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
        model.config.torch_dtype = "bfloat16"
        model.save_pretrained(work / name)
        return work / name

    out["llama"] = save("llama", AutoConfig.for_model("llama", **BASE, num_attention_heads=8, num_key_value_heads=4, vocab_size=32016), 0)
    out["llama-other"] = save("llama-other", AutoConfig.for_model("llama", **BASE, num_attention_heads=8, num_key_value_heads=4, vocab_size=32016), 1)
    out["llama-hd64"] = save("llama-hd64", AutoConfig.for_model("llama", **BASE, num_attention_heads=16, num_key_value_heads=4, head_dim=64, vocab_size=32016), 2)
    out["moe"] = save("moe", AutoConfig.for_model("qwen3_moe", **BASE, num_attention_heads=8, num_key_value_heads=4, head_dim=128, vocab_size=32000, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=256, decoder_sparse_step=1), 3)
    out["fp8-block"] = quantize_fp8(out["llama"], work / "fp8-block", block=True)
    out["fp8-block-hd64"] = quantize_fp8(out["llama-hd64"], work / "fp8-block-hd64", block=True)
    out["fp8-tensor"] = quantize_fp8(out["llama"], work / "fp8-tensor", block=False)
    out["fp8-tensor-other"] = quantize_fp8(out["llama-other"], work / "fp8-tensor-other", block=False)
    return out


def digest(model: Path, socket_dir: str) -> str:
    """sha256 over every checkpoint-layout tensor the daemon holds, read through a copy attach."""
    exp = expected_fingerprint(str(model), 1, 0)
    client = WeightdClient(find_socket(global_rank=0, socket_dir=socket_dir))
    try:
        tensors = client.copy(exp.fingerprint, exp.fields, tensor_format="torch")
    finally:
        client.close()
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def generate(model: Path, load_format: str, extra: Dict[str, Any], utilization: float = 0.25, eager: bool = True) -> Dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    from vllm.inputs import TokensPrompt

    from weightd_client.vllm_plugin import WeightdModelLoader

    # What the plugin did (its source and reason), recorded as it loads: vLLM's logging set-up
    # replaces handlers on its loggers while the engine starts.
    loads: List[Any] = []
    served = WeightdModelLoader.load_weights

    def recorded(loader, model, model_config):
        served(loader, model, model_config)
        loads.append([loader.source, loader.reason])

    WeightdModelLoader.load_weights = recorded
    started = time.monotonic()
    llm = LLM(model=str(model), load_format=load_format, model_loader_extra_config=extra, skip_tokenizer_init=True, enforce_eager=eager,
              dtype="bfloat16", gpu_memory_utilization=utilization, max_model_len=512, attention_config={"backend": "TRITON_ATTN"}, seed=0)
    WeightdModelLoader.load_weights = served
    out = llm.generate([TokensPrompt(prompt_token_ids=PROMPT)], SamplingParams(max_tokens=12, temperature=0, detokenize=False, logprobs=5))
    seconds = time.monotonic() - started
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()
    o = out[0].outputs[0]
    return {"tokens": list(o.token_ids), "logprobs": [{str(t): lp.logprob for t, lp in step.items()} for step in o.logprobs], "seconds": round(seconds, 1), "loads": loads}


def follow(models: Dict[str, Path], base: str, other: str, graphs: bool, work: Path) -> Dict[str, Any]:
    """An engine mapped from the daemon follows ``other`` loaded under its name, in place, and
    back (vLLM's weight-transfer calls when this vLLM has them, else collective_rpc): each time
    the same greedy tokens and logprobs as a disk load of that version, the parameters at the
    same addresses; with ``graphs``, through captured CUDA graphs (no enforce_eager)."""
    from vllm import LLM, SamplingParams
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    from vllm.inputs import TokensPrompt

    from weightd_client.vllm_follow import switch_worker

    # The disk load runs as the engine under test does: captured graphs and torch.compile pick
    # other kernels than eager mode, so their logprobs differ in the last bits from an eager run's.
    want = {v: generate(models[v], "auto", {}, eager=not graphs) for v in (base, other)}
    fp = {v: expected_fingerprint(str(models[v]), 1, 0).fingerprint for v in (base, other)}
    r: Dict[str, Any] = {"disk": {v: want[v]["tokens"] for v in want}, "steps": [], "problems": []}
    daemon = Daemon(str(models[base]), DAEMON_ARGS, 300, device="cuda", socket_dir=str(work / f"s-follow-{base}-{int(graphs)}"))
    try:
        watcher = WeightdClient(find_socket(global_rank=0, socket_dir=daemon.socket_dir))
        watcher.watch(models[base].name)
        interface = True
        try:
            from vllm.config import WeightTransferConfig  # noqa: F401
        except ImportError:
            interface = False
        r["interface"] = "weight_transfer" if interface else "collective_rpc"
        llm = LLM(model=str(models[base]), load_format="weightd", model_loader_extra_config={"socket_dir": daemon.socket_dir}, skip_tokenizer_init=True, enforce_eager=not graphs,
                  dtype="bfloat16", gpu_memory_utilization=0.25, max_model_len=512, attention_config={"backend": "TRITON_ATTN"}, seed=0,
                  **({"weight_transfer_config": {"backend": "weightd"}} if interface else {}))
        params = lambda: llm.apply_model(lambda m: {n: p.data_ptr() for n, p in m.named_parameters()})[0]
        sample = SamplingParams(max_tokens=12, temperature=0, detokenize=False, logprobs=5)

        def check(version: str, step: str) -> None:
            o = llm.generate([TokensPrompt(prompt_token_ids=PROMPT)], sample)[0].outputs[0]
            got = {"tokens": list(o.token_ids), "logprobs": [{str(t): lp.logprob for t, lp in s.items()} for s in o.logprobs]}
            r["steps"].append({"step": step, "tokens": got["tokens"]})
            if got["tokens"] != want[version]["tokens"] or got["logprobs"] != want[version]["logprobs"]:
                r["problems"].append(f"{step}: tokens or logprobs differ from the disk load of {version}")

        check(base, "loaded")
        addresses = params()
        if interface:
            # From here on each version the daemon makes ready is prepared while the engine runs
            # (weightd_client/switch_ahead.py): the update only remaps.
            llm.init_weight_transfer_engine({"init_info": {}})
        for version in (other, base):
            ctl = subprocess.run(["node", "dist/main.js", "ctl", "--weight-cache-socket-dir", daemon.socket_dir, "load", "--model", str(models[version]), "--name", models[base].name,
                                  "--layouts", "checkpoint,vllm", "-tp", "1"], capture_output=True, text=True, timeout=300)
            if ctl.returncode != 0:
                raise RuntimeError(f"ctl load {version}: {ctl.stderr[-800:]}")
            heard: List[Dict[str, Any]] = []
            while not any(e["event"] == "model_ready" and e["fingerprint"] == fp[version] for e in heard):
                got = watcher.events(timeout=120.0)
                if not got:
                    raise RuntimeError(f"no model_ready for {version} (heard {heard})")
                heard += got
            prepared = None
            if interface:
                prepared = llm.apply_model(lambda m, f=fp[version]: m._weightd.ahead is not None and m._weightd.ahead.prepared(f, 120.0))[0]
                if not prepared:
                    r["problems"].append(f"switch to {version}: not prepared ahead within 120 s of model_ready")
            started = time.monotonic()
            if interface:
                llm.start_weight_update()
                llm.update_weights({"update_info": {"model": models[base].name}})
                llm.finish_weight_update()
            else:
                llm.collective_rpc(switch_worker, args=({"model": models[base].name},))
            llm.reset_prefix_cache()
            r["steps"].append({"step": f"switch to {version}", "seconds": round(time.monotonic() - started, 4), "preparedAhead": prepared})
            check(version, f"after switch to {version}")
            if params() != addresses:
                r["problems"].append(f"switch to {version}: a parameter's address changed")
        del llm
        gc.collect()
        cleanup_dist_env_and_memory()
        watcher.close()
    finally:
        daemon.stop()
    return r


def follow_trainer(models: Dict[str, Path], base: str, other: str, work: Path) -> Dict[str, Any]:
    """A trainer holding ``other``'s weights on the GPU writes them through the backend's
    trainer side (0.26: the static ``trainer_send_weights``; 0.32: the trainer engine), the
    engine follows: the disk load's tokens and logprobs of ``other``, at the same addresses. Then the
    base's weights sent by the engine's own (fused) names: the base's tokens again. Then a name no
    layout holds and a fused name of the wrong shape are refused, nothing committed."""
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    from vllm.inputs import TokensPrompt

    from weightd_client.protocol import WeightdError
    from weightd_client.vllm_transfer import WeightdWeightTransferEngine

    want = {v: generate(models[v], "auto", {}) for v in (base, other)}
    r: Dict[str, Any] = {"disk": {v: want[v]["tokens"] for v in want}, "steps": [], "problems": []}
    name = models[base].name
    daemon = Daemon(str(models[base]), DAEMON_ARGS, 300, device="cuda", socket_dir=str(work / "s-follow-trainer"))
    try:
        watcher = WeightdClient(find_socket(global_rank=0, socket_dir=daemon.socket_dir))
        served = lambda: sorted((v["version"], v.get("current")) for v in watcher.ping()["models"] if v["status"] == "serving")
        llm = LLM(model=str(models[base]), load_format="weightd", model_loader_extra_config={"socket_dir": daemon.socket_dir}, skip_tokenizer_init=True, enforce_eager=True,
                  dtype="bfloat16", gpu_memory_utilization=0.25, max_model_len=512, attention_config={"backend": "TRITON_ATTN"}, seed=0, weight_transfer_config={"backend": "weightd"})
        params = lambda: llm.apply_model(lambda m: {n: p.data_ptr() for n, p in m.named_parameters()})[0]
        sample = SamplingParams(max_tokens=12, temperature=0, detokenize=False, logprobs=5)

        def check(version: str, step: str) -> None:
            o = llm.generate([TokensPrompt(prompt_token_ids=PROMPT)], sample)[0].outputs[0]
            got = {"tokens": list(o.token_ids), "logprobs": [{str(t): lp.logprob for t, lp in s.items()} for s in o.logprobs]}
            r["steps"].append({"step": step, "tokens": got["tokens"]})
            if got["tokens"] != want[version]["tokens"] or got["logprobs"] != want[version]["logprobs"]:
                r["problems"].append(f"{step}: tokens or logprobs differ from the disk load of {version}")

        check(base, "loaded")
        addresses = params()
        # The base's weights as the engine holds them (fused qkv_proj, gate_up_proj): a trainer that
        # sends the engine's own names writes them back at the end.
        engine_named = llm.apply_model(lambda m: [(n, p.detach().clone()) for n, p in m.named_parameters()])[0]
        trainer = AutoModelForCausalLM.from_pretrained(str(models[other]), torch_dtype=torch.bfloat16).cuda()
        target = {"model": name, "socket_dir": daemon.socket_dir}
        torch.cuda.synchronize()
        started = time.monotonic()
        try:
            info = WeightdWeightTransferEngine.trainer_send_weights(iter(list(trainer.named_parameters())), target)
        except WeightdError as err:
            if err.code != "E_UPDATE_UNSUPPORTED":
                raise
            info, r["skipped"] = None, f"the daemon refuses cuda writers: {err}"
        if info is not None:
            r["steps"].append({"step": "trainer_send_weights", "seconds": round(time.monotonic() - started, 4), "update_info": info})
            started = time.monotonic()
            llm.start_weight_update()
            llm.update_weights({"update_info": info})
            llm.finish_weight_update()
            llm.reset_prefix_cache()
            r["steps"].append({"step": f"switch to {other}", "seconds": round(time.monotonic() - started, 4)})
            check(other, f"after the trainer wrote {other}")
            if params() != addresses:
                r["problems"].append("a parameter's address changed")
            started = time.monotonic()
            info = WeightdWeightTransferEngine.trainer_send_weights(iter(engine_named), target)
            r["steps"].append({"step": "trainer_send_weights by the engine's names", "seconds": round(time.monotonic() - started, 4), "update_info": info})
            llm.start_weight_update()
            llm.update_weights({"update_info": info})
            llm.finish_weight_update()
            llm.reset_prefix_cache()
            check(base, f"after the trainer wrote {base} by the engine's names")
            if params() != addresses:
                r["problems"].append("a parameter's address changed")
            before = served()
            for bad, code in (("model.layers.0.self_attn.no_such_proj.weight", "E_UNKNOWN_TENSOR"), ("model.layers.0.self_attn.qkv_proj.weight", "E_TENSOR_MISMATCH")):
                try:
                    WeightdWeightTransferEngine.trainer_send_weights(iter([(bad, torch.zeros(8, device="cuda"))]), target)
                    r["problems"].append(f"{bad} was written")
                except WeightdError as err:
                    r.setdefault("refused", []).append(str(err)[-300:])
                    if err.code != code or served() != before:
                        r["problems"].append(f"{bad}: refused as {err.code} (want {code}), versions {before} then {served()}")
        del llm, trainer
        gc.collect()
        cleanup_dist_env_and_memory()
        watcher.close()
    finally:
        daemon.stop()
    return r


def published(model: Path, work: Path) -> Dict[str, Any]:
    """The processed-layout case: three starts of one FP8 model against one daemon, with every
    Fp8LinearMethod processing counted and timed."""
    from vllm.model_executor.layers.quantization.fp8 import Fp8LinearMethod

    processing: List[float] = []
    original = Fp8LinearMethod.process_weights_after_loading

    def timed(method, layer):
        started = time.monotonic()
        try:
            return original(method, layer)
        finally:
            torch.cuda.synchronize()
            processing.append(time.monotonic() - started)

    out: Dict[str, Any] = {"problems": []}
    disk = generate(model, "auto", {})
    out["disk"] = {k: disk[k] for k in ("tokens", "seconds")}
    daemon = Daemon(str(model), DAEMON_ARGS, 300, device="cuda", socket_dir=str(work / "s-published"))
    try:
        before = digest(model, daemon.socket_dir)
        Fp8LinearMethod.process_weights_after_loading = timed
        try:
            for run in ("first", "second", "third"):
                processing.clear()
                got = generate(model, "weightd", {"socket_dir": daemon.socket_dir})
                out[run] = {"tokens_equal": got["tokens"] == disk["tokens"] and got["logprobs"] == disk["logprobs"], "seconds": got["seconds"], "loads": got["loads"],
                            "layers_processed": len(processing), "processing_seconds": round(sum(processing), 4)}
                if not out[run]["tokens_equal"]:
                    out["problems"].append(f"{run} start: tokens or logprobs differ from the disk load")
                if [src for src, _ in got["loads"]] != ["weightd"]:
                    out["problems"].append(f"{run} start: not served by the daemon: {got['loads']}")
        finally:
            Fp8LinearMethod.process_weights_after_loading = original
        if out["first"]["layers_processed"] == 0:
            out["problems"].append("the first start processed no layer: nothing to publish")
        for run in ("second", "third"):
            if out[run]["layers_processed"] != 0 or "their processing skipped" not in str(out[run]["loads"]):
                out["problems"].append(f"{run} start processed {out[run]['layers_processed']} layers: the published layout was not mapped ({out[run]['loads']})")
        out["restart_seconds_saved"] = round(out["first"]["seconds"] - (out["second"]["seconds"] + out["third"]["seconds"]) / 2, 2)
        out["digest_unchanged"] = digest(model, daemon.socket_dir) == before
        if not out["digest_unchanged"]:
            out["problems"].append("the daemon's version changed while engines ran")
    finally:
        daemon.stop()
        out["daemon_log"] = [line for line in daemon.stderr_lines if "publish" in line or "processed" in line][-20:]
    return out


def write_probe(model: Path, socket_dir: str) -> Dict[str, Any]:
    """A child process maps the daemon's memory and writes into a weight; it must fail there."""
    code = (
        "import sys, torch\n"
        "from weightd_client import WeightdClient, expected_fingerprint, find_socket\n"
        f"exp = expected_fingerprint({str(model)!r}, 1, 0)\n"
        f"c = WeightdClient(find_socket(global_rank=0, socket_dir={socket_dir!r}))\n"
        "got = c.attach(exp.fingerprint, exp.fields, tensor_format='torch')\n"
        "t = got.tensors['model.embed_tokens.weight']\n"
        "print('read_only', got._mapping.read_only, flush=True)\n"
        "t.add_(1); torch.cuda.synchronize(); print('WROTE', flush=True)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return {"rc": r.returncode, "wrote": "WROTE" in r.stdout, "stdout": r.stdout[-400:], "stderr": r.stderr[-800:]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default=",".join(SUITE), help=f"comma-separated, of {','.join(SUITE)}")
    args = ap.parse_args()
    wanted = args.models.split(",")
    unknown = sorted(set(wanted) - set(SUITE))
    if unknown:
        ap.error(f"--models: {unknown} are not among {list(SUITE)}")
    import vllm

    results: Dict[str, Any] = {"vllm": vllm.__version__, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "models": {}, "failures": []}
    work = Path(tempfile.mkdtemp(prefix="wv-gpu-"))
    fail = results["failures"].append
    try:
        models = make_models(work)
        for name in [m for m in wanted if m in FOLLOW]:
            try:
                got = results["models"][name] = follow_trainer(models, *FOLLOW[name], work) if name == "follow-trainer" else follow(models, *FOLLOW[name], name == "follow-graphs", work)
                for problem in got["problems"]:
                    fail(f"{name}: {problem}")
            except Exception:
                results["models"][name] = {"error": traceback.format_exc()[-3000:]}
                fail(f"{name}: {results['models'][name]['error'].splitlines()[-1]}")
        if "fp8-tensor-published" in wanted:
            try:
                got = results["models"]["fp8-tensor-published"] = published(models["fp8-tensor"], work)
                for problem in got["problems"]:
                    fail(f"fp8-tensor-published: {problem}")
            except Exception:
                results["models"]["fp8-tensor-published"] = {"error": traceback.format_exc()[-3000:]}
                fail(f"fp8-tensor-published: {results['models']['fp8-tensor-published']['error'].splitlines()[-1]}")
        for name in [m for m in wanted if m not in ("fallbacks", "fp8-tensor-published") and m not in FOLLOW]:
            r: Dict[str, Any] = results["models"].setdefault(name, {})
            try:
                disk = generate(models[name], "auto", {})
                r["disk"] = disk
                daemon = Daemon(str(models[name]), DAEMON_ARGS, 300, device="cuda", socket_dir=str(work / f"s-{name}"))
                try:
                    before = digest(models[name], daemon.socket_dir)
                    # Copy mode once per architecture; each FP8 form maps twice (a restart).
                    for run in ("map", "map-restart", "copy") if name in ("llama", "moe") else ("map", "map-restart"):
                        got = generate(models[name], "weightd", {"socket_dir": daemon.socket_dir, "mode": run.split("-")[0]})
                        r[run] = {k: got[k] for k in ("tokens", "seconds", "loads")}
                        if [src for src, _ in got["loads"]] != ["weightd"]:
                            fail(f"{name} {run}: not served by the daemon: {got['loads']}")
                        if got["tokens"] != disk["tokens"] or got["logprobs"] != disk["logprobs"]:
                            fail(f"{name} {run}: tokens or logprobs differ from the disk load")
                    after = digest(models[name], daemon.socket_dir)
                    r["digest_unchanged"] = before == after
                    if before != after:
                        fail(f"{name}: the daemon's memory changed while engines ran")
                    if name == "llama":
                        # KV-cache sizing with the daemon's memory on the device: vLLM 0.26 has
                        # no get_external_weight_memory, so this shows whether 0.9 still starts.
                        try:
                            r["map-util-0.9"] = {k: v for k, v in generate(models[name], "weightd", {"socket_dir": daemon.socket_dir}, 0.9).items() if k in ("tokens", "seconds", "loads")}
                        except Exception:
                            r["map-util-0.9"] = {"error": traceback.format_exc()[-2000:]}
                            fail("llama: map mode at gpu_memory_utilization 0.9 did not start")
                        probe = write_probe(models[name], daemon.socket_dir)
                        r["write_probe"] = probe
                        if probe["wrote"] or digest(models[name], daemon.socket_dir) != before:
                            fail("a write into a mapped weight went through")
                finally:
                    daemon.stop()
                    r["daemon_log"] = [line for line in daemon.stderr_lines if "layout" in line or "warn" in line][-20:]
            except Exception:
                r["error"] = traceback.format_exc()[-3000:]
                fail(f"{name}: {r['error'].splitlines()[-1]}")
        if "fallbacks" not in wanted:
            return 1 if results["failures"] else 0
        # Fallbacks: no daemon; a daemon serving other bytes of the same shapes.
        r = results["models"].setdefault("fallbacks", {})
        disk = results["models"].get("llama", {}).get("disk") or generate(models["llama"], "auto", {})
        nodaemon = generate(models["llama"], "weightd", {"socket_dir": str(work / "no-daemon")})
        r["no_daemon"] = nodaemon["loads"]
        r["no_daemon_same_tokens"] = disk is not None and nodaemon["tokens"] == disk["tokens"]
        other = Daemon(str(models["llama-other"]), DAEMON_ARGS, 300, device="cuda", socket_dir=str(work / "s-other"))
        try:
            content = generate(models["llama"], "weightd", {"socket_dir": other.socket_dir})
        finally:
            other.stop()
        r["other_content"] = content["loads"]
        r["other_content_same_tokens"] = disk is not None and content["tokens"] == disk["tokens"] and [x for x, _ in content["loads"] + nodaemon["loads"]] == ["disk", "disk"]
        if not (r["no_daemon_same_tokens"] and r["other_content_same_tokens"]):
            fail("a fallback's tokens differ from the disk load")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
        print(json.dumps({"failures": results["failures"]}, indent=1))
    return 1 if results["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
