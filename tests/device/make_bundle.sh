#!/bin/bash
# Packs what the GPU checks need from this machine's build into .gpu/ (ignored by git), for the
# device tool's `carry`: the three programs stripped, and every shared library they load that the
# device image lacks (Debian's gloo, OpenBLAS and their dependencies; the image has CUDA 13 with
# cuBLAS and NCCL, and glibc/libstdc++ newer than Debian 12's).
#   tests/device/make_bundle.sh [BUILD_DIR]      (default: build)
# Then: device run with carry [".gpu"] and command `bash tests/device/gpu_checks.sh`.
set -euo pipefail
build=${1:-build}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
rm -rf .gpu && mkdir -p .gpu/bin .gpu/lib
for program in cpprun cpprun-mnist cpprun-store; do
  strip -o ".gpu/bin/$program" "$build/$program"
done
# The device has these (system or CUDA 13); everything else ldd names is carried.
skip='^(linux-vdso|libc\.so|libm\.so|ld-linux|libstdc\+\+|libgcc_s|libdl\.so|libpthread|librt\.so|libz\.so|libcuda|libcudart|libcublas|libnccl)'
for program in .gpu/bin/*; do
  ldd "$program" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ ! $name =~ $skip ]]; then cp -L "$path" ".gpu/lib/$name"; fi
done
du -sh .gpu/bin .gpu/lib
ls .gpu/lib
