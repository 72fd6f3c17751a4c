# Agreement of settings across ranks (runtime/agreement.*): each Agreed setting differing on
# one rank must fail Communicator::Create on every rank, with the variable, values and ranks.
add_executable(agreement_test mpi/agreement_test.cc)
target_link_libraries(agreement_test PRIVATE poseidon_mpi_test_main)
psd_add_mpi_test(agreement_test NP 2 3 5 ${POSEIDON_TEST_NPS_ODD} TIMEOUT 120 LABELS agreement)

# End to end: a setting exported to one rank only through mpirun's MPMD form (mpirun -np 1
# -x VAR=VALUE prog : -np 2 prog) must end the job with a non-zero exit and the message on
# every rank, not a hang or wrong values.
add_executable(agreement_create mpi/agreement_create.cc)
target_link_libraries(agreement_create PRIVATE poseidon_runtime)
function(psd_agreement_mpmd_test position var value groups)
  string(REPLACE ";" " " flags "${POSEIDON_MPIRUN_FLAGS}")
  set(name agreement_mpmd_${position}_np3)
  add_test(NAME ${name}
    COMMAND ${CMAKE_COMMAND} -DMPIEXEC=${MPIEXEC_EXECUTABLE} "-DFLAGS=${flags}"
            -DPROG=$<TARGET_FILE:agreement_create> -DVAR=${var} -DVALUE=${value}
            -DPOSITION=${position} -DNP=3 -DTIMEOUT=60
            "-DEXPECT=Mismatch: Communicator::Create: ${var} differs across ranks \\(${groups}\\)"
            -P ${CMAKE_CURRENT_SOURCE_DIR}/mpi/agreement_mpmd.cmake)
  set_tests_properties(${name} PROPERTIES TIMEOUT 90 ENVIRONMENT "${POSEIDON_MPI_TEST_ENV}"
    LABELS "mpi;agreement")
endfunction()
psd_agreement_mpmd_test(first POSEIDON_FUSION_BYTES 0 "rank 0: 0; ranks 1-2: 4194304")
psd_agreement_mpmd_test(last POSEIDON_SHM_THRESHOLD_BYTES 0 "ranks 0-1: 1; rank 2: 0")
