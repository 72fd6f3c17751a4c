// OwnedKernelBuffer (kernels/owned_buffer.h): a block, its size and memory kind, and the free
// function it is handed to on destruction.
#include "kernels/owned_buffer.h"

namespace poseidon {

OwnedKernelBuffer::OwnedKernelBuffer(void* data, size_t bytes, MemoryKind memory,
                                     FreeFn free_fn)
    : data_(data), bytes_(bytes), memory_(memory), free_fn_(free_fn) {}

OwnedKernelBuffer::~OwnedKernelBuffer() {
  if (data_ != nullptr) free_fn_(data_);
}

}  // namespace poseidon
