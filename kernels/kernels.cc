// Picks the Kernels implementation for a memory kind.
#include "kernels/kernels.h"

#include "runtime/build_config.h"
#if POSEIDON_CUDA_ENABLED
#include "kernels/cuda/cuda_kernels.h"
#endif

namespace poseidon {

Result<const Kernels*> KernelsFor(MemoryKind memory) {
  switch (memory) {
    case MemoryKind::kHost:
      return &CpuKernels();
    case MemoryKind::kDevice:
#if POSEIDON_CUDA_ENABLED
      // The CUDA twin (kernels/cuda); without a GPU its calls fail with the CUDA error.
      return &CudaKernels();
#else
      return UnavailableError("KernelsFor: no kernels for device memory in this build (CUDA=",
                              POSEIDON_CUDA_ENABLED ? "on" : "off",
                              "); expected host memory, or a build with the CUDA kernels");
#endif
  }
  return InvalidArgument("KernelsFor: unknown memory kind ", static_cast<int>(memory),
                         "; expected host (0) or device (1)");
}

}  // namespace poseidon
