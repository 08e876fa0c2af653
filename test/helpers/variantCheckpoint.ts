// Another version of a checkpoint: the same names, shapes and dtypes with every data byte
// inverted (or xored with another mask, for a third version), so that its content fingerprint,
// and every tensor's bytes, differ from the original's.
import { cpSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

export function writeVariant(from: string, to: string, mask = 0xff): string {
  cpSync(from, to, { recursive: true });
  for (const name of readdirSync(to).filter((n) => n.endsWith('.safetensors'))) {
    const path = join(to, name);
    const bytes = readFileSync(path);
    const dataStart = 8 + Number(bytes.readBigUInt64LE(0));
    for (let i = dataStart; i < bytes.length; i++) bytes[i] = bytes[i]! ^ mask;
    writeFileSync(path, bytes);
  }
  return to;
}
