// The OSU-style benchmarks' runner: the whole program around a Collective.
#pragma once

#include "bench/osu/collective.h"

namespace poseidon::osu {

// MPI init (MPI_Init_thread at -t's level), options, communicator, header, one row per size,
// exit status: 0 when every result was right, 1 when any #wrong > 0 or a call failed, 2 for
// bad options.
int RunMain(int argc, char** argv, Collective& collective);

}  // namespace poseidon::osu
