#include "ops/program.h"

#include <cstring>
#include <stdexcept>
#include <string>

namespace cl {

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

namespace {
template <typename T>
void put(std::string* out, const T& v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof v);
}
}  // namespace

void Program::serialize(std::string* out) const {
  auto field = [out](const char*, const auto& v) { put(out, v); };
  put(out, static_cast<uint32_t>(code.size()));
  for (const Instr& in : code) for_each_field(in, field);
  put(out, n_regs);
  put(out, static_cast<uint32_t>(outputs.size()));
  for (const OutputSpec& o : outputs) for_each_field(o, field);
}

void Program::validate() const {
  auto bad = [](const std::string& m) { throw std::invalid_argument("Program: " + m); };
  if (n_regs < 0) bad("negative register count");
  for (size_t k = 0; k < code.size(); ++k) {
    const Instr& in = code[k];
    const std::string at = "instruction " + std::to_string(k) + ": ";
    if (in.op >= kOpCount) bad(at + "unknown opcode " + std::to_string(in.op));
    if (in.f64 > 1) bad(at + "f64 must be 0 or 1");
    if (in.dst < 0 || in.dst >= n_regs) bad(at + "destination register out of range");
    const int arity = op_info(in.op).arity;
    const int32_t regs[3] = {in.a, in.b, in.c};
    for (int j = 0; j < 3; ++j) {
      if (regs[j] < -1 || regs[j] >= n_regs) bad(at + "operand register out of range");
      if (j < arity && regs[j] < 0)
        bad(at + op_name(in.op) + " needs " + std::to_string(arity) + " operands");
    }
    if ((in.op == kOpRound || in.op == kOpToF64 || in.op == kOpToF32) && in.a < 0)
      bad(at + op_name(in.op) + " needs an operand");
    if ((in.op == kOpLoad || in.op == kOpRound) && in.dtype >= kNumDTypes)
      bad(at + "unknown dtype code " + std::to_string(in.dtype));
    if (in.op == kOpRound && in.mode > kStochastic) bad(at + "unknown rounding mode");
    if (in.op == kOpLoad && in.aux < 0) bad(at + "negative input index");
  }
  for (const OutputSpec& o : outputs) {
    if (o.reg < 0 || o.reg >= n_regs) bad("output register out of range");
    if (o.mode > kStochastic) bad("unknown rounding mode of an output");
  }
}

}  // namespace cl
