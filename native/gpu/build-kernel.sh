#!/usr/bin/env bash
# Builds the fill's GPU digest kernel (xxh3_pieces.cu) into a fatbin: SASS for each GPU generation
# in ARCHS (so loading it costs no JIT) plus PTX of the last, for newer GPUs. The addon loads it
# from beside itself (native/cuda_digests.cpp); without it, fills hash their digests on the CPU.
# CMakeLists.txt runs this where it finds nvcc; on a machine whose build had none (the addon built
# elsewhere and carried), run it there:
#   bash native/gpu/build-kernel.sh NVCC OUT [ARCHS]     e.g. nvcc build/Release/weightd-digests.fatbin 90
# ARCHS: space- or ;-separated sm numbers; default 75 80 86 89 90.
set -euo pipefail
nvcc=$1 out=$2 archs=${3:-75 80 86 89 90}
here=$(cd "$(dirname "$0")" && pwd)
gencode=()
for arch in ${archs//;/ }; do gencode+=(-gencode "arch=compute_$arch,code=sm_$arch"); newest=$arch; done
gencode+=(-gencode "arch=compute_$newest,code=compute_$newest")
mkdir -p "$(dirname "$out")"
"$nvcc" --fatbin -std=c++17 -O3 --threads 0 "${gencode[@]}" "$here/xxh3_pieces.cu" -o "$out.tmp"
mv "$out.tmp" "$out"
