// The CPU executor compiled for AVX2 + FMA (see executor_impl.h). Where the compiler
// or CPU lacks them, the baseline build runs instead.
#include "ops/program.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#define CL_EXEC_NS cpu_avx2
#include "ops/cpu/executor_impl.h"
#undef CL_EXEC_NS
namespace cl {
namespace cpu_avx2 {
bool available() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
}  // namespace cpu_avx2
}  // namespace cl
#else
namespace cl {
namespace cpu_avx2 {
bool available() { return false; }
void run(const Program&, const std::vector<Tensor>&, const std::vector<Tensor>&) {}
}  // namespace cpu_avx2
}  // namespace cl
#endif
