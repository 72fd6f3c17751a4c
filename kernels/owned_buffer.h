// OwnedKernelBuffer: the KernelBuffer that Kernels::Allocate returns on every implementation. It
// owns a block that the implementation allocated (and zero-filled), records its size and memory
// kind, and hands the block to the implementation's free function when destroyed. Host code
// only: built into poseidon_kernels_contract, so the CPU kernels need no CUDA to use it.
#pragma once

#include <cstddef>

#include "kernels/kernels.h"

namespace poseidon {

class OwnedKernelBuffer final : public KernelBuffer {
 public:
  // Frees a block; called once, on a non-null data only.
  using FreeFn = void (*)(void* data);

  // Takes ownership of data (bytes long, in memory of kind memory); data is null when bytes is
  // 0, and free_fn is then never called.
  OwnedKernelBuffer(void* data, size_t bytes, MemoryKind memory, FreeFn free_fn);
  ~OwnedKernelBuffer() override;
  OwnedKernelBuffer(const OwnedKernelBuffer&) = delete;
  OwnedKernelBuffer& operator=(const OwnedKernelBuffer&) = delete;

  void* data() const override { return data_; }
  size_t bytes() const override { return bytes_; }
  MemoryKind memory() const override { return memory_; }

 private:
  void* data_;
  size_t bytes_;
  MemoryKind memory_;
  FreeFn free_fn_;
};

}  // namespace poseidon
