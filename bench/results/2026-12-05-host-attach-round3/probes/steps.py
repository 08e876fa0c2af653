# PYTHONPATH=<client> python3 steps.py SOCKET_DIR: one fresh process's attach to rank 0 in steps,
# each as [thread CPU ms, minor page faults]: the views (column_views), the name -> view dict, the
# whole attach, and touching every view. Output of 2026-12-05 22:43: steps.txt.
import json, sys, time, resource, gc
import torch
import weightd_client.tensors as tz, weightd_client.bulk_views as bv
from weightd_client import WeightdClient, find_socket
R = {}
def clock(): return time.thread_time()*1e3, resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def acc(key, t0, f0):
    t1, f1 = clock(); o = R.setdefault(key, [0, 0]); o[0] += t1 - t0; o[1] += f1 - f0
orig_cv = tz.column_views
def cv(*a):
    t0, f0 = clock(); r = orig_cv(*a); acc("column_views", t0, f0); return r
tz.column_views = cv
orig_wa = tz._with_aliases
def wa(state, out):
    return orig_wa(state, out)
orig_zip = zip
def tbn(state, views_of):
    cols = state["tensors"]
    layouts = [(shape, *tz.contiguous(shape)) for shape in cols.shapes]
    views = cv(cols, layouts, views_of)
    t0, f0 = clock(); d = dict(zip(cols.name, views)); acc("dict", t0, f0)
    return tz._with_aliases(state, d)
import weightd_client.host as hm
hm.torch_by_name = tbn
ub = torch.Tensor.unbind
c = WeightdClient(find_socket(global_rank=0, socket_dir=sys.argv[1]))
fp = c.ping()["fingerprint"]
t0, f0 = clock()
a = c.attach(fp)
acc("attach", t0, f0)
t0, f0 = clock()
n = sum(1 for _, t in a.tensors.items() if t.data_ptr() >= 0)
acc("touch", t0, f0)
print(json.dumps({k: [round(v[0], 2), v[1]] for k, v in R.items()}))
