import socket, sys, time
N = 3_498_311 + 10
for i in range(6):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(sys.argv[1]); s.settimeout(10)
    buf = bytearray(N); view = memoryview(buf); got = 0; calls = 0
    t = time.perf_counter(); c = time.thread_time()
    s.sendall(b"x")
    while got < N:
        got += s.recv_into(view[got:], N - got); calls += 1
    print("node sender: wall %.2f ms, reader cpu %.2f ms, %d recvs" % ((time.perf_counter() - t) * 1e3, (time.thread_time() - c) * 1e3, calls))
    s.close()
