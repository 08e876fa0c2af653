"""An engine restart on the H200 with CUDA graphs on: disk against weightd (issue 30, "the number
users care about"). Run by bench/gpu/vllm-restart.sh, which stages vLLM and the client first.

  python3 bench/gpu/vllm_restart.py all --out DIR [--layers 16]
      writes a Llama-shaped bf16 checkpoint (hidden 4096, 14336, random weights; 19 layers make
      8.8 GB, 16 made the 7.5 GB of the first runs), then times fresh engine processes, each from
      its process start to its first generated token: disk with an empty compile cache, then,
      against a daemon started on the same checkpoint, weightd in map mode and disk (compile cache
      warm) in turn, twice each, so that neither mode always runs first. Each start's
      split comes from vLLM's own log lines: weights, torch.compile, CUDA graph capture, the whole
      engine init. Results: DIR/vllm-restart.json, DIR/engine-<run>.log, DIR/daemon.log.
  python3 bench/gpu/vllm_restart.py one --model DIR --mode disk|map [--socket-dir S]
      one engine start (what `all` runs in each child process); prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python" / "tests"))

PROMPT = [1, 2, 3, 4, 5, 77, 301, 499]
# vLLM 0.26's log lines that split an engine start (each is printed once per start).
SPLITS = {
    "weights_s": r"Model loading took [\d.]+ GiB (?:memory )?and ([\d.]+) seconds",
    "compile_s": r"torch\.compile took ([\d.]+) s in total",
    "warmup_s": r"Initial profiling/warmup run took ([\d.]+) s",
    "graphs_s": r"Graph capturing finished in ([\d.]+) secs",
    "engine_init_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
}


def one(model: str, mode: str, socket_dir: str | None) -> None:
    t0 = time.time()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    extra = {"socket_dir": socket_dir, "mode": "map"} if mode == "map" else {}
    imported = time.time()
    llm = LLM(model=model, load_format="weightd" if mode == "map" else "auto", model_loader_extra_config=extra, skip_tokenizer_init=True,
              dtype="bfloat16", gpu_memory_utilization=0.6, max_model_len=2048, seed=0)
    built = time.time()
    out = llm.generate([TokensPrompt(prompt_token_ids=PROMPT)], SamplingParams(max_tokens=1, temperature=0, detokenize=False))
    first = time.time()
    print(json.dumps({"token": list(out[0].outputs[0].token_ids), "import_s": imported - t0, "llm_s": built - imported, "first_token_s": first - built, "in_process_s": first - t0, "end": first}), flush=True)


def make_checkpoint(path: Path, layers: int) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers, num_attention_heads=32,
                               num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096, initializer_range=0.02)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    model.config.torch_dtype = "bfloat16"
    model.save_pretrained(path, max_shard_size="2GB")
    del model
    torch.cuda.empty_cache()


def start(out: Path, run: str, model: Path, mode: str, socket_dir: str | None) -> dict:
    log = out / f"engine-{run}.log"
    t0 = time.time()
    cmd = [sys.executable, __file__, "one", "--model", str(model), "--mode", mode] + (["--socket-dir", socket_dir] if socket_dir else [])
    # vLLM logs to stdout, beside the child's one JSON line: both go to the log.
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    log.write_text(p.stdout)
    text = p.stdout
    res = {"run": run, "mode": mode, "rc": p.returncode}
    lines = [l for l in p.stdout.splitlines() if l.startswith('{"token"')]
    if p.returncode == 0 and lines:
        child = json.loads(lines[-1])
        res.update({k: round(v, 2) if isinstance(v, float) else v for k, v in child.items() if k != "end"})
        res["process_start_to_first_token_s"] = round(child["end"] - t0, 2)
    for key, pattern in SPLITS.items():
        m = re.findall(pattern, text)
        res[key] = float(m[-1]) if m else None
    res["served_by"] = "weightd" if re.search(r"weightd: mapped \d+ parameters", text) else "disk"
    print(json.dumps(res), flush=True)
    return res


def all_runs(out: Path, layers: int) -> None:
    from daemon_fixture import Daemon

    out.mkdir(parents=True, exist_ok=True)
    work = Path("/var/tmp/weightd-vllm-restart")
    model = work / f"llama-{layers}l"
    results: dict = {"runs": []}

    def save() -> None:
        # After every step: the call's time limit may end the run before the last one.
        (out / "vllm-restart.json").write_text(json.dumps(results, indent=1))

    t = time.time()
    if not (model / "config.json").exists():
        make_checkpoint(model, layers)
    results["checkpoint"] = {"dir": str(model), "bytes": sum(f.stat().st_size for f in model.glob("*.safetensors")), "made_s": round(time.time() - t, 1)}
    subprocess.run(["cat"] + [str(f) for f in model.glob("*.safetensors")], stdout=subprocess.DEVNULL, check=True)
    cache = Path(os.path.expanduser("~/.cache/vllm"))
    subprocess.run(["rm", "-rf", str(cache)], check=True)
    save()
    results["runs"].append(start(out, "disk-cold-compile", model, "disk", None))
    save()
    t = time.time()
    daemon = Daemon(str(model), ["--layouts", "checkpoint,vllm", "--cuda-handles", "fd"], 300, tp=1, device="cuda", socket_dir=str(work / "s"))
    results["daemon_ready_s"] = round(time.time() - t, 2)
    try:
        for run, mode in (("weightd-map", "map"), ("disk", "disk"), ("weightd-map-again", "map"), ("disk-again", "disk")):
            results["runs"].append(start(out, run, model, mode, str(daemon.socket_dir) if mode == "map" else None))
            save()
    finally:
        (out / "daemon.log").write_text(daemon.stderr)
        daemon.stop()
    tokens = {json.dumps(r.get("token")) for r in results["runs"]}
    results["same_first_token"] = len(tokens) == 1
    save()
    print(json.dumps({k: v for k, v in results.items() if k != "runs"}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("all")
    a.add_argument("--out", required=True)
    a.add_argument("--layers", type=int, default=19)
    o = sub.add_parser("one")
    o.add_argument("--model", required=True)
    o.add_argument("--mode", choices=["disk", "map"], required=True)
    o.add_argument("--socket-dir")
    args = ap.parse_args()
    if args.cmd == "all":
        all_runs(Path(args.out), args.layers)
    else:
        one(args.model, args.mode, args.socket_dir)


if __name__ == "__main__":
    main()
