# Shared-memory collectives (runtime/shm_collectives.*), direct and through MpiBackend.
add_executable(shm_collectives_test mpi/shm_collectives_test.cc)
target_link_libraries(shm_collectives_test PRIVATE poseidon_mpi_test_main)
psd_add_mpi_test(shm_collectives_test NP ${POSEIDON_TEST_NPS} TIMEOUT 240 LABELS shm)
