#!/usr/bin/env bash
# Sourced by test/gpu/run.sh and bench/run.sh. With VSNAP_VLLM_SRC=<folder made by
# test/fixtures/engine/vllm_src.py>, the reference engine runs vLLM's own allocator
# (vllm/device_allocator/ of vLLM main, or the restructure variant's vllm/backends/platform/
# device_allocator/, + csrc/cumem_allocator.cpp) instead of its stand-in: this checks the folder's
# files and builds the extension, as vLLM's build would, into <folder>/build/cumem_allocator<ext
# suffix>. Without VSNAP_VLLM_SRC it does nothing.
if [ -n "${VSNAP_VLLM_SRC:-}" ]; then
  export VSNAP_VLLM_SRC="$(cd "$VSNAP_VLLM_SRC" && pwd)"
  python3 test/fixtures/engine/vllm_src.py --check --to "$VSNAP_VLLM_SRC"
  cuda="${CUDA_PATH:-/usr/local/cuda}"
  pyinc="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
  ext="$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
  mkdir -p "$VSNAP_VLLM_SRC/build"
  # link libcuda: the toolkit's stub, else the driver's libcuda.so.1 itself
  libcuda="$cuda/lib64/stubs/libcuda.so"
  [ -f "$libcuda" ] || libcuda="$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')"
  [ -n "$libcuda" ] || { echo "VSNAP_VLLM_SRC: no libcuda to link against" >&2; exit 1; }
  g++ -O2 -std=c++17 -shared -fPIC -I"$pyinc" -I"$cuda/include" "$VSNAP_VLLM_SRC/csrc/cumem_allocator.cpp" \
    -o "$VSNAP_VLLM_SRC/build/cumem_allocator$ext" "$libcuda"
  echo "reference engine: vLLM's own allocator from $VSNAP_VLLM_SRC ($(head -1 "$VSNAP_VLLM_SRC/MANIFEST.txt" | sed 's/^# //'))" >&2
fi
