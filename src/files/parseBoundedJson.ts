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

/** JSON.parse, or a SyntaxError naming where the nesting passed the bound. */
export function parseBoundedJson(text: string): unknown {
  const at = tooDeepAt(text);
  if (at >= 0) throw new SyntaxError(`arrays and objects are nested ${MAX_JSON_DEPTH} levels deep at position ${at}; the safetensors format and its readers allow at most ${MAX_JSON_DEPTH - 1}`);
  return JSON.parse(text);
}
