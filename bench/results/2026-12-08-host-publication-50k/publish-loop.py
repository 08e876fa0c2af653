"""Partial updates of one tensor on the host backend, each a new version; prints the daemon's
publishMs and commitMs ("update committed" lines) and the writer's begin and commit seconds.
  ROOT=<checkout> python3 publish-loop.py MODEL N
ROOT's clients/python and its tests' daemon fixture (which runs ROOT's dist/main.js)."""
import json, os, statistics, sys, time
ROOT = os.environ.get("ROOT", "/work/main")
sys.path[:0] = [ROOT + "/clients/python", ROOT + "/clients/python/tests"]
from daemon_fixture import Daemon
model, n = sys.argv[1], int(sys.argv[2])
with Daemon(model, device="host", extra_args=["--keep-versions", "1", "--log-level", "info"]) as d:
    with d.client() as c:
        p = c.ping(); name, fp = p["name"], p["fingerprint"]
        first = c.get_state(fp)["tensors"][0]["name"]
        begins, commits = [], []
        for i in range(n):
            t0 = time.perf_counter()
            upd = c.begin_update(name, fp, tensors=[first])
            t1 = time.perf_counter()
            upd.tensor(first).view("uint8")[...] = (i % 250) + 1
            t2 = time.perf_counter()
            done = upd.commit()
            t3 = time.perf_counter()
            begins.append((t1 - t0) * 1e3); commits.append((t3 - t2) * 1e3)
            fp = done["fingerprint"]
    lines = [json.loads(l) for l in d.stderr_lines if '"publishMs"' in l]
print(json.dumps({"root": ROOT, "beginMs": [round(x, 2) for x in begins], "commitCallMs": [round(x, 2) for x in commits],
                  "publishMs": [round(l["publishMs"], 2) for l in lines], "commitMs": [round(l["commitMs"], 2) for l in lines]}))
