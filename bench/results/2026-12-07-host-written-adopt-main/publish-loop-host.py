"""Partial updates on the host backend (staging: begin_update, write, commit), each a new version
the reader switches to; prints the daemon's publishMs and commitMs medians (the first 5 left out)."""
import json, os, statistics, sys
ROOT = os.environ.get("ROOT", "/work/main"); sys.path.insert(0, ROOT + "/clients/python/tests"); sys.path.insert(0, ROOT + "/clients/python")
from daemon_fixture import Daemon
from test_host_fds import MODEL
n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
with Daemon(MODEL, ["--log-level", "info"]) as daemon, daemon.client() as client:
    name = client.ping()["name"]
    fp = next(m["fingerprint"] for m in client.ping()["models"] if m["name"] == name)
    reader = client.attach(fp, tensor_format="numpy")
    tensor = sorted(reader.tensors)[0]
    size = reader.tensors[tensor].nbytes
    for s in range(n):
        with client.begin_update(name, fp, tensors=[tensor]) as upd:
            upd.write(tensor, bytes([(s + 1) % 256]) * size)
            fp = upd.commit()["fingerprint"]
        reader.switch_to(fp)
    reader.detach()
    lines = [json.loads(l) for l in daemon.stderr_lines if '"publishMs"' in l]
    where = sorted({json.dumps(r.get("source")) for m in json.loads(__import__("subprocess").run(["node", ROOT + "/dist/main.js", "ctl", "--weight-cache-socket-dir", daemon.socket_dir, "list", "--json"], capture_output=True, text=True, env={**os.environ, "WEIGHTD_HOST_DEVICES": daemon.device}).stdout)["models"] for r in m["ranks"]})
pub = [l["publishMs"] for l in lines][5:]; com = [l["commitMs"] for l in lines][5:]
print(json.dumps({"n": len(pub), "publishMsMedian": round(statistics.median(pub), 2), "commitMsMedian": round(statistics.median(com), 2), "publishMs": [round(x, 2) for x in pub], "sources": where}))
