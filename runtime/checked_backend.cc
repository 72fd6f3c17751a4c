#include "runtime/checked_backend.h"

namespace poseidon {

Status CheckedBackend::CheckElements(const char* call, size_t elements) const {
  (void)call, (void)elements;
  return Status::Ok();
}

Status CheckedBackend::WrongMemory(const Backend& b, const char* call, const CallOptions& opts) {
  return InvalidArgument(call, ": the ", b.name(), " backend was given ",
                         MemoryKindName(opts.memory), " memory; expected ",
                         MemoryKindName(opts.memory == MemoryKind::kHost ? MemoryKind::kDevice
                                                                         : MemoryKind::kHost),
                         " memory (each backend moves one kind: use the ",
                         opts.memory == MemoryKind::kHost ? "host" : "device",
                         " backend of the communicator for this buffer)");
}

Status CheckedBackend::BadRoot(const char* call, int root, int size) {
  return InvalidArgument(call, ": root ", root, " is outside 0..", size - 1);
}

Status CheckedBackend::GatherTooLarge(const char* call, size_t count, int size) {
  return InvalidArgument(call, ": count ", count, " from each of ", size,
                         " ranks is more than 2^64-1 elements in all; expected a gathered "
                         "buffer the recv buffer can hold");
}

Status CheckedBackend::FailTogether(const char* call, const Status& local,
                                    const Interrupt* interrupt) {
  Status ignored = Agree(CollectiveArgs{call, -1, 0, -1, 0, local}, interrupt);
  (void)ignored;  // this rank reports its own error, not the agreement's
  return local;
}

Result<std::unique_ptr<Request>> CheckedBackend::IAllReduce(const void* send, void* recv,
                                                            size_t count, DType dtype,
                                                            const CallOptions& opts) {
  PSD_CHECK(CheckSummed(*this, "IAllReduce", send, recv, count, dtype, opts));
  return DoIAllReduce(send, recv, count, dtype, opts);
}

}  // namespace poseidon
