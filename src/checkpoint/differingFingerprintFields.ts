// Which fingerprint fields two parties disagree on, so a refusal can say "content" or "tpRank"
// instead of an unexplained "fingerprint". One rule for the serving mismatch reply and the
// rendezvous join refusal.

/**
 * The names of the fields whose hashes differ, sorted; ["fingerprint"] when the other side sent
 * no fields, or when every field agrees under unequal fingerprints (a formula outside the fields).
 */
export function differingFingerprintFields(ours: Record<string, string>, theirs: Record<string, string> | undefined): string[] {
  if (!theirs) return ['fingerprint'];
  const names = [...new Set([...Object.keys(ours), ...Object.keys(theirs)])].sort();
  const differ = names.filter((n) => ours[n] !== theirs[n]);
  return differ.length > 0 ? differ : ['fingerprint'];
}
