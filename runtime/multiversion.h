// PSD_MULTIVERSION: compile a hot element-wise loop twice, for AVX2 and for the x86-64 baseline,
// and pick one at load time by the CPU (GCC / Clang target_clones, glibc ifunc). The build
// targets the x86-64 baseline (SSE2, 4 floats per vector); AVX2 doubles the width.
//
// Bitwise results do not depend on the clone: the AVX2 target does not enable FMA, so no
// multiply-add is contracted, and the marked loops are element-wise (no reduction is
// reassociated). Ranks on different CPUs therefore still compute identical bits.
//
// Elsewhere (other architectures, compilers without the attribute) it expands to nothing, and
// under ThreadSanitizer too: the ifunc resolver runs while the dynamic loader relocates the
// program, before the TSan runtime is initialized, and its instrumented code crashes there.
#pragma once

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PSD_THREAD_SANITIZER 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define PSD_THREAD_SANITIZER 1
#endif

#if defined(__x86_64__) && defined(__has_attribute) && !defined(PSD_THREAD_SANITIZER)
#if __has_attribute(target_clones)
#define PSD_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#endif
#endif

#ifndef PSD_MULTIVERSION
#define PSD_MULTIVERSION
#endif
