import pino from 'pino';

/** A logger whose lines a test can wait for. */
export function capturedLog() {
  const lines: string[] = [];
  const waiting: Array<{ pattern: RegExp; resolve: (line: string) => void }> = [];
  const logger = pino({ level: 'info' }, {
    write(line: string) {
      lines.push(line);
      for (const w of [...waiting]) if (w.pattern.test(line)) (waiting.splice(waiting.indexOf(w), 1), w.resolve(line));
    },
  });
  const until = (pattern: RegExp) => new Promise<string>((resolve) => {
    const seen = lines.find((l) => pattern.test(l));
    if (seen) resolve(seen);
    else waiting.push({ pattern, resolve });
  });
  return { logger, lines, until };
}
