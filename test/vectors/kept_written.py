"""Writes test/vectors/kept-written.json: docs/spec/kept-written.md §2 computed with Python's hashlib and
json, apart from src/keeper/writtenIdentity.ts. Run: python3 test/vectors/kept_written.py > test/vectors/kept-written.json"""
import hashlib
import json

def digest(ranks):
    texts = []
    for r in ranks:
        if r is None:
            texts.append(None); continue
        tensors = [[t["name"], t["dtype"], t["shape"], t["segment"], t["offset"], t["bytes"]] for t in r["tensors"]]
        aliases = sorted(r["aliases"].items(), key=lambda kv: kv[0].encode("utf-16-be"))
        texts.append(json.dumps([tensors, [list(a) for a in aliases]], separators=(",", ":"), ensure_ascii=False))
    rank = ["" if t is None else hashlib.sha256(t.encode("utf-8")).hexdigest() for t in texts]
    return hashlib.sha256("\n".join(rank).encode("utf-8")).hexdigest(), texts, rank

t = lambda name, dtype, shape, seg, off, b: {"name": name, "dtype": dtype, "shape": shape, "segment": seg, "offset": off, "bytes": b}
one = [{"tensors": [t("model.embed_tokens.weight", "BF16", [512, 256], 0, 0, 262144), t("model.layers.0.self_attn.q_proj.weight", "BF16", [256, 256], 0, 262144, 131072), t("model.layers.0.self_attn.o_proj.weight", "BF16", [256, 256], 1, 0, 131072), t("model.norm.weight", "F32", [256], 1, 131072, 1024)], "aliases": {"lm_head.weight": "model.embed_tokens.weight"}}]
swapped = [{"tensors": [dict(x, name={"model.layers.0.self_attn.q_proj.weight": "model.layers.0.self_attn.o_proj.weight", "model.layers.0.self_attn.o_proj.weight": "model.layers.0.self_attn.q_proj.weight"}.get(x["name"], x["name"])) for x in one[0]["tensors"]], "aliases": one[0]["aliases"]}]
two = [{"tensors": [t("model.layers.0.mlp.down_proj.weight", "BF16", [256, 344], 0, 0, 176128), t("poids.ä€😀", "F8_E4M3", [3], 0, 176128, 3)], "aliases": {"zz": "poids.ä€😀", "\uff61": "poids.ä€😀", "\U0001f600": "poids.ä€😀", "a": "poids.ä€😀"}},
       {"tensors": [t("model.layers.0.mlp.down_proj.weight", "BF16", [256, 344], 0, 0, 176128)], "aliases": {}}]
cases = []
for desc, ranks in [("one rank, an alias", one), ("the same with two names swapped (nothing moved): another digest", swapped), ("two ranks; non-ASCII names; aliases sorted by UTF-16 code units (U+1F600's surrogates sort before U+FF61)", two), ("a rank this node does not plan is null", [None, two[1]])]:
    d, texts, rank = digest(ranks)
    cases.append({"description": desc, "ranks": ranks, "expected": {"rankJson": texts, "rankManifests": rank, "manifest": d}})
out = {"description": "docs/spec/kept-written.md §2: a written version's manifest digest, from each tp rank's tensors and aliases (computed apart from src/keeper/writtenIdentity.ts, with Python's hashlib and json).", "cases": cases}
print(json.dumps(out, indent=2, ensure_ascii=False))
