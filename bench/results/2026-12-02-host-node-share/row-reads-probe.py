# One reader alone on a cold file: a down_proj-like slice of every row (3584 of every 28672
# bytes) read row by row, against the whole span, 8 threads, over 400 MiB of node 0's copy.
# Usage: python3 row-reads-probe.py FILE   (evicts FILE from the page cache first)
import os, sys, threading, time

f = sys.argv[1]
fd = os.open(f, os.O_RDONLY)
base, span, pitch, row = 600 << 20, 400 << 20, 28672, 3584
rows = span // pitch


def run(work):
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    t0 = time.time()
    ts = [threading.Thread(target=work, args=(i, 8)) for i in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    return time.time() - t0


def sparse(t, n):
    for r in range(t, rows, n):
        os.pread(fd, row, base + r * pitch)


def whole(t, n):
    for c in range(t, span // (2 << 20), n):
        os.pread(fd, 2 << 20, base + c * (2 << 20))


for name, work in [("rows", sparse), ("span", whole), ("rows", sparse), ("span", whole)]:
    s = run(work)
    print(f"{name}: {s:.2f} s, {rows * row / s / 1e6:.0f} MB/s of the slice")
