# The tables of README.md from fill.jsonl and ready/*/raw.jsonl: medians, bests and paired differences (AFTER - BASE, same pair).
import glob, json, os, statistics as st, sys
# Usage: summarize.py [RUNDIR]   (default: this folder, the first run)
here = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
fill = [json.loads(l) for l in open(os.path.join(here, 'fill.jsonl'))]
print('| tp | tree | fill wall median (best) | CPU median | read again to hash, by rank | digests alike |')
print('| --- | --- | --- | --- | --- | --- |')
for tp in (1, 2):
    for tree in ('base', 'after'):
        r = [x for x in fill if x['tp'] == tp and (x['tree'].endswith('/base') == (tree == 'base'))]
        print(f"| {tp} | {tree} | {st.median(x['fillMs'] for x in r):.0f} ({min(x['fillMs'] for x in r)}) ms | {st.median(x['cpuMs'] for x in r):.0f} ms | {', '.join(f'{b/1e9:.2f} GB' for b in r[0]['digestRereadBytes'])} | {all(x['sameDigests'] for x in r)} |")
ready, cp = {}, []
for d in sorted(glob.glob(os.path.join(here, 'ready', '*'))):
    tree, tp, i = os.path.basename(d).split('-')
    for l in open(os.path.join(d, 'raw.jsonl')):
        row = json.loads(l)
        if 'readyWallMs' in row: ready[(tree, tp[2:], int(i))] = row
        elif 'baselineWallMs' in row: cp.append(row['baselineWallMs'])
print()
print('| tp | READY BASE median (best) | READY AFTER median (best) | AFTER - BASE, paired median (range, faster in) | CPU at READY BASE / AFTER, median |')
print('| --- | --- | --- | --- | --- |')
med = {}
for tp in ('1', '2'):
    pairs = sorted(i for (t, p, i) in ready if t == 'base' and p == tp and ('after', tp, i) in ready)
    b = [ready[('base', tp, i)]['readyWallMs'] for i in pairs]
    a = [ready[('after', tp, i)]['readyWallMs'] for i in pairs]
    d = [x - y for x, y in zip(a, b)]
    med[tp] = (st.median(b), st.median(a), min(b), min(a))
    cb = st.median(ready[('base', tp, i)]['cpuAtReadyMs'] for i in pairs)
    ca = st.median(ready[('after', tp, i)]['cpuAtReadyMs'] for i in pairs)
    print(f"| {tp} | {st.median(b):.0f} ({min(b):.0f}) ms | {st.median(a):.0f} ({min(a):.0f}) ms | {st.median(d):+.0f} ms ({min(d):+.0f} to {max(d):+.0f}, {sum(x < 0 for x in d)} of {len(d)}) | {cb:.0f} / {ca:.0f} ms |")
print()
print(f"tp=2 against tp=1, READY medians: BASE {med['2'][0]/med['1'][0]:.2f}x, AFTER {med['2'][1]/med['1'][1]:.2f}x; bests: BASE {med['2'][2]/med['1'][2]:.2f}x, AFTER {med['2'][3]/med['1'][3]:.2f}x")
print(f"`cp` to /dev/shm: median {st.median(cp):.0f} ms, best {min(cp):.0f} ms ({len(cp)} runs); READY tp=1 AFTER best against `cp` best: {min(cp)/med['1'][3]:.2f}x")
