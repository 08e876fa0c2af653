// Defaults that --help prints as well as nodeOptions.ts applies: apart from the options' checks,
// so that the command line shows them without loading the checkpoint's schemas (zod).

/** How long a spawned keeper holds segments no daemon has adopted. */
export const DEFAULT_ADOPT_WITHIN_S = 600;
export const DEFAULT_INSPECT_HOST = '127.0.0.1';
/** How many earlier versions of a model a writer's commits leave resident for rollback (--keep-versions; docs/weight-updates.md). */
export const DEFAULT_KEEP_VERSIONS = 2;
/** A rank's processed layouts' bytes at most this percent of its version's bytes (--processed-max-percent; docs/engines.md). */
export const DEFAULT_PROCESSED_MAX_PERCENT = 100;
