#!/usr/bin/env bash
# Makes the cross toolchain the manylinux_2_28 wheels are built with, for one architecture:
# zig's clang (PyPI's `ziglang`, in the wheel-tools venv) targeting ARCH-linux-gnu.2.28 — glibc
# 2.28's symbols (RHEL 8's), LLVM's libc++ linked statically, so the binaries need nothing but
# glibc — and a prefix holding only the headers and static libraries cpprun builds against.
#
#   packaging/zig-toolchain.sh ARCH PREFIX        ARCH: x86_64 or aarch64
#
# PREFIX/ afterwards:
#   toolchain.cmake                 CMAKE_TOOLCHAIN_FILE (a copy of cmake/zig-toolchain.cmake)
#   bin/zig-c++, zig-ar, zig-ranlib zig with the target baked in
#   include/                        Boost, nlohmann/json, hwloc (headers only: it is loaded at
#                                   run time) and OpenSSL: never the host's glibc headers, which
#                                   are 2.36's
#   lib/libssl.a, lib/libcrypto.a   Debian 12's OpenSSL 3.0 for ARCH, linked statically (etcd's
#                                   TLS, the store's HMAC): it was built against glibc 2.36's
#                                   headers, and links against 2.28 (checked: the wheel's
#                                   symbol-version test)
#   share/cmake/nlohmann_json/      its CMake package, finding the headers here
# x86_64 takes its libraries and arch headers from this machine (libssl-dev, libhwloc-dev);
# aarch64 from Debian 12's arm64 packages unpacked by packaging/setup.sh --wheel-tools into
# ${CPPRUN_ARM64_DEPS_ROOT:-/opt/cpprun/sysroots/bookworm-arm64-deps}.
# Idempotent: PREFIX is rebuilt each time (it is links and a few small files).
set -euo pipefail
arch=${1:?usage: zig-toolchain.sh ARCH PREFIX}
prefix=${2:?usage: zig-toolchain.sh ARCH PREFIX}
src=$(cd "$(dirname "$0")/.." && pwd)
tools=${CPPRUN_WHEEL_TOOLS_VENV:-/opt/cpprun/wheel-tools}
fail() { echo "zig-toolchain: $*" >&2; exit 1; }

case $arch in
  x86_64) root=/ ;;
  aarch64) root=${CPPRUN_ARM64_DEPS_ROOT:-/opt/cpprun/sysroots/bookworm-arm64-deps} ;;
  *) fail "unknown architecture '$arch' (x86_64 or aarch64)" ;;
esac
multiarch=$arch-linux-gnu
zig=$("$tools/bin/python" -c 'import os, ziglang; print(os.path.dirname(ziglang.__file__))' \
  2> /dev/null)/zig || true
[ -x "$zig" ] || fail "no zig in $tools (packaging/setup.sh --wheel-tools installs ziglang)"
for need in "$root/usr/lib/$multiarch/libssl.a" "$root/usr/lib/$multiarch/libcrypto.a" \
            "$root/usr/include/$multiarch/openssl/configuration.h" \
            "$root/usr/include/$multiarch/hwloc/autogen/config.h"; do
  [ -e "$need" ] || fail "$need is missing (packaging/setup.sh --wheel-tools provides it)"
done

rm -rf "$prefix"
mkdir -p "$prefix/bin" "$prefix/include/openssl" "$prefix/include/hwloc" "$prefix/lib" \
  "$prefix/share/cmake/nlohmann_json"
prefix=$(cd "$prefix" && pwd)

# Arch-independent headers from this machine; OpenSSL's and hwloc's from ARCH's packages, with
# their multiarch configuration headers merged in (the layout a non-multiarch system has).
ln -s /usr/include/boost "$prefix/include/boost"
ln -s /usr/include/nlohmann "$prefix/include/nlohmann"
ln -s "$root/usr/include/openssl/"* "$prefix/include/openssl/"
ln -s "$root/usr/include/$multiarch/openssl/"* "$prefix/include/openssl/"
ln -s "$root/usr/include/hwloc.h" "$prefix/include/hwloc.h"
ln -s "$root/usr/include/hwloc/"* "$prefix/include/hwloc/"
rm -f "$prefix/include/hwloc/autogen"
mkdir "$prefix/include/hwloc/autogen"
ln -s "$root/usr/include/$multiarch/hwloc/autogen/"* "$prefix/include/hwloc/autogen/"
ln -s "$root/usr/lib/$multiarch/libssl.a" "$root/usr/lib/$multiarch/libcrypto.a" "$prefix/lib/"
# nlohmann_json's package finds its headers relative to itself: copies, so that is PREFIX.
cp /usr/share/cmake/nlohmann_json/*.cmake "$prefix/share/cmake/nlohmann_json/"

# zig, with the target and its cache (the build folder's, not $HOME's) baked in.
cache=$(dirname "$prefix")/zig-cache  # kept when PREFIX is remade: zig builds libc++ once
for tool in c++ ar ranlib; do
  case $tool in
    c++) args="c++ -target $arch-linux-gnu.2.28" ;;
    *) args=$tool ;;
  esac
  cat > "$prefix/bin/zig-$tool" <<EOF
#!/bin/sh
ZIG_GLOBAL_CACHE_DIR=\${ZIG_GLOBAL_CACHE_DIR:-$cache} exec "$zig" $args "\$@"
EOF
  chmod +x "$prefix/bin/zig-$tool"
done
cp "$src/cmake/zig-toolchain.cmake" "$prefix/toolchain.cmake"
echo "$prefix/toolchain.cmake"
