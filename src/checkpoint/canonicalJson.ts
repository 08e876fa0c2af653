// RFC 8785 (JSON Canonicalization Scheme) for the JSON values the fingerprint and the keeper's
// load requests hash: plain data parsed from JSON. ECMAScript's own JSON.stringify already
// writes numbers and strings as RFC 8785 asks (the RFC takes both from it), so what is left is
// the key order (UTF-16 code units, as Array.prototype.sort compares) and refusing what has no
// canonical form. docs/spec/fingerprint.md §1; vectors in test/vectors/jcs.json, which the
// Python client's rfc8785 package is held to as well.

/** In a `u` pattern a surrogate pair is one code point, so only a lone surrogate matches. */
const LONE_SURROGATE = /\p{Surrogate}/u;

/** The canonical JSON text of `value`; throws TypeError on what JSON cannot hold. */
export function canonicalJson(value: unknown): string {
  if (typeof value === 'number' && !Number.isFinite(value)) throw new TypeError(`cannot write ${value} as JSON`);
  if (typeof value === 'string' && LONE_SURROGATE.test(value)) throw new TypeError('cannot write a string with a lone surrogate as canonical JSON');
  if (value === null || typeof value === 'number' || typeof value === 'string' || typeof value === 'boolean') return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map((v) => canonicalJson(v === undefined ? null : v)).join(',')}]`;
  if (typeof value === 'object' && Object.getPrototypeOf(value) === Object.prototype) {
    // An undefined member is absent, as JSON.stringify leaves it out.
    const keys = Object.keys(value).filter((k) => (value as Record<string, unknown>)[k] !== undefined).sort();
    return `{${keys.map((k) => `${canonicalJson(k)}:${canonicalJson((value as Record<string, unknown>)[k])}`).join(',')}}`;
  }
  throw new TypeError(`cannot write ${typeof value === 'object' ? 'a non-plain object' : typeof value} as canonical JSON`);
}
