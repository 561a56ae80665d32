/** Installs the failpoint handler `env` asks for (TEST_FAILPOINTS, TEST_FAILPOINT_AT, TEST_FAILPOINT_TRACE); see failpoints.mjs. */
export function installFailpoints(
  env: Readonly<Record<string, string | undefined>>,
  io?: { kill?: () => void; write?: (line: string) => void },
): boolean;
