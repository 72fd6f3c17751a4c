# The engine (engine): pure pieces alone, then the engine under mpirun.
add_executable(engine_unit_test engine/engine_unit_test.cc)
target_link_libraries(engine_unit_test PRIVATE poseidon_engine GTest::gtest_main)
add_test(NAME engine_unit_test COMMAND engine_unit_test)
set_tests_properties(engine_unit_test PROPERTIES TIMEOUT 60 LABELS "unit;engine"
                     ENVIRONMENT "${POSEIDON_TSAN_TEST_ENV}")

add_executable(engine_test engine/engine_test.cc engine/engine_faults_test.cc)
target_link_libraries(engine_test PRIVATE poseidon_engine poseidon_mpi_test_main)
set(_psd_engine_env POSEIDON_LOG_LEVEL=warn)
psd_add_mpi_test(engine_test NP ${POSEIDON_TEST_NPS} ${POSEIDON_TEST_NPS_ODD} TIMEOUT 120 LABELS engine
                 ENV ${_psd_engine_env})
