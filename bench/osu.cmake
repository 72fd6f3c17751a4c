# OSU-style collective benchmarks: one program per operation over one harness library (split as
# nccl-tests splits its common code: bench/osu/harness.h), each printing Open MPI's own call for
# the same size beside ours. Other areas add programs with
# psd_add_osu_bench(<name> <source>) (e.g. the top-k and hybrid exchanges).
#   mpirun -np 4 --oversubscribe build/bench/osu/osu_allreduce -m 1K:64M -f
#   mpirun -np 4 --oversubscribe build/bench/osu/osu_broadcast -m 1K:64M -f [-r ROOT]
# MPI starts at the lowest thread level the program needs (single for these blocking ones);
# -t single|funneled|serialized|multiple asks for another, and the header names it. Each timed
# call sits between two MPI_Barrier calls, as in OSU's loop; --barrier node uses the harness's
# own shared-memory barrier instead (bench/osu/node_barrier.h: no MPI progress between calls).
# The peer column is Open MPI's default algorithm. bench/osu/best_peer.py runs a program once
# per coll_tuned configuration (the default, then every algorithm of the collective, and a few
# segment sizes for those that take one), repeated and interleaved, and prints per size our
# median time against Open MPI's default and its best configuration (a Markdown table for
# bench/RESULTS.md, or --json):
#   bench/osu/best_peer.py --build build allreduce -np 4 -m 1K:64M -r 5
add_library(poseidon_osu_harness STATIC
  osu/args.cc osu/collective.cc osu/buffers.cc osu/verify.cc osu/sparse_inputs.cc osu/report.cc
  osu/runner.cc osu/node_barrier.cc)
target_link_libraries(poseidon_osu_harness PUBLIC poseidon_bench_common poseidon_runtime)
if(POSEIDON_CUDA_ENABLED)
  target_link_libraries(poseidon_osu_harness PUBLIC CUDA::cudart)
endif()

function(psd_add_osu_bench name source)
  add_executable(${name} ${source})
  target_link_libraries(${name} PRIVATE poseidon_osu_harness)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench/osu)
endfunction()

psd_add_osu_bench(osu_allreduce osu/osu_allreduce.cc)
psd_add_osu_bench(osu_reduce_scatter osu/osu_reduce_scatter.cc)
psd_add_osu_bench(osu_allgather osu/osu_allgather.cc)
psd_add_osu_bench(osu_broadcast osu/osu_broadcast.cc)

# The sparse top-k exchange of one layer and the hybrid exchange of a model's layer table,
# through HybridCollective, against MPI_Allreduce of the same dense gradients:
#   mpirun -np 4 --oversubscribe build/bench/osu/osu_topk -m 4K:64M -D 0.001 -f
#   mpirun -np 4 --oversubscribe build/bench/osu/osu_hybrid --model resnet152 --scale 0.25 -f
psd_add_osu_bench(osu_topk osu/osu_topk.cc)
target_link_libraries(osu_topk PRIVATE poseidon_collectives)
psd_add_osu_bench(osu_hybrid osu/osu_hybrid.cc)
target_link_libraries(osu_hybrid PRIVATE poseidon_model_shape poseidon_collectives)
