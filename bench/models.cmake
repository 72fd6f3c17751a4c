# Model-level benchmarks: poseidon_model_trainer (a model-shaped training loop with emulated
# compute and real exchanges), driven by bench/study/ (shared memory) and bench/cluster/
# (emulated hosts in network namespaces). The model shapes are bench/common's.
add_executable(poseidon_model_trainer cluster/model_trainer.cc cluster/trainer_options.cc)
target_link_libraries(poseidon_model_trainer PRIVATE poseidon_model_shape poseidon_engine)

# Smoke test: the small model, two ranks, every mode, a few iterations; the trainer exits 3
# when any rank's averaged gradient differs from the average recomputed from the seeds.
if(POSEIDON_BUILD_TESTS)
  enable_testing()  # bench/ is added before test/; its tests need testing on here too
  psd_add_mpi_test(poseidon_model_trainer NP 2 TIMEOUT 120
    ARGS --model small --iters 2 --warmup 1 --modes dense,dense-overlap,hybrid-overlap,hybrid
         --predict 2,8 --print-plan
    ENV POSEIDON_COST_CACHE=${CMAKE_CURRENT_BINARY_DIR}/model_trainer_cost_cache.txt
    LABELS bench)
endif()
