#!/usr/bin/env bash
# The GPU suite (`npm run test:gpu`): needs an NVIDIA GPU and driver. Bundles the suites with
# esbuild into dist-gpu/ (when the dev dependencies are installed), then runs them with Node's
# built-in test runner. On a machine without npm, carry dist-gpu/ and the prebuild and run
# this same script.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -x node_modules/.bin/esbuild ]; then
  node_modules/.bin/esbuild test/gpu/regions.gpu.test.ts test/gpu/engine.gpu.test.ts test/gpu/swap.gpu.test.ts test/gpu/tier0.gpu.test.ts test/gpu/digest.gpu.test.ts test/gpu/peer.ts test/gpu/resident-child.ts --bundle --platform=node --format=esm \
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
export VSNAP_GPU_PEER="$PWD/dist-gpu/peer.mjs"
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(dist-gpu/regions.gpu.test.mjs dist-gpu/engine.gpu.test.mjs dist-gpu/swap.gpu.test.mjs dist-gpu/tier0.gpu.test.mjs dist-gpu/digest.gpu.test.mjs)
exec node --test --test-concurrency=1 --test-reporter=spec "${suites[@]}"
