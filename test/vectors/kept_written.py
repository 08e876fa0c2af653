"""Writes test/vectors/kept-written.json: docs/spec/kept-written.md §2 computed with Python's hashlib and
json, and §3.1 on real trees of directories and symbolic links with os.path.realpath, apart from
src/keeper/writtenIdentity.ts. Run: python3 test/vectors/kept_written.py > test/vectors/kept-written.json"""
import hashlib
import json
import os
import tempfile

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

def directory_case(desc, dirs, links, commit, restart, repoint=None):
    """§3.1 on a real tree, with os.path.realpath: the path a commit records, and whether a restart that names `restart` (after `repoint`) plans the same directory."""
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.realpath(tmp)
        for d in dirs:
            os.makedirs(os.path.join(root, d))
        for name, target in links.items():
            os.symlink(target, os.path.join(root, name))
        recorded = os.path.realpath(os.path.join(root, commit))
        for name, target in (repoint or {}).items():
            os.remove(os.path.join(root, name))
            os.symlink(target, os.path.join(root, name))
        same = os.path.realpath(recorded) == os.path.realpath(os.path.join(root, restart))
        case = {"description": desc, "dirs": dirs, "links": links, "commit": commit, "restart": restart}
        if repoint:
            case["repoint"] = repoint
        case["expected"] = {"recorded": os.path.relpath(recorded, root), "same": same}
        return case

directories = [
    directory_case("the directory by its own path, both times", ["ckpt/v1"], {}, "ckpt/v1", "ckpt/v1"),
    directory_case("named through a symbolic link at the commit, by its own path at the restart", ["ckpt/v1"], {"cur": "ckpt/v1"}, "cur", "ckpt/v1"),
    directory_case("by its own path at the commit, through a link at the restart", ["ckpt/v1"], {"cur": "ckpt/v1"}, "ckpt/v1", "cur"),
    directory_case("a link repointed to another checkout between the commit and the restart", ["ckpt/v1", "ckpt/v2"], {"cur": "ckpt/v1"}, "cur", "cur", {"cur": "ckpt/v2"}),
    directory_case("a link to a parent directory, and a relative link beside the checkout", ["ckpt/v1"], {"models": "ckpt", "ckpt/cur": "v1"}, "models/v1", "ckpt/cur"),
    directory_case("another directory, even a copy", ["ckpt/v1", "ckpt/v2"], {}, "ckpt/v1", "ckpt/v2"),
]
out = {"description": "docs/spec/kept-written.md: §2, a written version's manifest digest, from each tp rank's tensors and aliases; §3.1, the directory a written version's record names and whether a restart plans the same (computed apart from src/keeper/writtenIdentity.ts, with Python's hashlib, json and os.path.realpath).", "cases": cases, "directories": directories}
print(json.dumps(out, indent=2, ensure_ascii=False))
