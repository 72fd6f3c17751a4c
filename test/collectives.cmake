# The hybrid collective: process-local tests (planner, cost formulas, plan and cost-model text)
# and multi-rank tests (strategies against dense references, top-k invariants, errors that fail
# every rank, the cost-model probe and its cache).
add_executable(collectives_unit_test collectives/collectives_unit_test.cc)
target_link_libraries(collectives_unit_test PRIVATE poseidon_collectives GTest::gtest_main)
add_test(NAME collectives_unit_test COMMAND collectives_unit_test)
set_tests_properties(collectives_unit_test PROPERTIES TIMEOUT 60 LABELS "unit;collectives")

add_executable(hybrid_test collectives/hybrid_test.cc collectives/hybrid_topk_test.cc)
target_link_libraries(hybrid_test PRIVATE poseidon_collectives poseidon_mpi_test_main)
psd_add_mpi_test(hybrid_test NP 1 2 3 4 5 8 ${POSEIDON_TEST_NPS_ODD} TIMEOUT 120 LABELS collectives)

add_executable(cost_model_test collectives/cost_model_test.cc)
target_link_libraries(cost_model_test PRIVATE poseidon_collectives poseidon_mpi_test_main)
psd_add_mpi_test(cost_model_test NP 1 2 4 TIMEOUT 120 LABELS collectives)

