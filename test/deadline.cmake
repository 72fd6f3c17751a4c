# Deadlines inside the host backend (CallOptions::interrupt): a late peer makes the others give
# up in time and leaves the backend down; an interrupt that never fires changes no bit.
add_executable(deadline_test mpi/deadline_test.cc)
target_link_libraries(deadline_test PRIVATE poseidon_mpi_test_main)
psd_add_mpi_test(deadline_test NP 2 3 5 TIMEOUT 120 LABELS deadline)
# At the odd world sizes, the exact-value checks only: the late-peer cases sleep 1.5 s each
# whatever the size (13 s a run), and run above.
add_executable(deadline_values_test ALIAS deadline_test)
psd_add_mpi_test(deadline_values_test NP ${POSEIDON_TEST_NPS_ODD} TIMEOUT 120 LABELS deadline
                 ARGS --gtest_filter=*NeverFiring*:PolledAgreement.*)
