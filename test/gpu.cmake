# GPU tests (label "gpu"). They build wherever CUDA is built. Each binary's tests are split in
# two ctest entries: the argument checks and no-GPU failure paths, which run (and must pass)
# everywhere, and the comparisons that need a device, which ctest reports as skipped where the
# output says "no usable GPU" (the CUDA error string follows it; see ctest -V).

# The device backends' logic that needs no GPU (deadlines, the NCCL watchdog's rule, scratch
# growth, the ReduceScatter plan): a unit test that runs in every build.
add_executable(device_backend_logic_test unit/device_backend_logic_test.cc)
target_link_libraries(device_backend_logic_test PRIVATE poseidon_runtime GTest::gtest_main)
add_test(NAME device_backend_logic_test COMMAND device_backend_logic_test)
set_tests_properties(device_backend_logic_test PROPERTIES TIMEOUT 60 LABELS "unit;gpu")

if(POSEIDON_CUDA_ENABLED AND TARGET poseidon_kernels_cuda)
  set(_psd_no_gpu "no usable GPU")

  # The CUDA kernels against the CPU kernels (plain binary).
  add_executable(cuda_kernels_test gpu/cuda_kernels_test.cc)
  target_link_libraries(cuda_kernels_test PRIVATE poseidon_kernels GTest::gtest_main)
  add_test(NAME cuda_kernels_args_test COMMAND cuda_kernels_test
           --gtest_filter=CudaKernelsSeam.*:CudaKernelsArgs.*:CudaKernelsNoGpu.*)
  set_tests_properties(cuda_kernels_args_test PROPERTIES TIMEOUT 60 LABELS gpu)
  add_test(NAME cuda_kernels_test COMMAND cuda_kernels_test
           --gtest_filter=CudaKernels.*:CudaTopKPath.*:Shapes/CudaTopK.*)
  set_tests_properties(cuda_kernels_test PROPERTIES TIMEOUT 120 LABELS gpu
                       SKIP_REGULAR_EXPRESSION "${_psd_no_gpu}")

  # Edge cases of the CUDA kernels against the CPU kernels: special values, ties, odd sizes,
  # workspaces, streams, a CUDA graph, n > 2^31 (CudaEdgeBig.*, skipped without the memory).
  add_executable(cuda_edge_test gpu/cuda_edge_test.cc gpu/cuda_edge_test_calls.cc)
  target_link_libraries(cuda_edge_test PRIVATE poseidon_kernels GTest::gtest_main)
  add_test(NAME cuda_edge_test COMMAND cuda_edge_test)
  set_tests_properties(cuda_edge_test PROPERTIES TIMEOUT 300 LABELS gpu
                       SKIP_REGULAR_EXPRESSION "${_psd_no_gpu}")

  # The device backends (NCCL, MPI-staged) under mpirun; ranks share the one GPU at np > 1.
  add_executable(device_backend_test gpu/device_backend_test.cc)
  target_link_libraries(device_backend_test PRIVATE poseidon_mpi_test_main)
  psd_add_mpi_test(device_backend_test NP 1 2 4 TIMEOUT 60 LABELS gpu
                   ARGS --gtest_filter=-DeviceBackendGpu.*)
  add_executable(device_backend_gpu_test ALIAS device_backend_test)
  psd_add_mpi_test(device_backend_gpu_test NP 1 2 4 TIMEOUT 120 LABELS gpu
                   ARGS --gtest_filter=DeviceBackendGpu.*)
  foreach(np 1 2 4)
    set_tests_properties(device_backend_gpu_test_np${np} PROPERTIES
                         SKIP_REGULAR_EXPRESSION "${_psd_no_gpu}")
  endforeach()

  # The hybrid collective and the engine on device memory against host memory, through the
  # MPI-staged device backend (ranks share the one GPU at np 2).
  add_executable(hybrid_device_test gpu/hybrid_device_test.cc)
  target_link_libraries(hybrid_device_test PRIVATE poseidon_engine poseidon_mpi_test_main)
  psd_add_mpi_test(hybrid_device_test NP 1 2 TIMEOUT 60 LABELS gpu
                   ARGS --gtest_filter=-DeviceHybridGpu.*:DeviceHybridGraph.*
                   ENV POSEIDON_DEVICE_BACKEND=staged)
  add_executable(hybrid_device_gpu_test ALIAS hybrid_device_test)
  psd_add_mpi_test(hybrid_device_gpu_test NP 1 2 TIMEOUT 120 LABELS gpu
                   ARGS --gtest_filter=DeviceHybridGpu.* ENV POSEIDON_DEVICE_BACKEND=staged)
  foreach(np 1 2)
    set_tests_properties(hybrid_device_gpu_test_np${np} PROPERTIES
                         SKIP_REGULAR_EXPRESSION "${_psd_no_gpu}")
  endforeach()
  # One top-k exchange captured in a CUDA graph: one rank over NCCL.
  add_executable(hybrid_device_graph_test ALIAS hybrid_device_test)
  psd_add_mpi_test(hybrid_device_graph_test NP 1 TIMEOUT 120 LABELS gpu
                   ARGS --gtest_filter=DeviceHybridGraph.* ENV POSEIDON_DEVICE_BACKEND=nccl)
  set_tests_properties(hybrid_device_graph_test_np1 PROPERTIES
                       SKIP_REGULAR_EXPRESSION "${_psd_no_gpu}")

  # The GPU benchmark binary runs once, briefly: without a GPU it must print its skip line and
  # exit 0 (reported as skipped).
  if(TARGET topk_gpu_bench)
    add_test(NAME topk_gpu_bench_smoke
             COMMAND topk_gpu_bench --benchmark_filter=BM_FusedTopK/1048576/100/)
    set_tests_properties(topk_gpu_bench_smoke PROPERTIES TIMEOUT 120 LABELS "gpu;bench"
                         SKIP_REGULAR_EXPRESSION "no GPU: skipped")
  endif()
endif()
