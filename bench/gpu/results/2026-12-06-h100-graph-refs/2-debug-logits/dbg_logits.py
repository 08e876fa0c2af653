"""Debug: why a graph over the daemon's memory gives seed 1's disk logits exactly but not seed 0's."""
import sys, json, tempfile
from pathlib import Path
sys.path.insert(0, "test/gpu"); sys.path.insert(0, "clients/python")
import torch, transformers
from safetensors.torch import load_file
from llama_graph import PROMPT, capture, disk_logits, meta_llama, start_daemon, stop_daemon, write_checkpoint, ATTENTION
from weightd_client import load_into
work = Path(tempfile.mkdtemp(dir="/var/tmp"))
vs = {s: work / f"v{s}" for s in (0, 1, 2)}
for s, p in vs.items(): write_checkpoint(torch, transformers, p, s, int(sys.argv[1]), int(sys.argv[2]))
prompt = torch.tensor(PROMPT, device="cuda:0")
def mx(a, b): return float((a.float() - b.float()).abs().max())
out = {}
for s, p in vs.items():
    m = transformers.LlamaForCausalLM.from_pretrained(str(p), torch_dtype=torch.bfloat16, attn_implementation=ATTENTION).to("cuda:0").eval()
    files = {}
    for f in p.glob("*.safetensors"): files.update(load_file(str(f), device="cuda:0"))
    bad = [n for n, t in m.state_dict().items() if n in files and not torch.equal(t, files[n])]
    missing = [n for n in m.state_dict() if n not in files]
    bufs = {n: (str(b.dtype), b.flatten()[:3].tolist()) for n, b in m.named_buffers()}
    with torch.no_grad():
        l1 = m(prompt, use_cache=False).logits; l2 = m(prompt, use_cache=False).logits
    out[s] = {"paramsDiffer": bad, "notInFiles": missing, "buffers": bufs, "eagerRepeatDiff": mx(l1, l2), "logitsAbsMax": float(l1.float().abs().max())}
    # the same model, its forward in a graph
    rep = capture(torch, m, prompt)
    out[s]["graphVsEager"] = mx(rep(), l1)
    del m, rep; torch.cuda.empty_cache()
print(json.dumps(out, indent=1))
# The engine's path: the daemon serving seed 0, a meta model mapped onto its memory.
sock = work / "s"; sock.mkdir(mode=0o700)
daemon = start_daemon(["--model", str(vs[0]), "-tp", "1", "--device", "cuda", "--cuda-handles", "fd", "--weight-cache-socket-dir", str(sock)], work / "d.log")
try:
    disk = transformers.LlamaForCausalLM.from_pretrained(str(vs[0]), torch_dtype=torch.bfloat16, attn_implementation=ATTENTION).to("cuda:0").eval()
    config = transformers.AutoConfig.from_pretrained(str(vs[0]))
    model = meta_llama(torch, transformers, config)
    loaded = load_into(model, str(vs[0]), socket_dir=str(sock), device=0)
    model.eval()
    dsd = disk.state_dict()
    e = {"source": loaded.source, "reason": loaded.reason}
    e["paramsDiffer"] = [n for n, t in model.state_dict().items() if n in dsd and not torch.equal(t, dsd[n])]
    e["onlyEngine"] = [n for n in model.state_dict() if n not in dsd]
    e["onlyDisk"] = [n for n in dsd if n not in model.state_dict()]
    e["engineBuffers"] = {n: (str(b.dtype), str(b.device), b.flatten()[:3].tolist()) for n, b in model.named_buffers()}
    e["diskBuffers"] = {n: (str(b.dtype), str(b.device), b.flatten()[:3].tolist()) for n, b in disk.named_buffers()}
    e["bufDiff"] = {n: mx(b, dict(disk.named_buffers())[n]) for n, b in model.named_buffers() if n in dict(disk.named_buffers())}
    e["configDiff"] = {k: [str(getattr(model.config, k, None)), str(getattr(disk.config, k, None))] for k in set(model.config.to_dict()) | set(disk.config.to_dict()) if str(model.config.to_dict().get(k)) != str(disk.config.to_dict().get(k))}
    with torch.no_grad():
        le = model(prompt, use_cache=False).logits; ld = disk(prompt, use_cache=False).logits
    e["engineEagerVsDiskEager"] = mx(le, ld)
    rep = capture(torch, model, prompt)
    e["engineGraphVsDiskEager"] = mx(rep(), ld)
    e["engineGraphVsEngineEager"] = mx(rep(), le)
    with torch.no_grad():
        e["engineEagerAfterCapture"] = mx(model(prompt, use_cache=False).logits, ld)
        e["diskEagerAgain"] = mx(disk(prompt, use_cache=False).logits, ld)
    ref = disk_logits(torch, transformers, vs[0], prompt)
    e["diskLogitsHelperVsDiskEager"] = mx(ref, ld)
    e["engineGraphVsDiskLogitsHelper"] = mx(rep(), ref)
    print(json.dumps(e, indent=1))
finally:
    stop_daemon(daemon)
