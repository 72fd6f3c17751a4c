// The checks psdRegisterLayer makes on a psdLayerConfig_t, apart from the registry so that they
// can run without MPI (test/fuzz/c_layer_config_fuzzer.cc). Internal; not installed.
#pragma once

#include "bindings/c/poseidon.h"
#include "collectives/layer.h"
#include "runtime/status.h"

namespace poseidon::capi {

// The config as a resolved LayerSpec (ResolveLayerSpec), or an invalid-argument error naming the
// layer, the field and the value. Reads only what the config points to (name, ndim extents of
// shape, candidates); any int in the enum fields is refused with a message, not trusted.
Result<LayerSpec> ToLayerSpec(const psdLayerConfig_t& config);

}  // namespace poseidon::capi
