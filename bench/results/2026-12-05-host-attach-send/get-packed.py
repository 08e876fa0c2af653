# python get-packed.py SOCKET FINGERPRINT: one fresh process (torch and numpy imported, as an engine's) sends
# the Python client's packed get_state and reads the two frames with the client's own reader
# (weightd_client.protocol.read_payload). Prints one JSON row: ms from the request to the reply's
# header, then the packed frame's wall and this thread's CPU while reading it,.
import json, os, socket, sys, time
import numpy, torch  # noqa: F401  (an engine's process)
import weightd_client.protocol as pr
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(path)
msg = {"id": 1, "cmd": "get_state", "fingerprint": sys.argv[2], "pid": os.getpid(), "mode": "map",
       "client": "get-packed", "packed": True, "columns": True}
deadline = time.monotonic() + 30
t0 = time.perf_counter()
s.sendall(pr.encode_frame(msg))
head = pr._recv_exact(s, 10, deadline, "reply header")
t1 = time.perf_counter()
body = pr._recv_exact(s, int.from_bytes(head[6:10], "big"), deadline, "reply")
reply = json.loads(body.decode())
t2 = time.perf_counter(); c2 = time.thread_time()
packed = pr.read_payload(s, deadline)
t3 = time.perf_counter(); c3 = time.thread_time()
print(json.dumps({"ok": reply.get("ok"), "error": reply.get("error"), "firstByteMs": round((t1 - t0) * 1e3, 3), "packedBytes": len(packed),
                  "packedWallMs": round((t3 - t2) * 1e3, 3), "packedCpuMs": round((c3 - c2) * 1e3, 3), "loadavg": open("/proc/loadavg").read().split()[:3]}))
s.close()
