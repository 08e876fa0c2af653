# python populate.py bytearray|populate: in a fresh process, 3,498,321 bytes made ready to receive
# into: a bytearray whose pages the kernel's copy faults in (as _recv_exact's), or an anonymous
# mmap with MAP_POPULATE (all pages in one call), then every page written once, as recv would.
import mmap, sys, time
N = 3_498_311
t = time.perf_counter(); c = time.thread_time()
if sys.argv[1] == "bytearray":
    b = bytearray(N); v = memoryview(b)
else:
    m = mmap.mmap(-1, N, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE); v = memoryview(m)
v[::4096] = b"\x01" * len(range(0, N, 4096))
print(sys.argv[1], "wall %.2f cpu %.2f" % ((time.perf_counter() - t) * 1e3, (time.thread_time() - c) * 1e3))
