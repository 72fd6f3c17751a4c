# Does the planner pick what is fastest here? Per layer, every strategy measured against its
# predicted time, then a model step of the planner's plan against the all-allreduce peer:
#   mpirun -np 4 build/bench/poseidon_hybrid_bench [--iters 5] [--model vgg19 --scale 0.0625]
add_executable(poseidon_hybrid_bench planner/hybrid_bench.cc)
target_link_libraries(poseidon_hybrid_bench PRIVATE poseidon_model_shape poseidon_collectives)

# Smoke run (exit status only, never timing): two ranks, one step per case, the small model.
if(POSEIDON_BUILD_TESTS)
  enable_testing()
  psd_add_mpi_test(poseidon_hybrid_bench NP 2 TIMEOUT 120 LABELS bench
    ARGS --iters 1 --model small --scale 0.5
    ENV POSEIDON_COST_CACHE=${CMAKE_CURRENT_BINARY_DIR}/hybrid_bench_cost_cache.txt)
endif()
