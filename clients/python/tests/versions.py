"""Another version of a checkpoint for the switch_to tests: the same names, dtypes, shapes and
offsets (so the daemon places it the same), other weights."""

import os
import shutil
import struct


def other_version(src: str, dst: str, mask: int = 0xFF) -> None:
    """A copy of checkpoint ``src`` with every tensor byte XORed with ``mask``."""
    shutil.copytree(src, dst)
    for name in os.listdir(dst):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(dst, name), "r+b") as f:
            (header,) = struct.unpack("<Q", f.read(8))
            f.seek(8 + header)
            data = f.read()
            f.seek(8 + header)
            f.write(bytes(b ^ mask for b in data))
