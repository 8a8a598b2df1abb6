// cpu_features.h: __builtin_cpu_supports needs a literal name, hence the table.
#include "ops/cpu/cpu_features.h"

namespace cl {

bool cpu_has(const std::string& feature) {
#if defined(__x86_64__) || defined(__i386__)
#define CL_FEATURE(name) \
  if (feature == name) return __builtin_cpu_supports(name);
  CL_FEATURE("avx2")
  CL_FEATURE("fma")
  CL_FEATURE("avx512f")
  CL_FEATURE("avx512bw")
  CL_FEATURE("avx512vl")
  CL_FEATURE("avx512dq")
  CL_FEATURE("avx512vnni")
  CL_FEATURE("avx512bf16")
  CL_FEATURE("avx512fp16")
#undef CL_FEATURE
#endif
  return false;
}

}  // namespace cl
