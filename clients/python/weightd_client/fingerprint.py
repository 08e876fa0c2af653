"""The fingerprint weightd reports for a rank, computed in pure Python from the checkpoint on disk.

An engine compares it with the daemon's before it maps the cache: only a cache of exactly these
weights, sharded this way, for this rank, is used. docs/spec/fingerprint.md in the weightd
repository is the rule, byte for byte; the TypeScript daemon implements the same rule
(src/checkpoint/fingerprint.ts, sampleContent.ts), and the shared vectors in
test/vectors/fingerprint hold the two together.

This module reads only what the fingerprint covers. It checks what it needs to read the files
safely (header bounds, tensors tiling the data, file sizes) but not every rule the daemon
enforces: a checkpoint the daemon refuses is never served, so it cannot match.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = [
    "BUILTIN_RULES",
    "FINGERPRINT_PROTOCOL_VERSION",
    "FULL_FINGERPRINT_PROTOCOL_VERSION",
    "PIECE_BYTES",
    "LAYOUTS",
    "ExpectedFingerprint",
    "FingerprintError",
    "expected_fingerprint",
    "sample_ranges",
    "tensor_digests",
]

#: src/checkpoint/fingerprint.ts PROTOCOL_VERSION: the daemon release's fingerprint meaning.
FINGERPRINT_PROTOCOL_VERSION = 2
#: src/checkpoint/fingerprint.ts FULL_PROTOCOL_VERSION: the full-content fingerprint (``full=True``).
FULL_FINGERPRINT_PROTOCOL_VERSION = 3
#: A tensor's full digest hashes its bytes in pieces of this size (docs/spec/fingerprint.md §8).
PIECE_BYTES = 1 << 20
#: src/checkpoint/fingerprint.ts BUILTIN_RULES: the daemon's built-in sharding rules, versioned.
BUILTIN_RULES = "weightd-rules@2"
#: The layouts this client can compute a fingerprint for.
LAYOUTS = ("checkpoint",)

SAMPLE_EDGE_BYTES = 128
SAMPLE_BLOCK_BYTES = 4096
SAMPLE_BLOCK_BUDGET = 4096
SAMPLE_WHOLE_LIMIT = SAMPLE_BLOCK_BUDGET * SAMPLE_BLOCK_BYTES

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MAX_HEADER_BYTES = 100_000_000
_SAFE_INTEGER = 2**53 - 1
# Reads of ranges this close together are merged; only the number of reads matters in the page cache.
_MERGE_GAP_BYTES = 4096


class FingerprintError(ValueError):
    """The checkpoint cannot be fingerprinted (missing, truncated or malformed files, bad arguments)."""


@dataclass(frozen=True)
class ExpectedFingerprint:
    """What rank ``tp_rank`` of the daemon reports: pass both to ``WeightdClient.attach``."""

    fingerprint: str
    fields: Dict[str, str]
    #: The checkpoint's fingerprint, the same on every rank (what nodes compare at rendezvous).
    checkpoint_fingerprint: str


def _sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _js_int(text: str) -> Any:
    # JavaScript reads every JSON number as a double; an integer beyond 2^53 must round the same way.
    value = int(text)
    return value if abs(value) <= _SAFE_INTEGER else float(text)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _load_json(path: str, what: str) -> Any:
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise FingerprintError(f"{path}: cannot read the {what} ({err})") from err
    try:
        return json.loads(text, parse_int=_js_int, parse_constant=_reject_constant)
    except ValueError as err:
        raise FingerprintError(f"{path}: the {what} is not valid JSON ({err})") from err


def _require(module: str) -> Any:
    # Imported on first use, so that attaching with a fingerprint the engine already has (or got
    # from `weightd fingerprint`) works where these packages are not installed.
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"expected_fingerprint needs the {module!r} package: pip install ./clients/python (or pip install {module})") from err


def _canonical(value: Any) -> bytes:
    return _require("rfc8785").dumps(value)


def _utf16_key(s: str) -> bytes:
    # JavaScript sorts strings by UTF-16 code units; Python by code points. They differ past U+FFFF.
    return s.encode("utf-16-be")


def _weight_files(model_dir: str) -> List[str]:
    index = os.path.join(model_dir, INDEX_FILE)
    if os.path.isfile(index):
        data = _load_json(index, "checkpoint index")
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise FingerprintError(f'{index}: an index needs "weight_map": {{tensor name: file name}}')
        files = sorted(set(weight_map.values()), key=_utf16_key)
        for name in files:
            # The index is data from the internet: it must not point outside the model directory.
            if name != name.strip() or "/" in name or "\\" in name or not name.endswith(".safetensors"):
                raise FingerprintError(f'{index}: "{name}" is not a plain .safetensors file name in the model directory; the index may only name files next to it')
        return files
    if os.path.isfile(os.path.join(model_dir, SINGLE_FILE)):
        return [SINGLE_FILE]
    raise FingerprintError(f"{model_dir}: neither {INDEX_FILE} nor {SINGLE_FILE} is here; point at a Hugging Face model directory with safetensors weights")


@dataclass
class _Shard:
    path: str
    header_sha256: str
    #: Absolute [begin, end) of each tensor, in data order.
    spans: List[Tuple[int, int]]
    dtypes: List[str]
    names: List[str]


def _read_shard(path: str) -> _Shard:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(8)
            if len(prefix) < 8:
                raise FingerprintError(f"{path}: the file is {size} bytes; a safetensors file starts with an 8-byte header length: it is truncated, download it again")
            (n,) = struct.unpack("<Q", prefix)
            if n > MAX_HEADER_BYTES or n + 8 > size:
                raise FingerprintError(f"{path}: the header length field says {n} bytes, but the file has {size - 8} after it (limit {MAX_HEADER_BYTES}): the file is truncated or corrupt")
            header = f.read(n)
    except OSError as err:
        raise FingerprintError(f"{path}: cannot read ({err})") from err
    if len(header) != n:
        raise FingerprintError(f"{path}: the file ended while reading its header; it changed while being read")
    try:
        # Plain integers: offsets past 2^53 describe no real file, and the daemon refuses them.
        entries = json.loads(header.decode("utf-8"), parse_constant=_reject_constant)
    except ValueError as err:
        raise FingerprintError(f"{path}: the header is not valid UTF-8 JSON ({err})") from err
    if not isinstance(entries, dict):
        raise FingerprintError(f"{path}: the header is not a JSON object")
    data_start = 8 + n
    tensors = []
    for name, entry in entries.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = entry["data_offsets"]
            if type(begin) is not int or type(end) is not int or begin < 0:
                raise TypeError
        except (TypeError, ValueError, KeyError):
            raise FingerprintError(f'{path}: tensor "{name}": its entry {entry!r} has no [begin, end] data_offsets pair') from None
        tensors.append((begin, end, str(entry.get("dtype")), name))
    tensors.sort()
    cursor = 0
    for begin, end, _, _ in tensors:
        if begin != cursor or end < begin:
            raise FingerprintError(f"{path}: data_offsets [{begin}, {end}] do not tile the data section (previous tensor ends at {cursor})")
        cursor = end
    if data_start + cursor != size:
        what = "truncated" if data_start + cursor > size else "longer than its tensors (trailing bytes)"
        raise FingerprintError(f"{path}: the tensors end at file byte {data_start + cursor} but the file has {size} bytes: it is {what}; download it again")
    return _Shard(
        path=path,
        header_sha256=_sha256_hex(prefix + header),
        spans=[(data_start + b, data_start + e) for b, e, _, _ in tensors],
        dtypes=[d for _, _, d, _ in tensors],
        names=[name for _, _, _, name in tensors],
    )


def sample_ranges(spans: Sequence[Tuple[int, int]], total_data_bytes: int, data_before: int = 0) -> List[Tuple[int, int]]:
    """The sampled [begin, end) ranges of one file, ascending and disjoint (spec: "The sample")."""
    flat: List[int] = []
    edge, block = SAMPLE_EDGE_BYTES, SAMPLE_BLOCK_BYTES
    whole = total_data_bytes <= SAMPLE_WHOLE_LIMIT
    total = max(total_data_bytes, 1)

    def push(b: int, e: int) -> None:
        # Adjacent ranges (one tensor's tail, the next one's head) are one range.
        if e > b:
            if flat and flat[-1] == b:
                flat[-1] = e
            else:
                flat.extend((b, e))

    budget = SAMPLE_BLOCK_BUDGET
    before = data_before
    for begin, end in spans:
        n = end - begin
        # The tensor's share of the block budget: the blocks that fall in its part of the data.
        k = budget * (before + n) // total - budget * before // total
        before += n
        if whole or n <= 2 * edge:
            push(begin, end)
            continue
        a, z = begin + edge, end - edge
        m = z - a
        push(begin, a)
        if k * block >= m:
            push(a, z)
        else:
            for j in range(k):
                start = a + j * m // k
                push(start, start + block)
        push(z, end)
    return list(zip(flat[::2], flat[1::2]))


def _content_digest(path: str, spans: Sequence[Tuple[int, int]], total_data_bytes: int, data_before: int) -> str:
    ranges = sample_ranges(spans, total_data_bytes, data_before)
    h = _require("xxhash").xxh3_128()
    update = h.update
    fd = os.open(path, os.O_RDONLY)
    try:
        i, count = 0, len(ranges)
        while i < count:
            # One read covers every range whose gap to the previous is small.
            j = i + 1
            while j < count and ranges[j][0] - ranges[j - 1][1] <= _MERGE_GAP_BYTES:
                j += 1
            start, stop = ranges[i][0], ranges[j - 1][1]
            chunk = os.pread(fd, stop - start, start)
            if len(chunk) != stop - start:
                chunk = _pread_fully(fd, path, stop - start, start)
            if j == i + 1:
                update(chunk)
            else:
                view = memoryview(chunk)
                for b, e in ranges[i:j]:
                    update(view[b - start : e - start])
            i = j
    finally:
        os.close(fd)
    return h.hexdigest()


def _full_digests(path: str, spans: Sequence[Tuple[int, int]]) -> List[str]:
    xxh3_128 = _require("xxhash").xxh3_128_digest
    out = []
    fd = os.open(path, os.O_RDONLY)
    try:
        for begin, end in spans:
            pieces = []
            for at in range(begin, end, PIECE_BYTES):
                length = min(PIECE_BYTES, end - at)
                chunk = os.pread(fd, length, at)
                if len(chunk) != length:
                    chunk = _pread_fully(fd, path, length, at)
                pieces.append(xxh3_128(chunk))
            out.append(_require("xxhash").xxh3_128_hexdigest(b"".join(pieces)))
    finally:
        os.close(fd)
    return out


def tensor_digests(model_dir: str) -> List[Tuple[str, str]]:
    """Every tensor's full digest (docs/spec/fingerprint.md §8), file by file in data order, as
    (name, 32 hex digits): what a daemon's get_state(digests=True) reports, read from disk."""
    model_dir = os.path.abspath(model_dir)
    out: List[Tuple[str, str]] = []
    for f in _weight_files(model_dir):
        s = _read_shard(os.path.join(model_dir, f))
        out.extend(zip(s.names, _full_digests(s.path, s.spans)))
    return out


def _pread_fully(fd: int, path: str, length: int, offset: int) -> bytes:
    parts = []
    done = 0
    while done < length:
        part = os.pread(fd, length - done, offset + done)
        if not part:
            raise FingerprintError(f"{path}: the file ended at byte {offset + done} while its tensors' bytes were sampled; it is shorter than its header says (truncated, or changed while being read): download it again")
        parts.append(part)
        done += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _config_values(model_dir: str) -> Dict[str, Any]:
    path = os.path.join(model_dir, "config.json")
    c = _load_json(path, "model's config.json")
    archs = c.get("architectures") if isinstance(c, dict) else None
    if not (isinstance(archs, list) and archs and isinstance(archs[0], str) and archs[0]):
        raise FingerprintError(f'{path}: config.json needs "architectures": ["<ModelClass>"]')
    heads = c.get("num_attention_heads")
    kv = c.get("num_key_value_heads")
    head_dim = c.get("head_dim")
    hidden = c.get("hidden_size")
    if head_dim is None and isinstance(heads, (int, float)) and heads > 0 and isinstance(hidden, (int, float)) and hidden % heads == 0:
        head_dim = hidden // heads
    torch_dtype = c.get("torch_dtype")
    if torch_dtype is None:
        torch_dtype = c.get("dtype")
    return {
        "architecture": archs[0],
        "sharding": {
            "numAttentionHeads": heads,
            "numKeyValueHeads": kv if kv is not None else heads,
            "headDim": head_dim,
            "tieWordEmbeddings": c.get("tie_word_embeddings"),
        },
        "torchDtype": torch_dtype,
        "quantization": c.get("quantization_config"),
    }


def checkpoint_fingerprint(model_dir: str, tp_size: int, plan_file: Optional[str] = None, full: bool = False) -> Tuple[str, Dict[str, str]]:
    """The checkpoint's fingerprint and fields (every rank's, before its tpRank field); with
    ``full``, version 3's, whose ``content`` covers every byte."""
    model_dir = os.path.abspath(model_dir)
    config = _config_values(model_dir)
    shards = [_read_shard(os.path.join(model_dir, f)) for f in _weight_files(model_dir)]
    total = sum(e - b for s in shards for b, e in s.spans)
    digests = []
    before = 0
    for s in shards:
        if full:
            digests.extend(_full_digests(s.path, s.spans))
        else:
            digests.append(_content_digest(s.path, s.spans, total, before))
        before += sum(e - b for b, e in s.spans)
    plan_digest = None if plan_file is None else _sha256_hex(_canonical(_load_json(plan_file, "plan file")))
    dtypes = sorted({d for s in shards for d in s.dtypes}, key=_utf16_key)
    fields = {
        "headers": _sha256_hex("\n".join(s.header_sha256 for s in shards).encode()),
        "content": _sha256_hex("\n".join(digests).encode()),
        "architecture": _sha256_hex(config["architecture"].encode("utf-8")),
        "config": _sha256_hex(_canonical(config["sharding"])),
        "tpSize": _sha256_hex(str(tp_size).encode()),
        "dtypes": _sha256_hex(_canonical({"tensors": dtypes, "torchDtype": config["torchDtype"]})),
        "quantization": _sha256_hex(_canonical(config["quantization"])),
        "plan": _sha256_hex(_canonical({"builtinRules": BUILTIN_RULES, "planFile": plan_digest})),
        "protocol": _sha256_hex(str(FULL_FINGERPRINT_PROTOCOL_VERSION if full else FINGERPRINT_PROTOCOL_VERSION).encode()),
    }
    return _sha256_hex(_canonical(fields)), fields


def expected_fingerprint(model_dir: str, tp_size: int, tp_rank: int, layout: str = "checkpoint", plan_file: Optional[str] = None, full: bool = False) -> ExpectedFingerprint:
    """The fingerprint and fields rank ``tp_rank`` of a daemon serving ``model_dir`` at
    ``tp_size`` reports (``plan_file``: the daemon's ``--plan-file``, if it runs with one).

    ``full=True`` computes the full-content version (docs/spec/fingerprint.md §8): it reads every
    byte of the checkpoint, and only a daemon holding exactly these bytes matches it. A daemon
    older than that version answers it with a mismatch naming ``content`` and ``protocol``: the
    client then loads from disk, or asks again without ``full``.

    Raises FingerprintError when the checkpoint cannot be read, ValueError for bad arguments.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r} is not one this client computes fingerprints for; the layouts are: {', '.join(LAYOUTS)}")
    for name, value in (("tp_size", tp_size), ("tp_rank", tp_rank)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an int, not {value!r}")
    if tp_size < 1:
        raise ValueError(f"tp_size {tp_size} is not a positive integer; pass the engine's tensor-parallel size")
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank {tp_rank} does not exist with tensor-parallel size {tp_size}; pass 0..{tp_size - 1}")
    fingerprint, fields = checkpoint_fingerprint(model_dir, tp_size, plan_file, full)
    rank_fields = dict(fields, tpRank=_sha256_hex(str(tp_rank).encode()))
    return ExpectedFingerprint(
        fingerprint=_sha256_hex(f"{fingerprint}:{tp_rank}".encode()),
        fields=rank_fields,
        checkpoint_fingerprint=fingerprint,
    )
