# OSU-style collective benchmarks: one program per operation over one harness library, each
# printing Open MPI's own call for the same size beside ours. Other areas add programs with
# psd_add_osu_bench(<name> <source>) (e.g. the top-k and hybrid exchanges).
#   mpirun -np 4 --oversubscribe build/bench/osu/osu_allreduce -m 1K:64M -f
add_library(poseidon_osu_harness STATIC osu/harness.cc)
target_link_libraries(poseidon_osu_harness PUBLIC poseidon_runtime)
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

# The sparse top-k exchange of one layer and the hybrid exchange of a model's layer table,
# through HybridCollective, against MPI_Allreduce of the same dense gradients:
#   mpirun -np 4 --oversubscribe build/bench/osu/osu_topk -m 4K:64M -D 0.001 -f
#   mpirun -np 4 --oversubscribe build/bench/osu/osu_hybrid --model resnet152 --scale 0.25 -f
psd_add_osu_bench(osu_topk osu/osu_topk.cc)
target_link_libraries(osu_topk PRIVATE poseidon_collectives)
psd_add_osu_bench(osu_hybrid osu/osu_hybrid.cc)
target_link_libraries(osu_hybrid PRIVATE poseidon_collectives poseidon_model_shape)
