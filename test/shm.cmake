# Shared-memory collectives (runtime/shm_collectives.*), direct and through MpiBackend.
add_executable(shm_collectives_test mpi/shm_collectives_test.cc mpi/shm_backend_test.cc
               mpi/shm_regions_test.cc)
target_link_libraries(shm_collectives_test PRIVATE poseidon_mpi_test_main)
psd_add_mpi_test(shm_collectives_test NP ${POSEIDON_TEST_NPS} TIMEOUT 240 LABELS shm)
# At the odd world sizes, bfloat16 only (the dtype whose rounding of the sums shows there; every
# collective and both chunk sizes), the error cases, the sleeping waiters and settings that
# differ on one rank, the broadcasts across the slots: about 5 s each instead of 15-20.
add_executable(shm_collectives_bf16_test ALIAS shm_collectives_test)
psd_add_mpi_test(shm_collectives_bf16_test NP ${POSEIDON_TEST_NPS_ODD} TIMEOUT 120 LABELS shm
                 ARGS --gtest_filter=*bfloat16*:ShmErrors.*:ShmSleepers.*:*SettingsChangedOnOneRank*:ShmAcross.*:ShmRegions.*:ShmSharedBackend.*)
# The two-level allreduce, nodes emulated by giving each rank its node: every world size, since
# which splits exist depends on P's divisors (6: 3x2 and 2x3; 9: 3x3; 7: none, refusals only).
add_executable(hier_allreduce_test mpi/hier_allreduce_test.cc)
target_link_libraries(hier_allreduce_test PRIVATE poseidon_mpi_test_main)
psd_add_mpi_test(hier_allreduce_test NP ${POSEIDON_TEST_NPS} ${POSEIDON_TEST_NPS_ODD} TIMEOUT 120
                 LABELS shm)
