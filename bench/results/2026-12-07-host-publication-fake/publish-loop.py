"""Pull-plan updates on the fake driver, each a new version; prints publishMs/commitMs medians."""
import json, os, statistics, sys
ROOT = os.environ.get("ROOT", "/work/main"); sys.path.insert(0, ROOT + "/clients/python/tests"); sys.path.insert(0, ROOT + "/clients/python")
from cuda_scenarios import TrainerMemory, segment_plan, served_fingerprint
from daemon_fixture import Daemon
from test_host_fds import MODEL, checkpoint_tensors
n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
want = checkpoint_tensors()
plan_file = segment_plan("weightd-pub-")
with Daemon(MODEL, device="cuda", extra_args=["--cuda-handles", "fd", "--plan-file", plan_file, "--log-level", "info"]) as daemon:
    with daemon.client() as client:
        name = client.ping()["name"]
        fp = served_fingerprint(client, name, 0)
        reader = client.attach(fp, device=0, tensor_format="memoryview")
        step_bytes = lambda s: {k: bytes((b + 7 * s + 1) % 256 for b in v[:16]) + v[16:] for k, v in want.items()}
        trainer = TrainerMemory(step_bytes(0))
        plan = client.pull_plan(name, trainer.tensors, device=0)
        try:
          for s in range(n):
            trainer.write(step_bytes(s + 1))
            with client.begin_update(name, fp, device=0, source="pull") as upd:
                upd.pull_from(plan)
                fp = upd.commit()["fingerprint"]
            reader.switch_to(fp)
        except Exception:
            print("".join(daemon.stderr_lines[-15:])); raise
        plan.close()
    import collections; print(collections.Counter(json.loads(l)["msg"] for l in daemon.stderr_lines if l.startswith("{")).most_common(12))
    lines = [json.loads(l) for l in daemon.stderr_lines if '"publishMs"' in l]
tr = [l.split() for l in daemon.stderr_lines if l.startswith("TRACE")]
import collections
d = collections.defaultdict(list); prev = None
for _, lab, t in tr:
    t = float(t)
    if lab == "A-publish": base = t; prev = (lab, t)
    elif prev: d[prev[0] + ">" + lab].append(t - prev[1]); prev = (lab, t)
for k, v in d.items(): print(k, len(v), round(statistics.median(v), 3))
pub = [l["publishMs"] for l in lines][5:]; com = [l["commitMs"] for l in lines][5:]
print(f"n={len(pub)} publishMs median {statistics.median(pub):.2f} commitMs median {statistics.median(com):.2f} p25 {sorted(pub)[len(pub)//4]:.2f}")
