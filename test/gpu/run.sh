#!/usr/bin/env bash
# The GPU suite (`npm run test:gpu`): needs an NVIDIA GPU and driver. Bundles the suites with
# esbuild into dist-gpu/ (when the dev dependencies are installed), then runs them with Node's
# built-in test runner. On a machine without npm, carry dist-gpu/ and the prebuild and run
# this same script.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -x node_modules/.bin/esbuild ]; then
  node_modules/.bin/esbuild test/gpu/regions.gpu.test.ts test/gpu/engine.gpu.test.ts test/gpu/swap.gpu.test.ts test/gpu/tier0.gpu.test.ts test/gpu/soak.gpu.test.ts test/gpu/digest.gpu.test.ts test/gpu/mapped.gpu.test.ts test/gpu/deep.gpu.test.ts test/gpu/check.gpu.test.ts test/gpu/remap.gpu.test.ts test/gpu/tp.gpu.test.ts test/gpu/neighbour.gpu.test.ts test/gpu/multipath.gpu.test.ts test/gpu/capture-deferred.gpu.test.ts test/gpu/sleep-backend.gpu.test.ts test/gpu/codec.gpu.test.ts test/gpu/ram-codec.gpu.test.ts test/gpu/capture-coded.gpu.test.ts test/gpu/store-codec.gpu.test.ts test/gpu/peer.ts test/gpu/gpu-tier-child.ts --bundle --platform=node --format=esm \
    --target=node20 --outdir=dist-gpu --out-extension:.js=.mjs --log-level=warning \
    --external:node-gyp-build --banner:js="import { createRequire as __cr } from 'module'; const require = __cr(import.meta.url);"
fi
if [ -z "${VSNAP_NATIVE_PATH:-}" ]; then
  export VSNAP_NATIVE_PATH="$(ls "$PWD"/prebuilds/linux-x64/*.node | head -1)"
  [ -f build/Release/vsnap.node ] && export VSNAP_NATIVE_PATH="$PWD/build/Release/vsnap.node"
fi
# The reference engine's CUDA allocator (test/fixtures/engine/csrc), built where a compiler is.
lib=dist-gpu/libvsnap_ref_cumem.so
if command -v cc >/dev/null && [ -f "${CUDA_PATH:-/usr/local/cuda}/include/cuda.h" ]; then
  cc -O2 -shared -fPIC -I"${CUDA_PATH:-/usr/local/cuda}/include" test/fixtures/engine/csrc/cumem_allocator.c -o "$lib" -ldl
fi
export VSNAP_REF_CUMEM_LIB="$PWD/$lib"
# VSNAP_VLLM_SRC: the reference engine runs vLLM's own allocator, built here
source test/gpu/vllm-allocator.sh
export VSNAP_GPU_PEER="$PWD/dist-gpu/peer.mjs"
# The raw H2D ceiling (bench/ceiling.cu), for the suites that compare with it in the same run.
if command -v nvcc >/dev/null && { [ ! -x dist-gpu/ceiling ] || [ bench/ceiling.cu -nt dist-gpu/ceiling ]; }; then
  mkdir -p dist-gpu && nvcc -O2 -o dist-gpu/ceiling bench/ceiling.cu
fi
[ -x dist-gpu/ceiling ] && export VSNAP_GPU_CEILING="$PWD/dist-gpu/ceiling"
suites=("$@")
if [ ${#suites[@]} -eq 0 ]; then
  suites=(dist-gpu/regions.gpu.test.mjs dist-gpu/engine.gpu.test.mjs dist-gpu/swap.gpu.test.mjs dist-gpu/tier0.gpu.test.mjs dist-gpu/digest.gpu.test.mjs dist-gpu/mapped.gpu.test.mjs dist-gpu/deep.gpu.test.mjs dist-gpu/check.gpu.test.mjs dist-gpu/capture-deferred.gpu.test.mjs dist-gpu/sleep-backend.gpu.test.mjs dist-gpu/codec.gpu.test.mjs dist-gpu/ram-codec.gpu.test.mjs dist-gpu/capture-coded.gpu.test.mjs dist-gpu/store-codec.gpu.test.mjs dist-gpu/soak.gpu.test.mjs)
  # the two-GPU suites only where two GPUs are visible
  if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" -ge 2 ]; then suites+=(dist-gpu/remap.gpu.test.mjs dist-gpu/tp.gpu.test.mjs dist-gpu/neighbour.gpu.test.mjs dist-gpu/multipath.gpu.test.mjs); fi
fi
# One file at a time in the order given (one `node --test` of them all runs them sorted by name), so
# a caller's time limit cuts the suites it listed last; the status is that of the worst.
status=0
for s in "${suites[@]}"; do node --test --test-reporter=spec "$s" || status=1; done
exit $status
