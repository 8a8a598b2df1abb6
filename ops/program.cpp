#include "ops/program.h"

#include <cstring>
#include <stdexcept>
#include <string>

namespace cl {

const char* reg_type_name(int rt) {
  switch (rt) {
    case kRegF32: return "f32";
    case kRegF64: return "f64";
    case kRegI64: return "i64";
  }
  return "?";
}

const char* reg_type_cxx(int rt) {
  switch (rt) {
    case kRegF32: return "float";
    case kRegF64: return "double";
    case kRegI64: return "long long";
  }
  throw std::invalid_argument("unknown register type " + std::to_string(rt));
}

std::vector<uint8_t> Program::reg_types() const {
  std::vector<uint8_t> t(n_regs > 0 ? static_cast<size_t>(n_regs) : 0, kRegF32);
  for (const Instr& in : code)
    if (in.dst >= 0 && in.dst < n_regs) t[in.dst] = in.rtype;
  return t;
}

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
    os += "r" + std::to_string(i.dst) + ":" + reg_type_name(i.rtype) + " = " + op_name(i.op);
    if (i.op == kOpLoad)
      os += " in" + std::to_string(i.aux) + " (" +
            dtype_info(static_cast<DTypeCode>(i.dtype)).short_name + ")";
    if (i.op == kOpConst)
      os += " " + (i.rtype == kRegI64 ? std::to_string(i.iimm) : std::to_string(i.imm));
    if (i.op == kOpToI64)
      os += std::string(" (") + dtype_info(static_cast<DTypeCode>(i.dtype)).short_name + ")";
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
    if (in.rtype > kRegI64) bad(at + "rtype must be 0 (float), 1 (double) or 2 (int64)");
    if (in.dst < 0 || in.dst >= n_regs) bad(at + "destination register out of range");
    const int arity = op_info(in.op).arity;
    const int32_t regs[3] = {in.a, in.b, in.c};
    for (int j = 0; j < 3; ++j) {
      if (regs[j] < -1 || regs[j] >= n_regs) bad(at + "operand register out of range");
      if (j < arity && regs[j] < 0)
        bad(at + op_name(in.op) + " needs " + std::to_string(arity) + " operands");
    }
    if ((in.op == kOpRound || in.op == kOpToF64 || in.op == kOpToF32 || in.op == kOpToI64) &&
        in.a < 0)
      bad(at + op_name(in.op) + " needs an operand");
    if ((in.op == kOpLoad || in.op == kOpRound) && in.dtype >= kNumDTypes)
      bad(at + "unknown dtype code " + std::to_string(in.dtype));
    if (in.op == kOpRound && in.mode > kStochastic) bad(at + "unknown rounding mode");
    if (in.op == kOpLoad && in.aux < 0) bad(at + "negative input index");
  }
  // Register types: one per register, and int64 registers only where integers are exact.
  std::vector<int> rt(static_cast<size_t>(n_regs), -1);
  for (size_t k = 0; k < code.size(); ++k) {
    const Instr& in = code[k];
    if (rt[in.dst] >= 0 && rt[in.dst] != in.rtype)
      bad("register r" + std::to_string(in.dst) + " holds both " + reg_type_name(rt[in.dst]) +
          " and " + reg_type_name(in.rtype));
    rt[in.dst] = in.rtype;
  }
  auto is_int_fmt = [](int dt) { return dt == kBool || dt == kInt32 || dt == kInt64; };
  for (size_t k = 0; k < code.size(); ++k) {
    const Instr& in = code[k];
    const std::string at = "instruction " + std::to_string(k) + " (" + op_name(in.op) + "): ";
    const bool i64 = in.rtype == kRegI64;
    switch (in.op) {
      case kOpLoad:
        if (i64 && !is_int_fmt(in.dtype))
          bad(at + "an int64 register loads only bool, int32 or int64 inputs");
        break;
      case kOpConst: break;
      case kOpToF64:
        if (in.rtype != kRegF64) bad(at + "the destination must be a double register");
        break;
      case kOpToF32:
        if (in.rtype != kRegF32) bad(at + "the destination must be a float register");
        break;
      case kOpToI64:
        if (!i64) bad(at + "the destination must be an int64 register");
        if (!is_int_fmt(in.dtype)) bad(at + "the target format must be bool, int32 or int64");
        break;
      case kOpRound:
      case kOpRandUniform:
      case kOpRandNormal:
        if (i64 || (in.op == kOpRound && rt[in.a] == kRegI64))
          bad(at + "not defined on int64 registers");
        break;
      default: {
        const OpCategory cat = op_info(in.op).category;
        if (i64 && cat != kCatCompare && cat != kCatSelect)
          bad(at + "int64 registers take only comparisons and where");
        const int32_t regs[3] = {in.a, in.b, in.c};
        for (int j = 0; j < op_info(in.op).arity; ++j) {
          const int t = rt[regs[j]];
          if (t >= 0 && (t == kRegI64 || i64) && t != in.rtype)
            bad(at + "operand r" + std::to_string(regs[j]) + " is " + reg_type_name(t) +
                ", the instruction computes in " + reg_type_name(in.rtype));
        }
      }
    }
  }
  for (const OutputSpec& o : outputs) {
    if (o.reg < 0 || o.reg >= n_regs) bad("output register out of range");
    if (o.mode > kStochastic) bad("unknown rounding mode of an output");
  }
}

}  // namespace cl
