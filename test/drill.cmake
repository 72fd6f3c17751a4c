# Liveness drills on the real job (poseidon_mlp), label "drill". Included by test/CMakeLists.txt.
#
# A frozen rank (the trainer's --stop-rank: SIGSTOP on itself, mid-step of iteration 50) must
# end the job, not hang it: with a peer timeout of 2 s and a grace of 0.5 s, mpirun must exit
# non-zero within timeout + grace + 6 s of the stop (and 20 s of the launch: start-up, the cost
# model and 50 steps on a shared 2-core machine), and a survivor must name the stopped rank
# ("lost peer rank R"). At np 3 and 4 with the planner's choice, and at np 3 with sfb and ps
# forced (other wires: allgathers of factors, a parameter server).
#
# A slow rank (the trainer's --sleep-rank: its training thread asleep for 3x the peer timeout,
# its process running) must not be declared lost: exit 0, training complete.
#
# test/drill/trainer_fault_test.sh runs mpirun under `timeout -k 5 60` and kills by a marker
# whatever mpirun leaves behind (and fails then). scripts/drill-frozen-rank.sh is the longer,
# randomised version of the same drill (a stop from outside, at a random moment).
if(TARGET poseidon_mlp)
  set(_psd_drill ${CMAKE_CURRENT_SOURCE_DIR}/drill/trainer_fault_test.sh)
  set(_psd_drill_args --iters 400 --log-every 100 --no-print-plan)
  set(_psd_drill_cases "3:auto" "4:auto" "3:sfb" "3:ps")
  foreach(case IN LISTS _psd_drill_cases)
    string(REPLACE ":" ";" case "${case}")
    list(GET case 0 np)
    list(GET case 1 strategy)
    math(EXPR last "${np} - 1")
    if(strategy STREQUAL "auto")
      set(name drill_frozen_rank_np${np})
    else()
      set(name drill_frozen_rank_${strategy}_np${np})
    endif()
    add_test(NAME ${name}
      COMMAND bash ${_psd_drill} lost 8.5 20 ${MPIEXEC_EXECUTABLE} ${np} $<TARGET_FILE:poseidon_mlp>
              ${POSEIDON_MPIRUN_FLAGS} -- ${_psd_drill_args} --strategy ${strategy}
              --stop-rank ${last} --stop-at-iter 50)
    set_tests_properties(${name} PROPERTIES TIMEOUT 90 LABELS "mpi;drill" SKIP_RETURN_CODE 77
      ENVIRONMENT "${POSEIDON_MPI_TEST_ENV};POSEIDON_PEER_TIMEOUT_S=2;POSEIDON_PEER_LOST_GRACE_S=0.5")
  endforeach()

  add_test(NAME drill_slow_rank_np3
    COMMAND bash ${_psd_drill} alive 0 45 ${MPIEXEC_EXECUTABLE} 3 $<TARGET_FILE:poseidon_mlp>
            ${POSEIDON_MPIRUN_FLAGS} -- ${_psd_drill_args}
            --sleep-rank 1 --sleep-at-iter 50 --sleep-s 3)
  set_tests_properties(drill_slow_rank_np3 PROPERTIES TIMEOUT 90 LABELS "mpi;drill"
    SKIP_RETURN_CODE 77 ENVIRONMENT "${POSEIDON_MPI_TEST_ENV};POSEIDON_PEER_TIMEOUT_S=1")
endif()
