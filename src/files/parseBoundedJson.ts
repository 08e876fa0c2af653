// JSON.parse with the nesting bound of serde_json, the parser of the safetensors reference
// crate: a document nested 128 levels or deeper is refused before it is parsed. Without it, a
// 25M-deep config.json took 13 s to parse and 80 KB of brackets in a header exhausted the heap
// further on. No file weightd reads (headers, config.json, the index, plan files) comes near it.

/** serde_json's default recursion limit: 127 nested arrays or objects pass, 128 fail. */
export const MAX_JSON_DEPTH = 128;

const QUOTE = 0x22, BACKSLASH = 0x5c, OPEN_OBJ = 0x7b, CLOSE_OBJ = 0x7d, OPEN_ARR = 0x5b, CLOSE_ARR = 0x5d;

/** Index of the first bracket that opens level MAX_JSON_DEPTH, or -1. One pass; works on any text, valid JSON or not. */
export function tooDeepAt(text: string): number {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === BACKSLASH) i++;
      else if (c === QUOTE) inString = false;
    } else if (c === QUOTE) {
      inString = true;
    } else if (c === OPEN_OBJ || c === OPEN_ARR) {
      if (++depth >= MAX_JSON_DEPTH) return i;
    } else if (c === CLOSE_OBJ || c === CLOSE_ARR) {
      depth--;
    }
  }
  return -1;
}

/**
 * The SyntaxError of parseBoundedJson: where the text stops being JSON and why, quoting none of
 * it. JSON.parse's own messages can quote the input ('Unexpected token \'r\', "root:*:202"...
 * is not valid JSON'), and a path from a configuration file can name any file the daemon may
 * read: a secret's first bytes went into the log that way.
 */
export class JsonSyntaxError extends SyntaxError {
  override name = 'SyntaxError';
}

/** "position N (line L, column C)" of offset `at` in `text`, both counted from 1 for lines and columns. */
function where(text: string, at: number): string {
  const before = text.slice(0, at);
  const line = before.split('\n').length;
  return `position ${at} (line ${line}, column ${at - before.lastIndexOf('\n')})`;
}

/** Whether JSON.parse of `prefix` fails on something inside it, not only on its end. */
function failsInside(prefix: string): boolean {
  try {
    JSON.parse(prefix);
    return false;
  } catch (err) {
    const m = (err as Error).message;
    if (m.startsWith('Unexpected end of JSON input')) return false;
    const at = / in JSON at position (\d+)/.exec(m);
    return !at || Number(at[1]) < prefix.length;
  }
}

/** Offset of the character JSON.parse refused in `text`: the shortest prefix that fails inside ends with it. */
function refusedAt(text: string): number {
  let lo = 1;
  let hi = text.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (failsInside(text.slice(0, mid))) hi = mid;
    else lo = mid + 1;
  }
  return lo - 1;
}

/** V8's descriptions of a JSON syntax error that quote nothing of the input ("Expected ',' or '}' after property value"). */
const GRAMMAR_ONLY = /^[A-Za-z ,'{}[\]:-]{1,80}$/;

/**
 * Where and why `text` is not JSON, from JSON.parse's error `err`, quoting none of the text.
 * Where V8 does not say, a binary search of prefixes finds the character (some twenty parses of
 * the text): only up to `locateUpTo` characters, so that a peer's bad 1 MiB frame costs one
 * parse, not the 280 ms the search took (a file's error is located whatever its size).
 */
export function describeJsonError(text: string, err: unknown, locateUpTo = Infinity): string {
  const m = err instanceof Error ? err.message : '';
  if (err instanceof JsonSyntaxError) return m;
  if (m.startsWith('Unexpected end of JSON input')) return `the text ends at ${where(text, text.length)} before the JSON value does`;
  const at = / in JSON at position (\d+)/.exec(m);
  const problem = at ? m.slice(0, at.index) : '';
  if (at && GRAMMAR_ONLY.test(problem) && !problem.startsWith('Unexpected token')) return `${problem.charAt(0).toLowerCase()}${problem.slice(1)} at ${where(text, Number(at[1]))}`;
  if (text.length > locateUpTo) return `unexpected character somewhere in its ${text.length} characters (not located past ${locateUpTo})`;
  return `unexpected character at ${where(text, refusedAt(text))}`;
}

/** JSON.parse, or a JsonSyntaxError naming where and why, or where the nesting passed the bound. */
export function parseBoundedJson(text: string, locateUpTo = Infinity): unknown {
  const at = tooDeepAt(text);
  if (at >= 0) throw new JsonSyntaxError(`arrays and objects are nested ${MAX_JSON_DEPTH} levels deep at ${where(text, at)}; the safetensors format and its readers allow at most ${MAX_JSON_DEPTH - 1}`);
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new JsonSyntaxError(describeJsonError(text, err, locateUpTo));
  }
}
