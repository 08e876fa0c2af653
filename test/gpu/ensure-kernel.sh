# Sourced by the GPU scripts: an addon built where nvcc is not (the build machine) has no GPU digest
# kernel beside it, and its fills hash on the CPU (native/cuda_digests.h). Build the kernel here,
# with this machine's nvcc, for this machine's GPU, into build/Release/weightd-digests.fatbin.
kernel_nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
kernel_arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
if [ -x "$kernel_nvcc" ] && [ -n "$kernel_arch" ]; then
  echo "== $(date +%T) GPU digest kernel: $kernel_nvcc for sm_$kernel_arch"
  bash native/gpu/build-kernel.sh "$kernel_nvcc" build/Release/weightd-digests.fatbin "$kernel_arch" ||
    echo "the GPU digest kernel did not build: fills hash their digests on the CPU"
else
  echo "no nvcc ($kernel_nvcc) or no GPU: fills hash their digests on the CPU"
fi
