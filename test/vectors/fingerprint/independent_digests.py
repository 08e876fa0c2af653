"""Every tensor's full digest (docs/spec/fingerprint.md §8), computed with nothing of weightd's:
the safetensors header read by hand, the bytes hashed with the xxhash package. Prints
{"name": "32 hex digits", ...} for the model directory given, file by file in data order."""
import json
import os
import struct
import sys

import xxhash

PIECE = 1 << 20


def main(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for name in files:
        with open(os.path.join(model_dir, name), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            header.pop("__metadata__", None)
            for tensor, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
                begin, end = entry["data_offsets"]
                f.seek(8 + n + begin)
                data = f.read(end - begin)
                pieces = b"".join(xxhash.xxh3_128_digest(data[at : at + PIECE]) for at in range(0, len(data), PIECE))
                out[tensor] = xxhash.xxh3_128_hexdigest(pieces)
    json.dump(out, sys.stdout)


main(sys.argv[1])
