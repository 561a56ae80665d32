#!/usr/bin/env bash
# The benchmarks, on a GPU machine (run as root, so cold reads can drop the page cache):
#   npm run bench [GiB] [out-dir] [devices]     transfers of GiB bytes, with the ceiling and the
#                                               peers (bench/transfer.ts, bench/peers.py)
#   npm run bench -- swap [options]             end-to-end swaps of two reference engines
#                                               (bench/engine-swap.ts; options there)
#   npm run bench -- regions [MiB] [host|cuda] [repeats]   per-region cost of a RAM-tier restore,
#                                               36..4,000 regions (bench/region-count.ts)
# Builds the bundles, the ceiling program and the reference engine's allocator where the tools
# are here; on a machine without npm, carry dist-gpu/ and run this same script.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x node_modules/.bin/esbuild ]; then
  node_modules/.bin/esbuild bench/transfer.ts bench/engine-swap.ts bench/region-count.ts --bundle --platform=node --format=esm --target=node20 \
    --outdir=dist-gpu --entry-names='bench-[name]' --out-extension:.js=.mjs --log-level=warning --external:node-gyp-build \
    --banner:js="import { createRequire as __cr } from 'module'; const require = __cr(import.meta.url);"
fi
if [ -z "${VSNAP_NATIVE_PATH:-}" ]; then
  export VSNAP_NATIVE_PATH="$(ls "$PWD"/prebuilds/linux-x64/*.node | head -1)"
fi
if [ "${1:-}" = regions ]; then
  shift
  exec node dist-gpu/bench-region-count.mjs "$@"
fi
if [ "${1:-}" = swap ]; then
  shift
  lib=dist-gpu/libvsnap_ref_cumem.so
  if command -v cc >/dev/null && [ -f "${CUDA_PATH:-/usr/local/cuda}/include/cuda.h" ]; then
    cc -O2 -shared -fPIC -I"${CUDA_PATH:-/usr/local/cuda}/include" test/fixtures/engine/csrc/cumem_allocator.c -o "$lib" -ldl
  fi
  export VSNAP_REF_CUMEM_LIB="$PWD/$lib"
  exec node dist-gpu/bench-engine-swap.mjs "$@"
fi
gib="${1:-16}"
out="${2:-bench/results}"
devices="${3:-1}"
if [ ! -x dist-gpu/ceiling ] || [ bench/ceiling.cu -nt dist-gpu/ceiling ]; then
  mkdir -p dist-gpu && nvcc -O2 -o dist-gpu/ceiling bench/ceiling.cu
fi
exec node dist-gpu/bench-transfer.mjs "$gib" "$out" "${VSNAP_BENCH_STORE:-/tmp/vsnap-bench-store}" dist-gpu/ceiling "$devices"
