#!/usr/bin/env bash
# Builds the fill's GPU digest kernel (xxh3_pieces.cu) into a fatbin: SASS for each GPU generation
# in ARCHS (so loading it costs no JIT) plus PTX of the last, for newer GPUs. The addon loads it
# from beside itself (native/cuda_digests.cpp); without it, fills hash their digests on the CPU.
# CMakeLists.txt runs this where it finds nvcc; on a machine whose build had none (the addon built
# elsewhere and carried), run it there:
#   bash native/gpu/build-kernel.sh [--optional] NVCC OUT [ARCHS]     e.g. nvcc build/Release/weightd-digests.fatbin 90
# ARCHS: space- or ;-separated sm numbers; default 75 80 86 89 90. Generations this nvcc cannot
# build (not in `nvcc --list-gpu-arch`) are left out, with a warning.
# --optional (the build's way): where nvcc cannot build the kernel at all, warn, leave no kernel
# (not even an older one) and exit 0, so the addon still builds; fills then hash on the CPU.
set -euo pipefail
optional=false
if [ "${1:-}" = --optional ]; then optional=true; shift; fi
nvcc=$1 out=$2 archs=${3:-75 80 86 89 90}
here=$(cd "$(dirname "$0")" && pwd)

# No kernel: an error, or with --optional a warning, and no kernel file left behind.
no_kernel() {
  rm -f "$out" "$out.tmp"
  if $optional; then
    echo "build-kernel: WARNING: no GPU digest kernel: $1; the addon is built without it and fills hash their digests on the CPU (native/gpu/build-kernel.sh builds it later)" >&2
    exit 0
  fi
  echo "build-kernel: $1" >&2
  exit 1
}

# An nvcc too old to list its generations is given them all, as asked.
kept=()
if known=$("$nvcc" --list-gpu-arch 2>/dev/null); then
  for arch in ${archs//;/ }; do
    if grep -qx "compute_$arch" <<<"$known"; then kept+=("$arch")
    else echo "build-kernel: warning: $nvcc cannot build sm_$arch: the kernel leaves it out (a GPU of that generation runs the PTX of an older one, or hashes on the CPU)" >&2
    fi
  done
else
  read -ra kept <<<"${archs//;/ }"
fi
[ "${#kept[@]}" -gt 0 ] || no_kernel "$nvcc can build none of sm ${archs//;/ }"

gencode=()
for arch in "${kept[@]}"; do gencode+=(-gencode "arch=compute_$arch,code=sm_$arch"); newest=$arch; done
gencode+=(-gencode "arch=compute_$newest,code=compute_$newest")
mkdir -p "$(dirname "$out")"
"$nvcc" --fatbin -std=c++17 -O3 --threads 0 "${gencode[@]}" "$here/xxh3_pieces.cu" -o "$out.tmp" || no_kernel "$nvcc failed (exit $?) building $here/xxh3_pieces.cu for sm ${kept[*]}"
mv "$out.tmp" "$out"
