"""What the GPU scripts that follow a model's versions under a captured CUDA graph share
(switch_graph.py, update_cuda.py): Llama checkpoints of one config, a daemon started and waited
for, a version's disk logits, and one forward captured in a graph that replays over whatever
memory the parameters map."""
from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, List

ROOT = Path(__file__).resolve().parents[2]
READY_RE = re.compile(r"READY")
# sdpa, not eager: transformers' eager mask makes a CUDA scalar from a Python float
# (torch.tensor(0.0, device=...)), a pageable host-to-device copy that graph capture refuses (the
# 2026-12-05 H200 run failed so). Disk and graph use the same one.
ATTENTION = "sdpa"
PROMPT = [[1, 17, 42, 99, 3, 64, 5, 11, 200, 31]]


def write_checkpoint(torch: Any, transformers: Any, path: Path, seed: int, layers: int, hidden: int) -> None:
    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
        num_attention_heads=hidden // 128, num_key_value_heads=hidden // 128 // 4 or 1, max_position_embeddings=512, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    with torch.device("cuda:0"):
        model = transformers.LlamaForCausalLM(config)
    model.to(torch.bfloat16).to("cpu").save_pretrained(str(path), max_shard_size="1GB")


def start_daemon(args: List[str], log_path: Path, timeout: float = 300) -> subprocess.Popen:
    """`node dist/main.js ARGS`, its output in log_path; returns once it logs READY (raises
    RuntimeError with the log's tail if it exits or takes longer than `timeout` seconds)."""
    with open(log_path, "w") as log:
        daemon = subprocess.Popen(["node", str(ROOT / "dist/main.js"), *args], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + timeout
    while not READY_RE.search(log_path.read_text()):
        if daemon.poll() is not None or time.monotonic() > deadline:
            stop_daemon(daemon)
            raise RuntimeError(f"the daemon did not become ready (exit {daemon.poll()}): {log_path.read_text()[-2000:]}")
        time.sleep(0.2)
    return daemon


def stop_daemon(daemon: subprocess.Popen) -> int:
    """SIGTERM, then SIGKILL after 60 s; the exit status."""
    if daemon.poll() is None:
        daemon.send_signal(signal.SIGTERM)
        try:
            return daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
    return daemon.wait()


def meta_llama(torch: Any, transformers: Any, config: Any) -> Any:
    """A Llama on the meta device as from_pretrained builds one: bf16 parameters, float32 rotary
    frequencies. ``LlamaForCausalLM(config).to(torch.bfloat16)`` would cast the frequencies to
    bf16 too, and its logits would differ from the disk model's in every replay (the 2026-12-06
    H100 run failed so, at version 0, before any update)."""
    config._attn_implementation = ATTENTION
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def disk_logits(torch: Any, transformers: Any, path: Path, prompt: Any, edit: Callable[[Any], None] = lambda m: None) -> Any:
    """The logits of the checkpoint at `path` loaded from disk (after `edit(model)`), from one
    forward captured in a CUDA graph and replayed, as the engine's are. An eager forward is not the
    same computation: on the H100 (2026-12-06, torch 2.11) a disk model's replayed graph differed
    from its own eager forward for two of three random Llamas at 8 layers x 2048 (max 0.03 in the
    logits; equal at 2 x 1024), while a model mapped onto the daemon's memory gave exactly the disk
    model's logits, eager against eager and graph against graph."""
    m = transformers.LlamaForCausalLM.from_pretrained(str(path), torch_dtype=torch.bfloat16, attn_implementation=ATTENTION).to("cuda:0").eval()
    edit(m)
    replay = capture(torch, m, prompt)
    out = replay()
    del replay, m
    torch.cuda.empty_cache()
    return out


def capture(torch: Any, model: Any, prompt: Any) -> Callable[[], Any]:
    """One forward of `model` captured in a CUDA graph (after three warm-up runs on a side
    stream); returns replay(), which runs the graph and gives a copy of its logits."""
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(prompt, use_cache=False)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = model(prompt, use_cache=False).logits

    def replay() -> Any:
        graph.replay()
        torch.cuda.synchronize()
        return static_out.clone()

    replay.graph = graph  # type: ignore[attr-defined]  # kept alive with the function
    return replay
