// The CPU executor: evaluates a Program block by block. A block is up to kBlock
// output elements (several rows when the innermost dimension is short). Each
// instruction runs as one tight loop over the block, so the compiler vectorises the
// arithmetic; loads and stores gather/scatter through the operands' strides.
// The loops live in executor_impl.h, compiled here for the baseline ISA, in
// executor_avx2.cpp for AVX2+FMA and in executor_avx512.cpp for AVX512; run_program_cpu
// picks one at run time. All three compute the same bits.
#include "ops/program.h"

#define CL_EXEC_NS cpu_base
#include "ops/cpu/executor_impl.h"
#undef CL_EXEC_NS

namespace cl {

namespace cpu_avx2 {
bool available();
void run(const Program& prog, const std::vector<Tensor>& inputs,
         const std::vector<Tensor>& outputs);
}  // namespace cpu_avx2
namespace cpu_avx512 {
bool available();
void run(const Program& prog, const std::vector<Tensor>& inputs,
         const std::vector<Tensor>& outputs);
}  // namespace cpu_avx512

CpuIsa cpu_executor_isa() {
  static const CpuIsa isa = cpu_avx512::available() ? CpuIsa::kAvx512
                            : cpu_avx2::available() ? CpuIsa::kAvx2
                                                    : CpuIsa::kBaseline;
  return isa;
}

void run_program_cpu(const Program& prog, const std::vector<Tensor>& inputs,
                     const std::vector<Tensor>& outputs) {
  const CpuIsa isa = cpu_executor_isa();
  if (isa == CpuIsa::kAvx512)
    cpu_avx512::run(prog, inputs, outputs);
  else if (isa == CpuIsa::kAvx2)
    cpu_avx2::run(prog, inputs, outputs);
  else
    cpu_base::run(prog, inputs, outputs);
}

}  // namespace cl
