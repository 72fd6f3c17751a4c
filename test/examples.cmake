# Tests of the example trainers (examples/). Included by test/CMakeLists.txt.
if(TARGET poseidon_mlp)
  # The trainer's pieces, one process.
  add_executable(mlp_test ${PROJECT_SOURCE_DIR}/examples/mlp/mlp_test.cc)
  target_link_libraries(mlp_test PRIVATE poseidon_mlp_lib GTest::gtest_main)
  add_test(NAME mlp_test COMMAND mlp_test)
  set_tests_properties(mlp_test PROPERTIES TIMEOUT 60 LABELS unit)

  # A short real training run at 1, 2 and 4 ranks: it must lower the held-out loss by a clear
  # margin, reach the accuracy floor (chance is 10%; this run reaches 88-91%), and end
  # with bit-identical parameters on every rank (checked by the trainer itself).
  psd_add_mpi_test(poseidon_mlp NP 1 2 4 TIMEOUT 120 LABELS examples
    ARGS --iters 800 --samples 20000 --test-samples 4000 --log-every 200
         --check-loss-falls --min-accuracy 0.8)
endif()
