#!/usr/bin/env bash
# mpirun with what this project needs everywhere: root allowed, oversubscription allowed
# (more ranks than cores), yield when idle (latency stays sane when oversubscribed).
#   scripts/mpirun.sh -np 4 build/examples/poseidon_mlp
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
exec mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 "$@"
