# GPU tests (label "gpu"): they build wherever CUDA is built and skip, with the CUDA error as
# the reason, where no GPU is usable. Argument checks and the no-GPU failure paths still run.
if(POSEIDON_CUDA_ENABLED AND TARGET poseidon_kernels_cuda)
  # The CUDA kernels against the CPU kernels (plain binary).
  add_executable(cuda_kernels_test gpu/cuda_kernels_test.cc)
  target_link_libraries(cuda_kernels_test PRIVATE poseidon_kernels GTest::gtest_main)
  add_test(NAME cuda_kernels_test COMMAND cuda_kernels_test)
  set_tests_properties(cuda_kernels_test PROPERTIES TIMEOUT 120 LABELS gpu)

  # The device backends (NCCL, MPI-staged) under mpirun; ranks share the one GPU at np > 1.
  add_executable(device_backend_test gpu/device_backend_test.cc)
  target_link_libraries(device_backend_test PRIVATE poseidon_mpi_test_main)
  psd_add_mpi_test(device_backend_test NP 1 2 4 TIMEOUT 120 LABELS gpu)

  # The GPU benchmark binary runs once, briefly: without a GPU it must print its skip line and
  # exit 0 (reported as skipped).
  if(TARGET topk_gpu_bench)
    add_test(NAME topk_gpu_bench_smoke
             COMMAND topk_gpu_bench --benchmark_filter=BM_FusedTopK/1048576/100/)
    set_tests_properties(topk_gpu_bench_smoke PROPERTIES TIMEOUT 120 LABELS "gpu;bench"
                         SKIP_REGULAR_EXPRESSION "no GPU: skipped")
  endif()
endif()
