// A writer (the Python client) that writes one tensor of the version a socket's rank of NAME
// serves, in a partial update (docs/weight-updates.md): only that tensor's segment is copied,
// the rest is shared with the base. On a cuda rank it names GPU 0 (the tests' fake driver's).
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { repoRoot } from './paths.js';

const partialWriter = `
import json, sys
from weightd_client.client import WeightdClient
socket, name, tensor, device = sys.argv[1:]
client = WeightdClient(socket)
base = next(v["fingerprint"] for v in client.ping()["models"] if v["name"] == name and v["status"] == "serving")
with client.begin_update(name, base, tensors=[tensor], device=int(device) if device else None) as update:
    update.write(tensor, b"\\xab" * update.tensors[tensor]["bytes"])
    print(json.dumps(update.commit()))
`;

/** Resolves with the commit's reply once the writer exited 0; rejects with its stderr otherwise. */
export function writePartially(socket: string, name: string, tensor: string, cudaDevice?: number): Promise<{ version: number }> {
  const args = ['-c', partialWriter, socket, name, tensor, cudaDevice === undefined ? '' : String(cudaDevice)];
  const writer = spawn(process.env.WEIGHTD_PYTHON ?? 'python3', args, { env: { ...process.env, PYTHONPATH: join(repoRoot, 'clients/python') } });
  let out = '';
  let err = '';
  writer.stdout.on('data', (d) => (out += d));
  writer.stderr.on('data', (d) => (err += d));
  return new Promise((resolve, reject) => writer.on('close', (code) => (code === 0 ? resolve(JSON.parse(out)) : reject(new Error(`the writer exited ${code}: ${err}`)))));
}
