#include "cuda_digest_kernels.h"

#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cuda_driver.h"
#include "gpu_digest_job.h"

namespace weightd {

namespace {

constexpr const char* kKernelFile = "weightd-digests.fatbin";

// The kernel's image, read once per process from WEIGHTD_DIGEST_KERNEL when set (a kernel built
// elsewhere; the fake driver's tests), else from beside the addon (CMakeLists.txt and
// native/gpu/build-kernel.sh put it there); `missing` says why there is none.
struct KernelImage {
  std::vector<char> bytes;
  std::string missing;
};

const KernelImage& kernelImage() {
  static KernelImage image;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string path;
    Dl_info self{};
    if (const char* chosen = getenv("WEIGHTD_DIGEST_KERNEL"); chosen && *chosen) {
      path = chosen;
    } else if (dladdr(reinterpret_cast<void*>(&kernelImage), &self) && self.dli_fname) {
      path = self.dli_fname;
      path = path.substr(0, path.find_last_of('/') + 1) + kKernelFile;
    } else {
      image.missing = "cannot tell where the addon was loaded from, so not where its GPU digest kernel is";
      return;
    }
    std::ifstream in(path, std::ios::binary);
    if (in) image.bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (image.bytes.empty()) {
      image.missing = "no GPU digest kernel at " + path +
                      ": the addon was built where nvcc was not; build the kernel with native/gpu/build-kernel.sh";
    }
  });
  return image;
}

std::mutex cacheMutex;
// By context id. Never destroyed: at exit the driver unloads what its contexts hold. One entry per
// context the process ever made with a fill in it (24 bytes each).
auto& cache = *new std::unordered_map<unsigned long long, DigestKernels>();

}  // namespace

const std::string& digestKernelMissing() { return kernelImage().missing; }

DigestKernels digestKernels() {
  const KernelImage& image = kernelImage();
  if (!image.missing.empty()) throw DeviceError("E_CUDA", image.missing);
  const CudaDriver& drv = cudaDriver();
  CUcontext context = nullptr;
  drv.cuCtxGetCurrent(&context);
  unsigned long long id = 0;
  drv.cuCtxGetId(context, &id);
  // Held while loading: two fills of one context load it once (a load is ~0.5 ms).
  std::lock_guard<std::mutex> lock(cacheMutex);
  if (auto found = cache.find(id); found != cache.end()) return {found->second.hash, found->second.copy, 0};
  const auto loading = std::chrono::steady_clock::now();
  CUmodule module = nullptr;
  drv.cuModuleLoadData(&module, image.bytes.data());
  DigestKernels kernels;
  const char* name = WEIGHTD_NAME_OF(WEIGHTD_HASH_KERNEL);
  if (drv.cuModuleGetFunction.raw(&kernels.hash, module, name) != CUDA_SUCCESS) {
    drv.cuModuleUnload.raw(module);
    throw DeviceError("E_CUDA", std::string("the GPU digest kernel file has no kernel ") + name +
                                    ": it was built from another version's source; rebuild it with native/gpu/build-kernel.sh");
  }
  // A kernel file built before the copying kernel existed has only the other: a pull's copies are
  // then all the driver's.
  if (drv.cuModuleGetFunction.raw(&kernels.copy, module, WEIGHTD_NAME_OF(WEIGHTD_COPY_KERNEL)) != CUDA_SUCCESS) kernels.copy = nullptr;
  cache.emplace(id, kernels);
  kernels.loadMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - loading).count();
  return kernels;
}

void preloadDigestKernels() {
  try {
    digestKernels();
  } catch (const DeviceError&) {
    // The fill that needs them fails the same way and hashes on the CPU, saying why.
  }
}

}  // namespace weightd
