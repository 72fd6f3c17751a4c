# Overlap benchmark: iteration time with compute alone, exchange alone, both in sequence, and
# both overlapped by the engine (wait-free backprop), in one run. Example:
#   mpirun -np 4 --oversubscribe build/bench/poseidon_overlap_bench --iters=20
#   mpirun -np 4 --oversubscribe build/bench/poseidon_overlap_bench --model=resnet152 \
#       --scale=0.05 --compute-ms=60
add_executable(poseidon_overlap_bench overlap/overlap_bench.cc)
target_link_libraries(poseidon_overlap_bench PRIVATE poseidon_model_shape poseidon_engine)

# Smoke run (exit status only, never timing): two ranks, two iterations.
if(POSEIDON_BUILD_TESTS)
  enable_testing()
  psd_add_mpi_test(poseidon_overlap_bench NP 2 TIMEOUT 60 LABELS "bench;engine"
                   ARGS --iters=2 --warmup=1)
endif()
