# Python tests (bindings/python): the module on numpy / torch and poseidon.torch's Horovod API
# against torch.distributed's gloo, under mpirun with a timeout, at np 2 and 4. They run
# Debian's /usr/bin/python3 (where python3-torch / numpy live) when present; the module and the
# package come from this build and the source tree through PYTHONPATH.
if(NOT TARGET _poseidon)
  return()
endif()
if(EXISTS /usr/bin/python3)
  set(_psd_default_test_python /usr/bin/python3)
else()
  set(_psd_default_test_python ${Python3_EXECUTABLE})
endif()
set(POSEIDON_TEST_PYTHON ${_psd_default_test_python} CACHE FILEPATH
    "Python interpreter for the Python tests (needs numpy and torch)")
string(JOIN ":" _psd_pythonpath ${PROJECT_SOURCE_DIR}/bindings/python
       ${PROJECT_BINARY_DIR}/bindings/python /usr/lib/python3/dist-packages)

# psd_add_python_mpi_test(<name> <script> NP <n...> [TIMEOUT <s>] [ARGS ...]): like
# psd_add_mpi_test for a Python script (exit code 77 = skipped, e.g. torch missing).
function(psd_add_python_mpi_test name script)
  cmake_parse_arguments(T "" "TIMEOUT" "NP;ARGS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  foreach(np IN LISTS T_NP)
    add_test(NAME ${name}_np${np}
      COMMAND timeout -k 10 ${T_TIMEOUT} ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np}
              ${POSEIDON_MPIRUN_FLAGS} -x PYTHONPATH -x POSEIDON_COST_CACHE
              ${POSEIDON_TEST_PYTHON} ${script} ${T_ARGS})
    math(EXPR ctest_timeout "${T_TIMEOUT} + 30")
    set(cache ${PROJECT_BINARY_DIR}/test/python-cost-np${np}.txt)
    set_tests_properties(${name}_np${np} PROPERTIES TIMEOUT ${ctest_timeout}
      ENVIRONMENT
        "${POSEIDON_MPI_TEST_ENV};PYTHONPATH=${_psd_pythonpath};POSEIDON_COST_CACHE=${cache}"
      LABELS "mpi;python" SKIP_RETURN_CODE 77)
  endforeach()
endfunction()

psd_add_python_mpi_test(python_module ${CMAKE_CURRENT_SOURCE_DIR}/python/module_test.py
                        NP 1 2 4 TIMEOUT 120)
# Node-shared memory (Comm.alloc_shared): exact collectives over it, the refusals of free and
# destroy while arrays live, on one rank or on all; np 3 and 5 for world sizes that are odd.
psd_add_python_mpi_test(python_shared_memory
                        ${CMAKE_CURRENT_SOURCE_DIR}/python/shared_memory_test.py
                        NP 1 2 3 5 TIMEOUT 120)
# poseidonrun (python -m poseidon.run): the mpirun command it builds, and real jobs at np 2 (the
# POSEIDON_ variables and the world size on every rank, exit codes, --timeout). No OMPI_*
# variables here: the launcher itself must make mpirun run as root and oversubscribe.
add_test(NAME python_launcher
  COMMAND timeout -k 10 150 ${POSEIDON_TEST_PYTHON}
          ${CMAKE_CURRENT_SOURCE_DIR}/python/launcher_test.py --mpirun ${MPIEXEC_EXECUTABLE})
set(_psd_launcher_cache ${PROJECT_BINARY_DIR}/test/python-cost-np2.txt)
set_tests_properties(python_launcher PROPERTIES TIMEOUT 180
  ENVIRONMENT "PYTHONPATH=${_psd_pythonpath};POSEIDON_COST_CACHE=${_psd_launcher_cache}"
  LABELS "mpi;python")
psd_add_python_mpi_test(python_torch_train
                        ${CMAKE_CURRENT_SOURCE_DIR}/python/torch_train_test.py NP 2 4 TIMEOUT 240)
psd_add_python_mpi_test(python_train_example
                        ${PROJECT_SOURCE_DIR}/examples/python/train_torch.py NP 2 TIMEOUT 120
                        ARGS --steps 40)
psd_add_python_mpi_test(python_hvd_optimizer
                        ${CMAKE_CURRENT_SOURCE_DIR}/python/hvd_optimizer_test.py NP 2 4 TIMEOUT 240)
# poseidon.torch's Horovod API case by case, and the Horovod-style example using every name.
psd_add_python_mpi_test(python_hvd_api ${CMAKE_CURRENT_SOURCE_DIR}/python/hvd_api_test.py
                        NP 2 4 TIMEOUT 120)
psd_add_python_mpi_test(python_horovod_style_example
                        ${PROJECT_SOURCE_DIR}/examples/python/horovod_style.py NP 2 TIMEOUT 120)
