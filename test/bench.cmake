# Smoke tests of the OSU-style benchmarks (bench/osu): a few sizes, few runs, every timed result
# checked against the exact formula; a program exits 1 when any #wrong > 0, failing the test.
# The threshold and chunk are lowered so the sizes cover both the MPI path and the
# shared-memory path over many chunks. Each program runs a different element type.
if(TARGET osu_allreduce)
  set(_osu_env POSEIDON_SHM_THRESHOLD_BYTES=16384 POSEIDON_SHM_CHUNK_BYTES=8192)
  set(_osu_args -m 4:1M -i 3 -x 1 -f)
  psd_add_mpi_test(osu_allreduce NP 2 3 4 TIMEOUT 90 LABELS bench ARGS ${_osu_args}
                   ENV ${_osu_env})
  psd_add_mpi_test(osu_reduce_scatter NP 2 3 4 TIMEOUT 90 LABELS bench
                   ARGS ${_osu_args} -T float64 --per-rank ENV ${_osu_env})
  psd_add_mpi_test(osu_allgather NP 2 3 4 TIMEOUT 90 LABELS bench
                   ARGS ${_osu_args} -T float16 --json --per-rank ENV ${_osu_env})
  # The broadcast from a root other than 0, timed between the harness's own node barriers
  # (--barrier node: bench/osu/node_barrier.h), at a world size of 3 too.
  psd_add_mpi_test(osu_broadcast NP 2 3 TIMEOUT 90 LABELS bench
                   ARGS ${_osu_args} -T int32 -r 1 --barrier node --per-rank ENV ${_osu_env})
  # Both columns on node-shared buffers (Backend::AllocShared): above 32 KiB every rank's
  # allreduce sums straight between them; the other programs run on them as on any memory.
  add_executable(osu_allreduce_registered ALIAS osu_allreduce)
  psd_add_mpi_test(osu_allreduce_registered NP 2 3 4 TIMEOUT 90 LABELS bench
                   ARGS -m 4:4M -i 3 -x 1 -T bfloat16 --registered ENV ${_osu_env})
  add_executable(osu_allgather_registered ALIAS osu_allgather)
  psd_add_mpi_test(osu_allgather_registered NP 3 TIMEOUT 90 LABELS bench
                   ARGS ${_osu_args} --registered ENV ${_osu_env})

  # The harness's node barrier itself: no rank leaves early; a missing rank named at the deadline.
  add_executable(node_barrier_test mpi/node_barrier_test.cc)
  target_link_libraries(node_barrier_test PRIVATE poseidon_osu_harness GTest::gtest)
  psd_add_mpi_test(node_barrier_test NP 1 2 3 TIMEOUT 60 LABELS bench)

  # bench/osu/best_peer.py end to end on a few sizes: the default and one algorithm, one
  # repetition, then one confirmation run of the pick; it exits 1 on any wrong result, and the
  # table must carry the confirmed columns.
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    add_test(NAME best_peer_smoke COMMAND bash -c
      "set -o pipefail; '${Python3_EXECUTABLE}' '${PROJECT_SOURCE_DIR}/bench/osu/best_peer.py' allreduce --build '${PROJECT_BINARY_DIR}' --mpirun '${MPIEXEC_EXECUTABLE}' -np 2 -m 4:64 -r 1 -i 3 -x 1 --algorithms 1 --segsizes '' --confirm 1 --timeout 60 | grep 'confirmed best / ours'")
    set_tests_properties(best_peer_smoke PROPERTIES TIMEOUT 180 LABELS "mpi;bench"
      ENVIRONMENT "${POSEIDON_MPI_TEST_ENV}")
    # bench/osu/standing.py (one table from best_peer.py's JSON files) on synthetic documents:
    # grouping, spans, floors, --check's status, and its errors.
    add_test(NAME standing_script COMMAND ${Python3_EXECUTABLE}
      ${PROJECT_SOURCE_DIR}/test/python/standing_test.py ${PROJECT_SOURCE_DIR})
    set_tests_properties(standing_script PROPERTIES TIMEOUT 120 LABELS "unit;bench")
  endif()

  # Option errors, one process (MPI singleton): clear messages, exit status 2.
  add_test(NAME osu_bad_size_range COMMAND osu_allreduce -m 5:2)
  set_tests_properties(osu_bad_size_range PROPERTIES TIMEOUT 30 LABELS bench
    ENVIRONMENT "${POSEIDON_MPI_TEST_ENV}" PASS_REGULAR_EXPRESSION "MIN 5 > MAX 2")
  add_test(NAME osu_registered_elsewhere COMMAND osu_topk --registered)
  set_tests_properties(osu_registered_elsewhere PROPERTIES TIMEOUT 30 LABELS bench
    ENVIRONMENT "${POSEIDON_MPI_TEST_ENV}" PASS_REGULAR_EXPRESSION "keeps its own buffers")
  add_test(NAME osu_bad_barrier COMMAND osu_broadcast --barrier tree)
  set_tests_properties(osu_bad_barrier PROPERTIES TIMEOUT 30 LABELS bench
    ENVIRONMENT "${POSEIDON_MPI_TEST_ENV}" PASS_REGULAR_EXPRESSION "expected mpi or node")
  if(NOT POSEIDON_CUDA_ENABLED)
    add_test(NAME osu_cuda_unavailable COMMAND osu_allgather -d cuda)
    set_tests_properties(osu_cuda_unavailable PROPERTIES TIMEOUT 30 LABELS bench
      ENVIRONMENT "${POSEIDON_MPI_TEST_ENV}" PASS_REGULAR_EXPRESSION "this build has no CUDA")
  endif()
endif()

# osu_topk and osu_hybrid: exact inputs (k known non-zeros per rank; integer factors), every
# timed result checked, exit 1 on #wrong > 0. osu_hybrid forces topk on the small model's
# sparse layers (none fall back: min elements 0), so one run exchanges layers with topk and,
# for the FC layers where topk does not apply, sfb or allreduce as the planner picks; np 3
# checks a non-power-of-two average.
if(TARGET osu_topk)
  psd_add_mpi_test(osu_topk NP 2 3 TIMEOUT 90 LABELS bench
                   ARGS -m 4:1M -i 3 -x 1 -D 0.01 -f ENV ${_osu_env})
  psd_add_mpi_test(osu_hybrid NP 2 3 TIMEOUT 120 LABELS bench
                   ARGS --model small --sparse --density 0.01 -i 3 -x 1 -f --json
                   ENV POSEIDON_STRATEGY=topk POSEIDON_TOPK_MIN_ELEMENTS=0)
  add_test(NAME osu_topk_bad_density COMMAND osu_topk -D 1.5)
  set_tests_properties(osu_topk_bad_density PROPERTIES TIMEOUT 30 LABELS bench
    ENVIRONMENT "${POSEIDON_MPI_TEST_ENV}" PASS_REGULAR_EXPRESSION "option -D: '1.5'")
  add_test(NAME osu_hybrid_bad_model COMMAND osu_hybrid --model vgg20)
  set_tests_properties(osu_hybrid_bad_model PROPERTIES TIMEOUT 30 LABELS bench
    ENVIRONMENT "${POSEIDON_MPI_TEST_ENV}" PASS_REGULAR_EXPRESSION "'vgg20' is unknown")
endif()
