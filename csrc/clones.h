// FASTPIPE_CLONES: compile a hot loop for AVX2 and for the x86-64 baseline, picked at load time (GNU ifunc),
// so one build is fast on every machine. Only where ifunc exists: Linux with GCC or Clang on x86-64.
#pragma once

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__INTEL_COMPILER)
#define FASTPIPE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FASTPIPE_CLONES
#endif
