#!/usr/bin/env bash
# The benchmarks (docs/testing.md#benchmarks), on a GPU machine, as root so cold reads can drop the page cache:
#   npm run bench [GiB] [out-dir] [devices]   transfers beside the ceiling, and the peers (transfer.ts, ceiling.cu, peers.py)
#   npm run bench -- swap [options]           engine swaps, the region-count sweep, vLLM's level-1 sleep (engine-swap.ts);
#                                             VSNAP_VLLM_SRC: the engines run vLLM's own allocator, built here
#   npm run bench -- registry [GiB] [out-dir] pull from a local registry against curl (CPU only)
#   npm run bench -- compare <before.json> <after.json> [tolerance]   two swap runs' medians side by side
#   npm run bench -- codec [MiB] [repeats] [out.json]   the chunk codec on the GPU (test/microbench/codec.ts)
#   npm run bench -- ram-codec [GiB] [rounds] [out.json]   a RAM-tier restore of coded BF16 weights
#                                             against the raw pinned H2D of the uncompressed bytes, and a
#                                             RAM-only capture against the raw D2H (bench/ram-codec.ts)
#   npm run bench -- bundle                   only the bundles (dist-gpu/bench-*.mjs), to carry
# Builds what the tools here can build; on a machine without npm, carry dist-gpu/ and run this script.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x node_modules/.bin/esbuild ]; then
  node_modules/.bin/esbuild bench/transfer.ts bench/engine-swap.ts bench/compare.ts bench/ram-codec.ts test/microbench/codec.ts --bundle --platform=node --format=esm --target=node20 \
    --outdir=dist-gpu --entry-names='bench-[name]' --out-extension:.js=.mjs --log-level=warning --external:node-gyp-build \
    --banner:js="import { createRequire as __cr } from 'module'; const require = __cr(import.meta.url);"
fi
case "${1:-}" in
  bundle)
    [ -x node_modules/.bin/esbuild ] || { echo "bench bundle: no node_modules/.bin/esbuild (npm ci first)" >&2; exit 1; }
    exit 0 ;;
  registry) shift; exec node_modules/.bin/tsx bench/registry.ts "$@" ;;
  compare) shift; exec node dist-gpu/bench-compare.mjs "$@" ;;
esac
if [ -z "${VSNAP_NATIVE_PATH:-}" ]; then
  export VSNAP_NATIVE_PATH="$(ls "$PWD"/prebuilds/linux-x64/*.node | head -1)"
fi
if command -v nvcc >/dev/null && { [ ! -x dist-gpu/ceiling ] || [ bench/ceiling.cu -nt dist-gpu/ceiling ]; }; then
  mkdir -p dist-gpu && nvcc -O2 -o dist-gpu/ceiling bench/ceiling.cu
fi
if [ "${1:-}" = codec ]; then shift; exec node dist-gpu/bench-codec.mjs "$@"; fi
if [ "${1:-}" = ram-codec ]; then shift; exec node dist-gpu/bench-ram-codec.mjs dist-gpu/ceiling "$@"; fi
if [ "${1:-}" = swap ]; then
  shift
  # VSNAP_VLLM_SRC: the reference engine runs vLLM's own allocator, built here
  source test/gpu/vllm-allocator.sh
  lib=dist-gpu/libvsnap_ref_cumem.so
  if command -v cc >/dev/null && [ -f "${CUDA_PATH:-/usr/local/cuda}/include/cuda.h" ]; then
    cc -O2 -shared -fPIC -I"${CUDA_PATH:-/usr/local/cuda}/include" test/fixtures/engine/csrc/cumem_allocator.c -o "$lib" -ldl
  fi
  export VSNAP_REF_CUMEM_LIB="$PWD/$lib"
  exec node dist-gpu/bench-engine-swap.mjs "$@"
fi
exec node dist-gpu/bench-transfer.mjs "${1:-16}" "${2:-bench/results}" "${VSNAP_BENCH_STORE:-/tmp/vsnap-bench-store}" dist-gpu/ceiling "${3:-1}"
