#!/usr/bin/env bash
# The benchmark (`npm run bench [GiB] [out-dir]`), on a GPU machine. Builds the ceiling program
# and the bundle when the tools are here; runs as root to drop the page cache for cold reads.
set -euo pipefail
cd "$(dirname "$0")/.."
gib="${1:-16}"
out="${2:-bench/results}"
if [ -x node_modules/.bin/esbuild ]; then
  node_modules/.bin/esbuild bench/transfer.ts --bundle --platform=node --format=esm --target=node20 \
    --outfile=dist-gpu/bench-transfer.mjs --log-level=warning --external:node-gyp-build \
    --banner:js="import { createRequire as __cr } from 'module'; const require = __cr(import.meta.url);"
fi
if [ ! -x dist-gpu/ceiling ] || [ bench/ceiling.cu -nt dist-gpu/ceiling ]; then
  mkdir -p dist-gpu && nvcc -O2 -o dist-gpu/ceiling bench/ceiling.cu
fi
if [ -z "${VSNAP_NATIVE_PATH:-}" ]; then
  export VSNAP_NATIVE_PATH="$(ls "$PWD"/prebuilds/linux-x64/*.node | head -1)"
fi
node dist-gpu/bench-transfer.mjs "$gib" "$out" "${VSNAP_BENCH_STORE:-/tmp/vsnap-bench-store}" dist-gpu/ceiling
