#!/usr/bin/env bash
# Unpacks Debian's arm64 Node.js (and the libraries it needs) into a directory that
# `qemu-aarch64 -L <dir>` runs it from, for test/integration/arm64-prebuild.test.ts. Nothing is
# installed for arm64: the packages are fetched with `apt-get download` and unpacked.
#   bash .ci/arm64-node.sh [dir]   (default /tmp/vsnap-arm64-root)
set -euo pipefail
root="${1:-/tmp/vsnap-arm64-root}"
if [ -x "$root/usr/bin/node" ]; then echo "arm64 node already in $root"; exit 0; fi
dpkg --print-foreign-architectures | grep -qx arm64 || { dpkg --add-architecture arm64 && apt-get update -qq; }
debs="$(mktemp -d)"
chown _apt "$debs" 2>/dev/null || true  # apt downloads as its _apt user
(cd "$debs" && apt-get download -qq nodejs:arm64 libnode108:arm64 libc6:arm64 libgcc-s1:arm64 libstdc++6:arm64 \
  libuv1:arm64 libbrotli1:arm64 libc-ares2:arm64 libicu72:arm64 libnghttp2-14:arm64 libssl3:arm64 zlib1g:arm64 \
  node-acorn node-cjs-module-lexer node-undici)
mkdir -p "$root"
for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$root"; done
rm -rf "$debs"
echo "arm64 node in $root: $(qemu-aarch64 -L "$root" "$root/usr/bin/node" --version)"
