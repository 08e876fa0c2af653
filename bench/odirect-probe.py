#!/usr/bin/env python3
"""The disk's real ceiling for reading a checkpoint: the files read with O_DIRECT by several
threads at once, each taking the next chunk (block-aligned) as it finishes one, into its own
aligned buffer; nothing is copied or kept. Standard library only.

  python3 bench/odirect-probe.py FILE... [--threads 16] [--chunk-mib 8]

Prints one JSON line: bytes, seconds, GB/s, threads, chunk size. Drop the page cache first for a
cold figure (O_DIRECT bypasses it, but a file system may still serve cached blocks).
"""
import argparse
import json
import mmap
import os
import threading
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--chunk-mib", type=int, default=8)
    a = ap.parse_args()
    chunk = a.chunk_mib << 20
    jobs = []
    for path in a.files:
        size = os.path.getsize(path)
        jobs.extend((path, off) for off in range(0, size, chunk))
    fds = {path: os.open(path, os.O_RDONLY | os.O_DIRECT) for path in a.files}
    lock = threading.Lock()
    state = {"next": 0, "bytes": 0, "error": None}

    def work():
        buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT needs
        view = memoryview(buf)
        got = 0
        try:
            while True:
                with lock:
                    i = state["next"]
                    state["next"] += 1
                if i >= len(jobs):
                    break
                path, off = jobs[i]
                got += os.preadv(fds[path], [view], off)
        except OSError as err:
            state["error"] = f"{path}: {err}"
        finally:
            view.release()
            buf.close()
        with lock:
            state["bytes"] += got

    t0 = time.perf_counter()
    threads = [threading.Thread(target=work) for _ in range(a.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    for fd in fds.values():
        os.close(fd)
    if state["error"]:
        raise SystemExit(f"O_DIRECT read failed: {state['error']}")
    print(json.dumps({"bytes": state["bytes"], "seconds": seconds, "GBps": state["bytes"] / seconds / 1e9, "threads": a.threads, "chunkBytes": chunk}))


if __name__ == "__main__":
    main()
