# Tests of the C ABI and the installed package (bindings/c, cmake/PoseidonInstall.cmake).
if(NOT TARGET poseidon)
  return()
endif()

# The C API from C, compiled as C99, against the shared library only.
add_executable(c_api_test bindings/c_api_test.c)
target_link_libraries(c_api_test PRIVATE poseidon)
set_target_properties(c_api_test PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
target_compile_options(c_api_test PRIVATE -Wall -Wextra -Werror -pedantic)
psd_add_mpi_test(c_api_test NP 1 2 3 4 ${POSEIDON_TEST_NPS_ODD} TIMEOUT 120 LABELS bindings)

# Error paths through the exported symbols (GoogleTest; np 1 races threads on one
# communicator, np 2 checks the cross-rank agreement on bad arguments).
add_executable(c_api_errors_test bindings/c_api_errors_test.cc)
target_link_libraries(c_api_errors_test PRIVATE poseidon GTest::gtest)
target_include_directories(c_api_errors_test PRIVATE ${PROJECT_SOURCE_DIR})  # test/gtest_ranks.h
psd_add_mpi_test(c_api_errors_test NP 1 2 ${POSEIDON_TEST_NPS_ODD} TIMEOUT 120 LABELS bindings)

# The C API over the engine across ranks: a submission refused on one rank fails every rank
# within seconds, huge psdWait timeouts wait for ever, a re-plan leaves no sticky error. np 7:
# an average whose 1/P is not a float (about 4 s a run, mostly waiting on purpose).
add_executable(c_api_engine_test bindings/c_api_engine_test.cc)
target_link_libraries(c_api_engine_test PRIVATE poseidon GTest::gtest)
target_include_directories(c_api_engine_test PRIVATE ${PROJECT_SOURCE_DIR})  # test/gtest_ranks.h
psd_add_mpi_test(c_api_engine_test NP 1 2 3 7 TIMEOUT 120 LABELS bindings)

# Only psd* symbols leave libposeidon.so.
add_test(NAME c_api_exports
  COMMAND ${CMAKE_COMMAND} -DLIB=$<TARGET_FILE:poseidon>
          -P ${CMAKE_CURRENT_SOURCE_DIR}/bindings/check_exports.cmake)
set_tests_properties(c_api_exports PROPERTIES TIMEOUT 60 LABELS bindings)

# The installed package: install into a temporary prefix, build test/bindings/external against
# it with find_package and with pkg-config, run both under mpirun.
add_test(NAME c_api_install
  COMMAND timeout -k 10 300 ${CMAKE_CURRENT_SOURCE_DIR}/bindings/install_test.sh
          ${PROJECT_BINARY_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/bindings/external
          ${CMAKE_COMMAND} ${MPIEXEC_EXECUTABLE} ${CMAKE_C_COMPILER})
set_tests_properties(c_api_install PROPERTIES TIMEOUT 330 LABELS "bindings;mpi"
  ENVIRONMENT "${POSEIDON_MPI_TEST_ENV};POSEIDON_MPIRUN_FLAGS=${POSEIDON_MPIRUN_FLAGS}")

# The C example.
if(POSEIDON_BUILD_EXAMPLES)
  add_executable(psd_allreduce_c ${PROJECT_SOURCE_DIR}/examples/c/psd_allreduce.c)
  target_link_libraries(psd_allreduce_c PRIVATE poseidon)
  set_target_properties(psd_allreduce_c PROPERTIES C_STANDARD 99 OUTPUT_NAME psd_allreduce)
  psd_add_mpi_test(psd_allreduce_c NP 2 TIMEOUT 60 LABELS "bindings;examples")
endif()
