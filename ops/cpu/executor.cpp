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

void run_program_cpu(const Program& prog, const std::vector<Tensor>& inputs,
                     const std::vector<Tensor>& outputs) {
  static const bool avx512 = cpu_avx512::available();
  static const bool avx2 = cpu_avx2::available();
  if (avx512)
    cpu_avx512::run(prog, inputs, outputs);
  else if (avx2)
    cpu_avx2::run(prog, inputs, outputs);
  else
    cpu_base::run(prog, inputs, outputs);
}

}  // namespace cl
