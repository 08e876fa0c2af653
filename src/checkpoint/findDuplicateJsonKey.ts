// JSON.parse keeps the last of two equal keys without a word, so a safetensors header that names
// a tensor twice (two candidate byte ranges for one name) or an index that maps a tensor twice
// would be read as whichever came last. This scanner walks the raw text of a document that
// JSON.parse has already accepted and reports the first key repeated within one object.
//
// It is linear in the text: a frame links to its parent instead of holding a copy of the key
// path (copying it at every level made 80 KB of nested brackets exhaust the heap), and the path
// is spelled out only for the duplicate it reports.

export interface DuplicateKey {
  /** Keys of the enclosing objects, outermost first ([] for the top-level object; "[]" for an array element). */
  path: string[];
  key: string;
}

interface Frame {
  /** null for arrays. */
  keys: Set<string> | null;
  parent: Frame | null;
  expectKey: boolean;
  lastKey: string;
}

const QUOTE = 0x22, BACKSLASH = 0x5c, OPEN_OBJ = 0x7b, CLOSE_OBJ = 0x7d, OPEN_ARR = 0x5b, CLOSE_ARR = 0x5d, COMMA = 0x2c;

/** Index of the quote that closes the string opening at `start`. The text is valid JSON. */
function closingQuote(text: string, start: number): number {
  let j = start + 1;
  for (;;) {
    j = text.indexOf('"', j);
    let backslashes = 0;
    for (let k = j - 1; text.charCodeAt(k) === BACKSLASH; k--) backslashes++;
    if (backslashes % 2 === 0) return j;
    j++;
  }
}

/** The keys leading to `frame`'s object: each ancestor's current key, "[]" for an array. */
function pathTo(frame: Frame): string[] {
  const path: string[] = [];
  for (let f = frame.parent; f; f = f.parent) path.push(f.keys ? f.lastKey : '[]');
  return path.reverse();
}

export function findDuplicateJsonKey(text: string): DuplicateKey | null {
  let top = null as Frame | null;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === QUOTE) {
      const end = closingQuote(text, i);
      if (top?.keys && top.expectKey) {
        const raw = text.slice(i + 1, end);
        // Escapes can spell one key two ways ("a" and "\u0061"); decode before comparing.
        const key = raw.includes('\\') ? (JSON.parse(text.slice(i, end + 1)) as string) : raw;
        if (top.keys.has(key)) return { path: pathTo(top), key };
        top.keys.add(key);
        top.lastKey = key;
        top.expectKey = false;
      }
      i = end;
    } else if (c === OPEN_OBJ || c === OPEN_ARR) {
      top = { keys: c === OPEN_OBJ ? new Set() : null, parent: top, expectKey: c === OPEN_OBJ, lastKey: '' };
    } else if (c === CLOSE_OBJ || c === CLOSE_ARR) {
      top = top ? top.parent : null;
    } else if (c === COMMA) {
      if (top?.keys) top.expectKey = true;
    }
  }
  return null;
}
