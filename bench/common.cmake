# What the benchmarks share (bench/common):
#   poseidon_bench_common  one flag parser for every program (flags.h) and the preamble each
#                          prints before its figures (preamble.h); runtime only
#   poseidon_model_shape   the models as the benchmarks run them (model_shape.h): FLOPs per layer,
#                          shrinking by --scale, the --model / --scale / --batch flags
add_library(poseidon_bench_common STATIC common/flags.cc common/preamble.cc)
target_link_libraries(poseidon_bench_common PUBLIC poseidon_runtime)

add_library(poseidon_model_shape STATIC common/model_shape.cc)
target_link_libraries(poseidon_model_shape PUBLIC poseidon_models poseidon_bench_common)
