# psd_add_mpi_test(<target> NP <n...> [TIMEOUT <s>] [ARGS ...])
# Registers <target>_np<n> for each n: mpirun with an oversubscribed launch, the variables that
# let root run mpirun, and a timeout so that no test can hang CI.
set(POSEIDON_MPIRUN_FLAGS --oversubscribe --bind-to none --mca mpi_yield_when_idle 1
    --mca btl self,vader,tcp CACHE STRING "Extra mpirun flags for tests")
set(POSEIDON_MPI_TEST_ENV
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1)
# POSEIDON_TSAN_TEST_ENV: under ThreadSanitizer (POSEIDON_SANITIZE=thread), the suppressions of
# Open MPI's uninstrumented hand-overs (test/engine/tsan.supp) and both stacks of a lock-order
# report. Every multi-rank test gets it through POSEIDON_MPI_TEST_ENV; a process-local test adds
# it to its ENVIRONMENT. Empty in other builds.
set(POSEIDON_TSAN_TEST_ENV "")
if(POSEIDON_SANITIZE STREQUAL "thread")
  set(_psd_tsan_supp ${PROJECT_SOURCE_DIR}/test/engine/tsan.supp)
  set(POSEIDON_TSAN_TEST_ENV "TSAN_OPTIONS=suppressions=${_psd_tsan_supp} second_deadlock_stack=1")
  list(APPEND POSEIDON_MPI_TEST_ENV "${POSEIDON_TSAN_TEST_ENV}")
endif()

function(psd_add_mpi_test target)
  cmake_parse_arguments(T "" "TIMEOUT" "NP;ARGS;LABELS;ENV" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  foreach(np IN LISTS T_NP)
    set(name ${target}_np${np})
    add_test(NAME ${name}
      COMMAND timeout -k 10 ${T_TIMEOUT} ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np}
              ${POSEIDON_MPIRUN_FLAGS} $<TARGET_FILE:${target}> ${T_ARGS})
    math(EXPR ctest_timeout "${T_TIMEOUT} + 30")
    set_tests_properties(${name} PROPERTIES TIMEOUT ${ctest_timeout}
      ENVIRONMENT "${POSEIDON_MPI_TEST_ENV};${T_ENV}" LABELS "mpi;${T_LABELS}"
      SKIP_RETURN_CODE 77)
  endforeach()
endfunction()
