/** Installs the failpoint handler `env` asks for (TEST_FAILPOINTS, TEST_FAILPOINT_AT, TEST_FAILPOINT_TRACE); see failpoints.mjs. */
export function installFailpoints(
  env: Readonly<Record<string, string | undefined>>,
  io?: { kill?: () => void; write?: (line: string) => void },
): boolean;

/** Holds a flow of this process at pause point `name` (its first arrival) until release(); see failpoints.mjs. */
export function holdAt(name: string): { readonly reached: Promise<void>; release(): void; remove(): void };
