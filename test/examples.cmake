# Tests of the example trainers (examples/). Included by test/CMakeLists.txt.
if(TARGET poseidon_mlp)
  # The trainer's pieces, one process.
  add_executable(mlp_test ${PROJECT_SOURCE_DIR}/examples/mlp/mlp_test.cc)
  target_link_libraries(mlp_test PRIVATE poseidon_mlp_lib GTest::gtest_main)
  add_test(NAME mlp_test COMMAND mlp_test)
  set_tests_properties(mlp_test PROPERTIES TIMEOUT 60 LABELS unit)

  # A short real training run at 1, 2 and 4 ranks with the default exchange (planner's choice
  # per tensor, through the engine): it must lower the held-out loss by a clear margin, reach
  # the accuracy floor (chance is 10%; this run reaches 88-91%), and end with bit-identical
  # parameters on every rank (checked by the trainer itself).
  psd_add_mpi_test(poseidon_mlp NP 1 2 4 TIMEOUT 120 LABELS examples
    ARGS --iters 800 --samples 20000 --test-samples 4000 --log-every 200
         --check-loss-falls --min-accuracy 0.8)

  # The other drivers and strategies, each its own test name: psd_add_mpi_test names tests
  # after the target, so each gets an alias of the same executable.
  #  - synchronous HybridCollective::Exchange after the backward pass;
  #  - sfb and ps against the dense baseline trained in the same process from the same seed:
  #    lossless, so the accuracy must match within 0.5 points (it matches to rounding);
  #  - topk at 1% density, within 0.5 points of dense; it needs more steps than the lossless
  #    strategies to catch up (the residual delays small updates), and a 10000-sample held-out
  #    split keeps the sampling noise of the accuracy (about 0.3 points) under the tolerance.
  add_executable(poseidon_mlp_sync ALIAS poseidon_mlp)
  psd_add_mpi_test(poseidon_mlp_sync NP 2 TIMEOUT 120 LABELS examples
    ARGS --iters 800 --samples 20000 --test-samples 4000 --log-every 0 --no-engine
         --check-loss-falls --min-accuracy 0.8)
  foreach(strategy sfb ps)
    add_executable(poseidon_mlp_${strategy}_vs_dense ALIAS poseidon_mlp)
    psd_add_mpi_test(poseidon_mlp_${strategy}_vs_dense NP 2 4 TIMEOUT 120 LABELS examples
      ARGS --iters 800 --samples 20000 --test-samples 4000 --log-every 0 --no-print-plan
           --strategy ${strategy} --compare-to-dense --compare-tolerance 0.005)
  endforeach()
  add_executable(poseidon_mlp_topk_vs_dense ALIAS poseidon_mlp)
  psd_add_mpi_test(poseidon_mlp_topk_vs_dense NP 2 4 TIMEOUT 120 LABELS examples
    ARGS --iters 2000 --samples 20000 --test-samples 10000 --log-every 0 --no-print-plan
         --strategy topk --density 0.01 --compare-to-dense --compare-tolerance 0.005)

  # The identity check must catch a one-ulp difference on one rank and name that rank.
  add_executable(poseidon_mlp_corrupt ALIAS poseidon_mlp)
  psd_add_mpi_test(poseidon_mlp_corrupt NP 2 TIMEOUT 60 LABELS examples
    ARGS --iters 20 --samples 2000 --test-samples 500 --log-every 0 --no-print-plan
         --corrupt-rank 1)
  set_tests_properties(poseidon_mlp_corrupt_np2 PROPERTIES
    PASS_REGULAR_EXPRESSION "differing ranks \\(hash\\): 1 \\(")
endif()
