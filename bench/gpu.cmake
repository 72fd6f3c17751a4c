# GPU benchmarks: the fused top-k select against a full CUB radix sort and a device copy of the
# same traffic (CUDA-event timing, medians). Prints "no GPU: skipped" and exits 0 without a GPU.
#   build-cuda/bench/topk_gpu_bench
# bench/gpu/topk_torch.py times torch.topk on the same sizes for the comparison on a GPU machine.
if(POSEIDON_CUDA_ENABLED AND TARGET poseidon_kernels_cuda)
  find_package(benchmark REQUIRED)
  add_executable(topk_gpu_bench gpu/topk_gpu_bench.cu)
  target_link_libraries(topk_gpu_bench PRIVATE poseidon_kernels_cuda poseidon_bench_common
                                               benchmark::benchmark)
endif()
