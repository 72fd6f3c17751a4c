# Shared-memory collectives (runtime/shm_collectives.*), direct and through MpiBackend.
add_executable(shm_collectives_test mpi/shm_collectives_test.cc mpi/shm_backend_test.cc)
target_link_libraries(shm_collectives_test PRIVATE poseidon_mpi_test_main)
psd_add_mpi_test(shm_collectives_test NP ${POSEIDON_TEST_NPS} TIMEOUT 240 LABELS shm)
# At the odd world sizes, bfloat16 only (the dtype whose rounding of the sums shows there; every
# collective and both chunk sizes) and the error cases: about 4 s each instead of 15-20.
add_executable(shm_collectives_bf16_test ALIAS shm_collectives_test)
psd_add_mpi_test(shm_collectives_bf16_test NP ${POSEIDON_TEST_NPS_ODD} TIMEOUT 120 LABELS shm
                 ARGS --gtest_filter=*bfloat16*:ShmErrors.*)
