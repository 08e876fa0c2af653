# 3.5 MB over a Unix stream socket, sender in another process: wall of the receiver's read, default SO_SNDBUF vs 4 MiB.
import os, socket, sys, time
N = 3_498_311
def run(sndbuf):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    if sndbuf: a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    payload = os.urandom(N)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        b.close(); os.read(r, 1); a.sendall(payload); os._exit(0)
    a.close()
    buf = bytearray(N); view = memoryview(buf)
    t = time.perf_counter(); c = time.thread_time()
    os.write(w, b"x"); got = 0
    while got < N:
        got += b.recv_into(view[got:], N - got)
    wall, cpu = (time.perf_counter() - t) * 1e3, (time.thread_time() - c) * 1e3
    os.waitpid(pid, 0); b.close()
    return round(wall, 2), round(cpu, 2)
for i in range(5):
    print("default", run(0), "4MiB", run(4 << 20))
