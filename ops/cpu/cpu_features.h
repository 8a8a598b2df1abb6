// The x86 features of the CPU castlab runs on, for the parts of castlab that follow a
// library's run-time choice of code path (oneDNN's JIT ISA for gelu: python/castlab/_onednn.py).
#pragma once
#include <string>

namespace cl {

// Does this CPU have the feature? Names as GCC's __builtin_cpu_supports spells them:
// "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512vnni", "avx512bf16",
// "avx512fp16".
// False for any other name, and on non-x86 machines.
bool cpu_has(const std::string& feature);

}  // namespace cl
