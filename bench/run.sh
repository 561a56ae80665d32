#!/usr/bin/env bash
# The benchmarks, on a GPU machine (run as root, so cold reads can drop the page cache):
#   npm run bench [GiB] [out-dir] [devices]     transfers of GiB bytes, with the ceiling and the
#                                               peers (bench/transfer.ts, bench/peers.py)
#   npm run bench -- bundle                     only the bundles (dist-gpu/bench-*.mjs), to carry
#   npm run bench -- swap [options]             end-to-end swaps of two reference engines, the
#                                               region-count sweep, the two-GPU capture and vLLM's
#                                               level-1 sleep (bench/engine-swap.ts; options there;
#                                               --rows picks rows). VSNAP_VLLM_SRC=<folder made by
#                                               test/fixtures/engine/vllm_src.py>: the engines run
#                                               vLLM's real allocator (built here, as test/gpu/run.sh does)
#   npm run bench -- regions [MiB] [host|cuda] [repeats]   per-region cost of a RAM-tier restore,
#                                               36..4,000 regions (bench/region-count.ts)
#   npm run bench -- vmm [--streams K] [reps] [regions] [MiB] [modes...]   a pinned H2D copy beside VMM calls and
#                                               frees of this or another process (bench/vmm-interference.cu)
#   npm run bench -- import [reps] [regions] [MiB] [arrangements...]   import, map and copy into
#                                               another process's allocations, several ways (bench/import-pipeline.cu)
#   npm run bench -- codec [MiB] [repeats] [out.json]   the vsnap-c1 codec: ratio and GPU encode and
#                                               decode GB/s per dtype beside a D2D copy (bench/codec.ts)
#   npm run bench -- registry [GiB] [out-dir]   pull from a local registry vs curl (CPU only)
#   npm run bench -- persist [MiB] [regions] [repeats]   persisting a deferred capture: one fused
#                                               hash-and-digest pass vs two passes (CPU only, bench/persist.ts)
# Builds the bundles, the ceiling program and the reference engine's allocator where the tools
# are here; on a machine without npm, carry dist-gpu/ and run this same script.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x node_modules/.bin/esbuild ]; then
  node_modules/.bin/esbuild bench/transfer.ts bench/engine-swap.ts bench/region-count.ts bench/codec.ts --bundle --platform=node --format=esm --target=node20 \
    --outdir=dist-gpu --entry-names='bench-[name]' --out-extension:.js=.mjs --log-level=warning --external:node-gyp-build \
    --banner:js="import { createRequire as __cr } from 'module'; const require = __cr(import.meta.url);"
fi
if [ "${1:-}" = bundle ]; then  # `npm run bench -- bundle`: only the bundles (dist-gpu/), to carry to a machine without npm
  [ -x node_modules/.bin/esbuild ] || { echo "bench bundle: no node_modules/.bin/esbuild (npm ci first)" >&2; exit 1; }
  exit 0
fi
if [ -z "${VSNAP_NATIVE_PATH:-}" ]; then
  export VSNAP_NATIVE_PATH="$(ls "$PWD"/prebuilds/linux-x64/*.node | head -1)"
fi
build_ceiling() {
  if command -v nvcc >/dev/null && { [ ! -x dist-gpu/ceiling ] || [ bench/ceiling.cu -nt dist-gpu/ceiling ]; }; then
    mkdir -p dist-gpu && nvcc -O2 -o dist-gpu/ceiling bench/ceiling.cu
  fi
}
if [ "${1:-}" = persist ]; then
  shift
  exec node_modules/.bin/tsx bench/persist.ts "$@"
fi
if [ "${1:-}" = registry ]; then
  # CPU only: pull from a local distribution registry into the store vs curl (bench/registry.ts)
  shift
  exec node_modules/.bin/tsx bench/registry.ts "$@"
fi
if [ "${1:-}" = regions ]; then
  shift
  exec node dist-gpu/bench-region-count.mjs "$@"
fi
# A single-file CUDA driver bench (bench/<name>.cu, GPU only), built when missing or older than
# its source or bench/cuda-bench.h, then run with the rest of the arguments.
run_cu() {
  local name=$1 bin=dist-gpu/$1
  shift
  mkdir -p dist-gpu
  if [ ! -x "$bin" ] || [ "bench/$name.cu" -nt "$bin" ] || [ bench/cuda-bench.h -nt "$bin" ]; then
    nvcc -O2 -o "$bin" "bench/$name.cu" -lcuda -lpthread
  fi
  exec "$bin" "$@"
}
# vmm: what VMM calls and frees in this or another process cost a host-to-device copy beside
# them; import: import, map and copy into another process's allocations, arranged several ways.
# One JSON line per mode or arrangement on stdout.
if [ "${1:-}" = vmm ]; then shift; run_cu vmm-interference "$@"; fi
if [ "${1:-}" = import ]; then shift; run_cu import-pipeline "$@"; fi
if [ "${1:-}" = codec ]; then shift; exec node dist-gpu/bench-codec.mjs "$@"; fi
if [ "${1:-}" = swap ]; then
  shift
  build_ceiling
  # VSNAP_VLLM_SRC: the reference engine runs vLLM's own allocator, built here
  source test/gpu/vllm-allocator.sh
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
build_ceiling
exec node dist-gpu/bench-transfer.mjs "$gib" "$out" "${VSNAP_BENCH_STORE:-/tmp/vsnap-bench-store}" dist-gpu/ceiling "$devices"
