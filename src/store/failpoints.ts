/**
 * Named points of capture and publish (`publish.after-blobs`, ...) where the store's crash tests
 * stop a process as a crash would, and pause points (`snapshot.opened`) where an in-process test
 * holds a flow while it runs something beside it (a gc), so an interleaving is fixed by order. In
 * the product each does nothing: only code running inside the process can install a handler (setFailpointHandler, not exported from the package), never its
 * environment or arguments. The handler sits on globalThis under a registered symbol, so the ESM and
 * CommonJS builds and a test's own bundle share it: a test's child process imports the built
 * package and test/helpers/failpoints.mjs, which installs the handler under the same key.
 * @internal
 */

/**
 * Called with the point's name each time one is reached; at a pause point, a promise it returns
 * holds the flow until it settles (at a plain failpoint it is ignored). @internal
 */
export type FailpointHandler = (name: string) => unknown;

const HANDLER = Symbol.for('vsnap.failpointHandler.v1');
type Holder = { [HANDLER]?: FailpointHandler };

/** Reached `name`: calls the handler a test installed, else does nothing. @internal */
export function failpoint(name: string): void {
  void (globalThis as Holder)[HANDLER]?.(name);
}

/** Reached pause point `name`: waits for what the handler installed returns (nothing is installed in the product). @internal */
export async function pausePoint(name: string): Promise<void> {
  await (globalThis as Holder)[HANDLER]?.(name);
}

/** Installs (or, with undefined, removes) the handler of every failpoint in this process. Tests only. @internal */
export function setFailpointHandler(handler: FailpointHandler | undefined): void {
  if (handler) (globalThis as Holder)[HANDLER] = handler;
  else delete (globalThis as Holder)[HANDLER];
}
