#!/usr/bin/env bash
# Builds the committed prebuilds (`npm run build:native`): linux-x64 with the host's g++ and
# linux-arm64 cross-compiled with Debian's g++-aarch64-linux-gnu, then records the source hash
# and checks both binaries' glibc/libstdc++ symbol versions (.ci/check-prebuild.mjs).
#
# Both are linked against the shared libstdc++ (not -static-libstdc++: a static libstdc++ from
# GCC 12 carries its own glibc references, arc4random@GLIBC_2.36 among them, past the 2.35 of
# Ubuntu 22.04 that vLLM's images use). The check then holds every binary to glibc <= 2.35 and
# GLIBCXX <= 3.4.29 (GCC 11); a build that needs more fails here instead of on a user's machine.
#
# Needs: g++, make, python3, cuda.h (CUDA_PATH or /usr/local/cuda), libxxhash-dev, and for arm64
# g++-aarch64-linux-gnu and binutils-aarch64-linux-gnu.
set -euo pipefail
cd "$(dirname "$0")/.."
arches="${VSNAP_PREBUILD_ARCHES:-x64 arm64}"
for arch in $arches; do
  case "$arch" in
    x64)
      nice -n 10 npx prebuildify --napi --strip --tag-libc --arch x64
      ;;
    arm64)
      # xxhash.h is architecture-independent and lives in /usr/include, which the cross compiler
      # does not search: -idirafter finds it there after the arm64 glibc headers.
      CC=aarch64-linux-gnu-gcc CXX=aarch64-linux-gnu-g++ LINK=aarch64-linux-gnu-g++ \
        CXXFLAGS="-idirafter /usr/include" \
        nice -n 10 npx prebuildify --napi --strip --tag-libc --arch arm64 --strip-bin aarch64-linux-gnu-strip
      ;;
    *) echo "unknown arch $arch" >&2; exit 2 ;;
  esac
done
node .ci/check-prebuild.mjs --write
