// The CPU executor: evaluates a Program block by block. A block is up to kBlock
// output elements (several rows when the innermost dimension is short). Each
// instruction runs as one tight loop over the block, so the compiler vectorises the
// arithmetic; loads and stores gather/scatter through the operands' strides.
// The loops live in executor_impl.h, compiled here for the baseline ISA and in
// executor_avx2.cpp for AVX2+FMA; run_program_cpu picks one at run time.
#include <string>

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

namespace {
const char* const kOpNames[kOpCount] = {
    "load",  "const",    "neg",       "abs",    "exp",          "log",        "sigmoid", "silu",
    "tanh",  "gelu_erf", "gelu_tanh", "sqrt",   "rsqrt",        "reciprocal", "square",  "cos",
    "sin",   "erf",      "add",       "sub",    "mul",          "div",        "maximum", "minimum",
    "pow",   "eq",       "ne",        "lt",     "le",           "gt",         "ge",      "fma",
    "where", "round",    "to_f64",    "to_f32", "rand_uniform", "rand_normal"};
}  // namespace

const char* op_name(int op) { return op >= 0 && op < kOpCount ? kOpNames[op] : "?"; }

bool Program::uses_random() const {
  for (const auto& o : outputs)
    if (o.mode == kStochastic) return true;
  for (const auto& i : code) {
    if (i.op == kOpRound && i.mode == kStochastic) return true;
    if (i.op == kOpRandUniform || i.op == kOpRandNormal) return true;
  }
  return false;
}

std::string Program::str() const {
  std::string os;
  auto reg = [](int r) { return " r" + std::to_string(r); };
  for (const auto& i : code) {
    os += "r" + std::to_string(i.dst) + (i.f64 ? ":f64" : ":f32") + " = " + op_name(i.op);
    if (i.op == kOpLoad)
      os += " in" + std::to_string(i.aux) + " (" +
            dtype_info(static_cast<DTypeCode>(i.dtype)).short_name + ")";
    if (i.op == kOpConst) os += " " + std::to_string(i.imm);
    if (i.a >= 0) os += reg(i.a);
    if (i.b >= 0) os += reg(i.b);
    if (i.c >= 0) os += reg(i.c);
    if (i.op == kOpRound)
      os += std::string(" -> ") + dtype_info(static_cast<DTypeCode>(i.dtype)).short_name +
            " mode=" + std::to_string(i.mode);
    if (i.var) os += " var=" + std::to_string(i.var);
    os += "\n";
  }
  for (size_t k = 0; k < outputs.size(); ++k)
    os += "out" + std::to_string(k) + " <- r" + std::to_string(outputs[k].reg) + "\n";
  return os;
}

void run_program_cpu(const Program& prog, const std::vector<Tensor>& inputs,
                     const std::vector<Tensor>& outputs) {
  static const bool avx2 = cpu_avx2::available();
  if (avx2)
    cpu_avx2::run(prog, inputs, outputs);
  else
    cpu_base::run(prog, inputs, outputs);
}

}  // namespace cl
