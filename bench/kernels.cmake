# CPU kernel benchmarks (Google Benchmark), with their peers (memcpy, std::nth_element) in the
# same binary. Full run, one core:  taskset -c 0 build/bench/kernels_cpu_bench
find_package(benchmark REQUIRED)
add_executable(kernels_cpu_bench kernels_cpu_bench.cc)
target_link_libraries(kernels_cpu_bench PRIVATE poseidon_kernels_cpu poseidon_bench_common
                      benchmark::benchmark)
target_include_directories(kernels_cpu_bench PRIVATE ${POSEIDON_CBLAS_INCLUDE})
