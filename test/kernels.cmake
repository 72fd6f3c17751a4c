# CPU kernels: unit tests (no MPI; linked with the dispatcher poseidon_kernels, whose KernelsFor
# they test too) and a smoke run of the kernel benchmark.
add_executable(kernels_cpu_test unit/kernels_cpu_test.cc unit/kernels_cpu_ops_test.cc)
target_link_libraries(kernels_cpu_test PRIVATE poseidon_kernels GTest::gtest_main)
add_test(NAME kernels_cpu_test COMMAND kernels_cpu_test)
# Under the sanitizers the top-k's large inputs run several times slower, once per instruction
# set the CPU offers: on an AVX-512 CPU (three sets) the AddressSanitizer pass took more than
# 120 s, where the plain pass took 28 s.
if(POSEIDON_SANITIZE)
  set(_psd_kernels_timeout 600)
else()
  set(_psd_kernels_timeout 120)
endif()
set_tests_properties(kernels_cpu_test PROPERTIES TIMEOUT ${_psd_kernels_timeout} LABELS unit)

# The GPU top-k's plan and a host model of its steps, and ScatterAddBlocks' fault protocol:
# the device design's logic, checked without a GPU.
add_executable(topk_device_plan_test unit/topk_device_plan_test.cc)
target_link_libraries(topk_device_plan_test PRIVATE poseidon_kernels GTest::gtest_main)
add_test(NAME topk_device_plan_test COMMAND topk_device_plan_test)
set_tests_properties(topk_device_plan_test PROPERTIES TIMEOUT 120 LABELS unit)

if(TARGET kernels_cpu_bench)
  # Every benchmark once at the small size, briefly: checks they run and verify their output.
  add_test(NAME kernels_cpu_bench_smoke
    COMMAND kernels_cpu_bench --benchmark_filter=/1048576 --benchmark_min_time=0.01)
  set_tests_properties(kernels_cpu_bench_smoke PROPERTIES TIMEOUT 120 LABELS "unit;bench")
endif()
