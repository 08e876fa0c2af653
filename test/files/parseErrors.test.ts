// Errors never echo file contents. A path from configuration (a --models file's planFile, a ctl
// load request) can name any file the daemon may read, root's /etc/shadow included, and
// JSON.parse's messages quote the input ('Unexpected token 'r', "root:*:202"... is not valid
// JSON'). Every file the daemon parses, and every frame, reports the file, the position and the
// problem instead; the secret below must appear in no message.
import { cpSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { execFileSync } from 'node:child_process';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { planCheckpoint } from '../../src/checkpoint/planCheckpoint.js';
import { parseSafetensors } from '../../src/checkpoint/parseSafetensors.js';
import { readPlanFile } from '../../src/checkpoint/readPlanFile.js';
import { LoadControl } from '../../src/control/controlProtocol.js';
import { readModelsFile } from '../../src/models/modelSpecs.js';
import { acquireDeviceLock } from '../../src/wire/deviceLock.js';
import { parsePayload } from '../../src/wire/frameCodec.js';
import { writeRawSafetensors } from '../helpers/checkpoints.js';
import { exampleModel, freshSocketDir, freshTempDir } from '../helpers/paths.js';
import { runCli } from '../helpers/runCli.js';

const SECRET = 'hunter2-SECRET';
/** A secret file as JSON.parse meets it: refused on its first character, and one refused further in. */
const SECRET_TEXTS = [`${SECRET}:x:0:0:root:/root\n`, `{\n  "password": ${SECRET}\n}\n`];

const dir = freshTempDir();

/** The message of what `run` throws or rejects with. */
async function messageOf(run: () => unknown): Promise<string> {
  try {
    await run();
  } catch (err) {
    return (err as Error).message;
  }
  return assert.unreachable('expected a refusal') as never;
}

function assertClean(message: string, file: string, position: RegExp): void {
  assert.not.match(message, SECRET, message);
  assert.not.match(message, 'hunter2', message);
  assert.not.match(message, /Unexpected token/, message);
  assert.match(message, file, message);
  assert.match(message, position, message);
}

for (const [i, text] of SECRET_TEXTS.entries()) {
  const where = i === 0 ? /position 0 \(line 1, column 1\)/ : /position 16 \(line 2, column 15\)/;

  test(`a plan file that is a secret (${i}): E_PLAN_JSON names the file and the position only`, async () => {
    const file = join(dir, `plan-${i}.json`);
    writeFileSync(file, text);
    assertClean(await messageOf(() => readPlanFile(file)), file, where);
  });

  test(`a --models file that is a secret (${i})`, async () => {
    const file = join(dir, `models-${i}.json`);
    writeFileSync(file, text);
    assertClean(await messageOf(() => readModelsFile(file)), `models-${i}.json`, where);
  });

  test(`config.json, the index and a safetensors header that are secrets (${i})`, async () => {
    for (const name of ['config.json', 'model.safetensors.index.json']) {
      const model = join(dir, `${name}-${i}`);
      cpSync(exampleModel, model, { recursive: true });
      writeFileSync(join(model, name), text);
      assertClean(await messageOf(() => planCheckpoint(model, { tpSize: 1 })), join(model, name), where);
    }
    const shard = join(dir, `header-${i}.safetensors`);
    await writeRawSafetensors(shard, text);
    assertClean(await messageOf(() => parseSafetensors(shard)), shard, where);
  });

  test(`a device lock and a control frame that are secrets (${i})`, async () => {
    const socketDir = freshSocketDir();
    writeFileSync(join(socketDir, 'dev.lock'), text);
    assertClean(await messageOf(() => acquireDeviceLock(socketDir, 'dev')), join(socketDir, 'dev.lock'), /characters, not JSON: unexpected character at position/);
    for (const parse of [undefined, JSON.parse]) {
      assertClean(await messageOf(() => parsePayload(Buffer.from(text), parse)), 'frame payload', where);
    }
  });
}

test("the issue's case: a --models file whose planFile climbs to a secret ends with the file and position, not its bytes", async () => {
  const secret = join(dir, 'shadow');
  writeFileSync(secret, SECRET_TEXTS[0]!);
  const models = join(dir, 'conf', 'models.json');
  execFileSync('mkdir', ['-p', join(dir, 'conf')]);
  writeFileSync(models, JSON.stringify({ models: [{ dir: exampleModel, planFile: '../shadow' }] }));
  const r = await runCli(['--models', models, '--device', 'host', '--weight-cache-socket-dir', freshSocketDir()]);
  assert.is(r.code, 1, r.stderr);
  assert.match(r.messages, `plan file ${secret}: not valid JSON (unexpected character at position 0 (line 1, column 1))`);
  assert.not.match(r.stderr, 'hunter2');
});

test('a --models file that is a FIFO is refused by the regular-file rule, not read', async () => {
  const fifo = join(dir, 'models.fifo');
  execFileSync('mkfifo', [fifo]);
  assert.match(await messageOf(() => readModelsFile(fifo)), /cannot be read \(is a FIFO \(named pipe\), not a regular file/);
});

test('ctl load: a relative model or plan file path is refused, not resolved against the daemon\'s directory', () => {
  for (const request of [{ cmd: 'load', model: 'models/llama' }, { cmd: 'load', model: '/models/llama', planFile: '../plan.json' }]) {
    const parsed = LoadControl.safeParse(request);
    assert.not.ok(parsed.success, JSON.stringify(request));
    assert.match(parsed.error!.issues[0]!.message, 'must be an absolute path');
  }
  assert.ok(LoadControl.safeParse({ cmd: 'load', model: '/models/llama', planFile: '/models/plan.json' }).success);
});

test.run();
