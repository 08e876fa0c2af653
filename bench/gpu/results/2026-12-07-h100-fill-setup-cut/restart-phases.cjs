// Per run of the restart pairs: the start that loads (control socket, allocated, loaded, the fill's
// own ms, the gap between "allocated" and "loaded" less the fill, READY) and the restart that
// adopts (control socket, planned, adopted, READY), on the daemon's clock (sinceStartMs).
const fs = require('fs');
for (const dir of ['1-call/restart-pair', '2-again/restart-pair-2']) {
  for (const run of fs.readdirSync(dir).filter((n) => /^(base|new)-\d+$/.test(n)).sort()) {
    const lines = fs.readFileSync(`${dir}/${run}/daemon.jsonl`, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    const at = (which, re) => lines.find((x) => x.which === which && re.test(x.msg))?.sinceStartMs;
    const loadedLine = lines.find((x) => x.which === 'loaded' && /^rank 0 loaded/.test(x.msg));
    const fill = loadedLine ? +loadedLine.msg.match(/in (\d+) ms/)[1] : NaN;
    const [a, lo] = [at('loaded', /allocated/), at('loaded', /^rank 0 loaded/)];
    console.log(`${dir} ${run}: loaded: socket ${at('loaded', /^control socket/)} allocated ${a} loaded ${lo} fill ${fill} gap ${lo - a - fill} READY ${at('loaded', /^READY/)}; adopted: socket ${at('adopted', /^control socket/)} planned ${at('adopted', /^checkpoint planned/)} adopted ${at('adopted', /adopted .* from the keeper/)} READY ${at('adopted', /^READY/)}`);
  }
}
