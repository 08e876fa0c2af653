// toPacked's own time on the development VM (run from the repository root after npm run build:ts):
// what a commit no longer spends once the packed tensors are kept per tensor list.
import { toPacked } from '../../../dist/src/wire/packedManifest.js';
for (const n of [183, 50439]) {
  const t = Array.from({ length: n }, (_, i) => ({ name: `model.layers.${i % 61}.mlp.experts.${i}.down_proj.weight`, dtype: 'BF16', shape: [512, 1536], segment: i % 60, offset: i * 1572864, bytes: 1572864 }));
  for (let r = 0; r < 4; r++) {
    const s = performance.now();
    toPacked(t);
    console.log(n, 'tensors', (performance.now() - s).toFixed(3), 'ms');
  }
}
