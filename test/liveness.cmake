# Peer liveness (runtime/liveness.h) and its heartbeat transport, under mpirun.
add_executable(liveness_test engine/liveness_test.cc)
target_link_libraries(liveness_test PRIVATE poseidon_engine poseidon_mpi_test_main)
set(_psd_liveness_env POSEIDON_LOG_LEVEL=warn)
# np 7 too (an odd size with many peers); its runs take about 8 s, mostly waiting on purpose.
psd_add_mpi_test(liveness_test NP 2 3 4 7 TIMEOUT 60 LABELS "engine;liveness"
                 ENV ${_psd_liveness_env})

# A frozen peer with abort on ends the job: the script checks mpirun's exit status, the time
# from the freeze to the end (peer timeout 1 s + grace 0.5 s + 3 s) and the "lost peer" line.
add_test(NAME liveness_abort_test_np3
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/engine/liveness_abort_test.sh 4.5
          ${MPIEXEC_EXECUTABLE} 3 $<TARGET_FILE:liveness_test> ${POSEIDON_MPIRUN_FLAGS})
set_tests_properties(liveness_abort_test_np3 PROPERTIES TIMEOUT 90
  ENVIRONMENT "${POSEIDON_MPI_TEST_ENV};${_psd_liveness_env}" LABELS "mpi;engine;liveness"
  SKIP_RETURN_CODE 77)
