// poseidon-info: what this build of Poseidon contains and how it is configured.
// Prints the version, the build configuration, the backends and every POSEIDON_* setting
// with its current value, its source (default / env) and its help text.
#include <cstdio>
#include <cstring>
#include <string>

#include "runtime/build_config.h"
#if POSEIDON_CUDA_ENABLED
#include "runtime/cuda_util.h"
#endif
#include "runtime/settings.h"

int main(int argc, char** argv) {
  using poseidon::Settings;
  bool brief = argc > 1 && std::strcmp(argv[1], "--brief") == 0;
  if (argc > 1 && !brief) {
    std::fprintf(stderr, "usage: poseidon-info [--brief]\n");
    return 2;
  }
  std::printf("Poseidon %s\n\n", POSEIDON_VERSION_STRING);
  std::printf("Build\n");
  std::printf("  build type      %s\n", POSEIDON_BUILD_TYPE);
  std::printf("  compiler        %s\n", POSEIDON_COMPILER);
  std::printf("  CUDA            %s", POSEIDON_CUDA_ENABLED ? "on" : "off");
  if (POSEIDON_CUDA_ENABLED) std::printf(" (archs %s)", POSEIDON_CUDA_ARCHITECTURES);
  std::printf("\n  NCCL            %s\n", POSEIDON_NCCL_ENABLED ? "on" : "off");
  std::printf("  BLAS            %s\n", POSEIDON_BLAS_NAME);
  std::printf("  sanitizer       %s\n\n", std::strlen(POSEIDON_SANITIZE) ? POSEIDON_SANITIZE : "none");
  std::printf("Backends\n");
  std::printf("  mpi             host memory%s\n",
              POSEIDON_CUDA_ENABLED ? "; device memory staged through pinned host buffers" : "");
  if (POSEIDON_NCCL_ENABLED) std::printf("  nccl            device memory\n");
#if POSEIDON_CUDA_ENABLED
  // Devices and driver as this process sees them (the runtime API only, so this works and
  // explains itself on machines without a GPU or driver).
  std::printf("  devices         %s\n", poseidon::DescribeCudaDevices().c_str());
#else
  std::printf("  devices         none (built without CUDA)\n");
#endif
  std::printf("\nSettings (environment variables; also settable from the APIs)\n");
  auto snap = Settings::Global().Snapshot();
  size_t w = 0;
  for (const auto& s : snap) w = std::max(w, s.info.name.size());
  for (const auto& s : snap) {
    std::string value = s.value.empty() ? "''" : s.value;
    std::printf("  %-*s %-7s = %-12s (%s)\n", static_cast<int>(w), s.info.name.c_str(),
                poseidon::SettingTypeName(s.info.type), value.c_str(), s.source.c_str());
    if (!brief) std::printf("  %*s   %s\n", static_cast<int>(w), "", s.info.help.c_str());
  }
  poseidon::Status st = Settings::Global().Validate();
  if (!st.ok()) {
    std::printf("\nerror: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
