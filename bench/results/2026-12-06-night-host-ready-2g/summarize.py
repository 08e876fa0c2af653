# Summary of run.sh's folders: READY per tp, base and after, paired; `cp` per invocation; the
# issue 33 ratios (cp best over READY tp=1 best; tp=2 median over tp=1 median).
import json, glob, statistics as st, sys, os
here = os.path.dirname(os.path.abspath(__file__))
rows = {}
for f in glob.glob(f'{here}/ready/*/raw.jsonl'):
    v, i = os.path.basename(os.path.dirname(f)).split('-')
    for l in open(f):
        d = json.loads(l)
        key = ('cp' if 'baselineWallMs' in d else f"tp{d['tp']}")
        rows.setdefault((v, key), {})[int(i)] = d.get('baselineWallMs', d.get('readyWallMs'))
for key in ('tp1', 'tp2', 'cp'):
    b, a = rows[('base', key)], rows[('after', key)]
    pairs = sorted(set(b) & set(a))
    diff = [a[p] - b[p] for p in pairs]
    print(f"{key}: base median {st.median(b.values()):.0f} best {min(b.values()):.0f} | after median {st.median(a.values()):.0f} best {min(a.values()):.0f} | paired median {st.median(diff):+.0f} ({min(diff):+.0f} to {max(diff):+.0f}), after faster in {sum(d < 0 for d in diff)} of {len(diff)}")
cp = list(rows[('base', 'cp')].values()) + list(rows[('after', 'cp')].values())
for v in ('base', 'after'):
    t1, t2 = rows[(v, 'tp1')].values(), rows[(v, 'tp2')].values()
    print(f"{v}: cp best {min(cp):.0f} / READY tp=1 best {min(t1):.0f} = {min(cp) / min(t1):.2f}x; tp=2 / tp=1 medians {st.median(t2) / st.median(t1):.2f}x")
