import json, sys, collections
p = json.load(open(sys.argv[1]))
nodes = {n['id']: n for n in p['nodes']}
parent = {}
for n in p['nodes']:
    for c in n.get('children', []): parent[c] = n['id']
t = p['startTime']; samples = []
for s, d in zip(p['samples'], p['timeDeltas']):
    t += d; samples.append((t, s))
def name(i):
    cf = nodes[i]['callFrame']; return f"{cf['functionName'] or '(anon)'} {cf['url'].split('/')[-1]}:{cf['lineNumber']}"
busy = [(t, s) for t, s in samples if nodes[s]['callFrame']['functionName'] not in ('(idle)',)]
clusters = []; last = None
for t, s in busy:
    if last is None or t - last > 300_000: clusters.append([])
    clusters[-1].append((t, s)); last = t
print('clusters', len(clusters), [round((c[-1][0]-c[0][0])/1000,1) for c in clusters][-25:])
print('samples per cluster', [len(c) for c in clusters][-25:])
att = clusters[-21:-1] if len(sys.argv) < 3 else clusters[int(sys.argv[2]):]
selfc = collections.Counter(); incl = collections.Counter()
interval = (samples[-1][0]-samples[0][0]) / len(samples)
for c in att:
    for t, s in c:
        selfc[name(s)] += 1
        seen = set(); i = s
        while i in nodes:
            nm = name(i)
            if nm not in seen: incl[nm] += 1; seen.add(nm)
            if i not in parent: break
            i = parent[i]
n = len(att)
print('interval us', round(interval,1), 'attaches', n)
print('SELF ms/attach'); [print(f"  {v*interval/1000/n:.3f} {k}") for k, v in selfc.most_common(25)]
print('INCL ms/attach'); [print(f"  {v*interval/1000/n:.3f} {k}") for k, v in incl.most_common(45)]
