// Loaded before uvu by every compiled test file, however it is run (its 'uvu' is
// dist/test/node_modules/uvu, scripts/link-test-uvu.mjs): makes uvu 0.5.6 report every failure.
// Its own report crashes on an error whose `details` is an object (WeightdError's are), and that
// crash, like an error thrown by a before/after hook, is swallowed by its runner's
// `finally { return }`: the file then fails with nothing printed, and the rest of its tests never
// run. A load hook replaces uvu's `format` and `runner` with the versions below; the rest of uvu
// (its queue, its summary lines, which run.mjs counts) is unchanged. Each failure prints its
// error's name, message, code, details and cause, and its stack.
import { createHash } from 'node:crypto';
import { register } from 'node:module';
import { isMainThread } from 'node:worker_threads';

if (isMainThread) register(import.meta.url);

const FORMAT = `function format(name, err, suite = '') {
	try {
		const e = err !== null && typeof err === 'object' ? err : { message: String(err) };
		// uvu/assert's Assertion (its diff in details) or node:assert's AssertionError (diffed here):
		// printed as uvu prints them, without a name or code.
		const assertion = /^Assertion(Error)?$/.test(String(e.name ?? '').split(' ')[0]);
		let { details, operator = '' } = e;
		if (String(e.name ?? '').startsWith('AssertionError') && !operator.includes('not')) details = compare(e.actual, e.expected);
		let str = '  ' + FAILURE + (suite ? kleur.red(SUITE(\` \${suite} \`)) : '') + ' ' + QUOTE + kleur.red().bold(name) + QUOTE;
		str += '\\n    ' + (assertion || e.name === undefined ? '' : e.name + ': ') + e.message + (operator ? kleur.italic().dim(\`  (\${operator})\`) : '') + '\\n';
		if (e.code !== undefined && !assertion) str += '    code: ' + e.code + '\\n';
		if (details !== null && typeof details === 'object' && Object.keys(details).length > 0) str += '    details: ' + __inspect(details, { depth: 6, breakLength: 100 }).split('\\n').join('\\n    ') + '\\n';
		if (e.cause !== undefined) str += '    cause: ' + (e.cause instanceof Error ? e.cause.name + ': ' + e.cause.message : __inspect(e.cause)) + '\\n';
		// uvu/assert's diff, as uvu prints it.
		if (typeof details === 'string' && details) str += GUTTER + details.split('\\n').join(GUTTER);
		const idx = typeof e.stack === 'string' ? e.stack.indexOf('\\n') : -1;
		if (!!~idx) str += stack(e.stack, idx);
		return str + '\\n';
	} catch (broken) {
		return '  FAIL "' + name + '"\\n    ' + __inspect(err) + '\\n    (and reporting it failed: ' + __inspect(broken) + ')\\n\\n';
	}
}

`;

const RUNNER = `async function runner(ctx, name) {
	let { only, tests, before, after, bEach, aEach, state } = ctx;
	let hook, test, arr = only.length ? only : tests;
	let num=0, errors='', total=arr.length;
	const fail = (what, err) => {
		if (errors.length) errors += '\\n';
		errors += format(what, err, name);
	};
	const runHooks = async (hooks, what) => {
		try {
			for (hook of hooks) await hook(state);
			return true;
		} catch (err) {
			fail(what, err);
			return false;
		}
	};

	try {
		if (name) write(SUITE(kleur.black(\` \${name} \`)) + ' ');
		// A failed before hook runs no test: each counts as failed.
		if (!(await runHooks(before, 'before hook'))) arr = [];

		for (test of arr) {
			state.__test__ = test.name;
			let ok = await runHooks(bEach, test.name + ' (before.each hook)');
			if (ok) {
				try {
					await test.handler(state);
				} catch (err) {
					fail(test.name, err);
					ok = false;
				}
			}
			ok = (await runHooks(aEach, test.name + ' (after.each hook)')) && ok;
			write(ok ? PASS : FAIL);
			if (ok) num++;
		}
	} finally {
		state.__test__ = '';
		await runHooks(after, 'after hook');
		let msg = \`  (\${num} / \${total})\\n\`;
		let skipped = (only.length ? tests.length : 0) + ctx.skips;
		write(errors.length ? kleur.red(msg) : kleur.green(msg));
		return [errors || true, num, skipped, total];
	}
}

`;

/**
 * The SHA-256 of uvu 0.5.6's format and runner (from "function format(" up to "let timer;"): the
 * code replaced here. Another version may keep those markers and change what lies between them
 * (what the runner returns, the hooks' order), which the replacement would silently undo.
 */
const REPLACED_SHA256 = 'bd004e0300c4c35c66ba325281b807d34ea7e21108bbff78ffcc994a32be9c08';

/** uvu's source with its format and runner replaced, or an error if it is not the code they were written for. */
function patchUvu(source) {
	const from = source.indexOf('function format(');
	const runner = source.indexOf('async function runner(', from);
	const to = source.indexOf('let timer;', runner);
	const found = from >= 0 && runner >= 0 && to >= 0 && source.indexOf('function format(', from + 1) < 0 && source.indexOf('async function runner(', runner + 1) < 0;
	if (!found || createHash('sha256').update(source.slice(from, to)).digest('hex') !== REPLACED_SHA256) {
		throw new Error("test/uvuFailureReport.mjs: uvu's dist/index.mjs is not the one it was written for (uvu 0.5.6: its format() and runner() between \"function format(\" and \"let timer;\" differ); update it for the installed version");
	}
	return source.slice(0, from) + FORMAT + RUNNER + source.slice(to);
}

export async function load(url, context, nextLoad) {
	const loaded = await nextLoad(url, context);
	if (!/\/node_modules\/uvu\/dist\/index\.mjs$/.test(url)) return loaded;
	return { ...loaded, source: `import { inspect as __inspect } from 'node:util';\n${patchUvu(String(loaded.source))}` };
}
