// The CPU executor compiled for AVX512 (F, VL, BW, DQ) + FMA with 512-bit vectors (see
// executor_impl.h). The same IEEE operations as the other builds (no contraction, explicit
// fma only), in 16 lanes: torch_cpu's SLEEF functions run about twice as fast as in the
// AVX2 build on an AVX512 CPU (benchmarks/RESULTS.md). Where the compiler or CPU lacks
// these, the AVX2 or baseline build runs instead.
#include "ops/program.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512VL__) && \
    defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__FMA__)
#define CL_EXEC_NS cpu_avx512
#include "ops/cpu/executor_impl.h"
#undef CL_EXEC_NS
namespace cl {
namespace cpu_avx512 {
bool available() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("fma");
}
}  // namespace cpu_avx512
}  // namespace cl
#else
namespace cl {
namespace cpu_avx512 {
bool available() { return false; }
void run(const Program&, const std::vector<Tensor>&, const std::vector<Tensor>&) {}
}  // namespace cpu_avx512
}  // namespace cl
#endif
