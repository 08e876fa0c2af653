# PYTHONPATH=<client> python3 recv.py SOCKET_DIR: each frame read during one fresh process's first attach,
# as [what, bytes, wall ms, thread CPU ms]: the get_state reply (its header's wait is the daemon's answer),
# the packed manifest frame, the segment descriptors' reply. Output: recv.txt.
import sys, time, json, torch
import weightd_client.protocol as pr
from weightd_client import WeightdClient, find_socket
log = []
orig = pr._recv_exact
def w(sock, n, deadline, what, fds=None):
    t = time.perf_counter(); c = time.thread_time()
    r = orig(sock, n, deadline, what, fds)
    log.append((what, n, round((time.perf_counter()-t)*1e3, 2), round((time.thread_time()-c)*1e3, 2)))
    return r
pr._recv_exact = w
c = WeightdClient(find_socket(global_rank=0, socket_dir=sys.argv[1]))
fp = c.ping()["fingerprint"]
log.clear()
a = c.attach(fp)
print(json.dumps(log))
