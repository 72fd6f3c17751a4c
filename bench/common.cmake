# What the benchmarks share (bench/common):
#   poseidon_bench_common  the preamble each program prints before its figures (preamble.h),
#                          with the one flag parser (tools/flags.h, poseidon_flags); runtime only
#   poseidon_model_shape   the models as the benchmarks run them (model_shape.h): FLOPs per layer,
#                          shrinking by --scale, the --model / --scale / --batch flags
add_library(poseidon_bench_common STATIC common/preamble.cc)
target_link_libraries(poseidon_bench_common PUBLIC poseidon_runtime poseidon_flags)

add_library(poseidon_model_shape STATIC common/model_shape.cc)
target_link_libraries(poseidon_model_shape PUBLIC poseidon_models poseidon_bench_common)
