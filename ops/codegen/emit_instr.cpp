// Program instruction -> C++ expression (see emit_instr.h). Table ops call the scalar
// function the CPU executor calls (ops/op_table.h, ops/scalar/ops.h); the internal
// instructions (loads, constants, rounding, random numbers) are written out here.
#include "ops/codegen/emit_instr.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

namespace cl {
namespace codegen {

namespace {

// A double as an exact C++ literal (hex float; non-finite values by their bits).
std::string dlit(double v) {
  if (std::isfinite(v)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%a", v);
    return buf;
  }
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  char buf[64];
  std::snprintf(buf, sizeof buf, "cl::f64_from_bits(0x%016llxull)",
                static_cast<unsigned long long>(bits));
  return buf;
}

// Short name for reg_name in the cases below.
std::string R(int r) { return reg_name(r); }

// Widening load of an input's raw value into a register of type T (as load_rows).
std::string load_expr(int dt, bool f64, const std::string& x) {
  const char* T = f64 ? "double" : "float";
  switch (dt) {
    case kFloat64: return std::string("static_cast<") + T + ">(" + x + ")";
    case kFloat32: return std::string("static_cast<") + T + ">(" + x + ")";
    case kBFloat16: return std::string("static_cast<") + T + ">(cl::bf16_to_f32(" + x + "))";
    case kFloat16: return std::string("static_cast<") + T + ">(cl::f16_to_f32(" + x + "))";
    case kFloat8E4M3FN:
    case kFloat8E5M2:
      return std::string("static_cast<") + T + ">(cl::bits_to_f64(" + x + ", " +
             std::to_string(dt) + "))";
    case kBool: return "(" + x + " ? " + T + "(1) : " + T + "(0))";
    case kInt32:
    case kInt64: return std::string("static_cast<") + T + ">(" + x + ")";
  }
  throw std::invalid_argument("CUDA codegen: load of unsupported dtype");
}

// Load of a bool or integer input into an int64 register (exact).
std::string load_int_expr(int dt, const std::string& x) {
  switch (dt) {
    case kBool: return "(" + x + " ? 1LL : 0LL)";
    case kInt32:
    case kInt64: return "static_cast<long long>(" + x + ")";
  }
  throw std::invalid_argument("CUDA codegen: an int64 register loads integer inputs only");
}

// An int64 constant as an exact C++ expression.
std::string ilit(int64_t v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "static_cast<long long>(0x%016llxull)",
                static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

std::string reg_name(int r) { return "r" + std::to_string(r); }

std::string instr_expr(const Instr& in, const std::vector<bool>& wide, int nin) {
  const bool f64 = in.rtype == kRegF64;
  const bool i64 = in.rtype == kRegI64;
  const char* T = reg_type_cxx(in.rtype);
  const std::string t = T;
  const std::string d = R(in.dst);
  const std::string a = in.a >= 0 ? R(in.a) : d;
  const std::string bb = in.b >= 0 ? R(in.b) : d;
  const std::string c = in.c >= 0 ? R(in.c) : d;
  const std::string v = std::to_string(static_cast<int>(in.var));
  std::string ex;
  switch (in.op) {
    case kOpLoad:
      if (in.aux < 0 || in.aux >= nin) throw std::invalid_argument("program loads a missing input");
      if (i64)
        ex = load_int_expr(in.dtype, "x" + std::to_string(in.aux));
      else if (wide[in.aux] && in.dtype == kFloat16)
        ex = std::string("static_cast<") + T + ">(x" + std::to_string(in.aux) + ")";
      else
        ex = load_expr(in.dtype, f64, "x" + std::to_string(in.aux));
      break;
    case kOpConst: ex = i64 ? ilit(in.iimm) : "static_cast<" + t + ">(" + dlit(in.imm) + ")"; break;
    case kOpRound: {
      const std::string rb =
          in.mode == kStochastic
              ? "cl::random_bits(seed, " + std::to_string(static_cast<uint32_t>(in.aux)) + "u, e)"
              : std::string("0u");
      ex = std::string(f64 ? "cl::round_f64_to(" : "cl::round_f32_to(") + a + ", " +
           std::to_string(in.dtype) + ", " + std::to_string(in.mode) + ", " +
           (in.saturate ? "true" : "false") + ", " + rb + ")";
      break;
    }
    case kOpToF64: ex = "static_cast<double>(" + a + ")"; break;
    case kOpToF32: ex = "static_cast<float>(" + a + ")"; break;
    case kOpToI64:
      ex = "static_cast<long long>(cl::to_int_fmt(" + a + ", " + std::to_string(in.dtype) + "))";
      break;
    case kOpRandUniform:
      ex = "static_cast<" + t + ">(cl::rand_uniform(seed, " +
           std::to_string(static_cast<uint32_t>(in.aux)) + "u, e))";
      break;
    case kOpRandNormal:
      ex = "static_cast<" + t + ">(cl::rand_normal(seed, " +
           std::to_string(static_cast<uint32_t>(in.aux)) + "u, e))";
      break;
    default: {
      // An op of the table (ops/op_table.h): its scalar function, operands, variant bits.
      const OpInfo& info = op_info(in.op);
      if (info.category == kCatInternal)
        throw std::logic_error(std::string("CUDA codegen: unexpected op ") + info.name);
      ex = std::string(info.cuda_fn) + "(" + a;
      if (info.arity > 1) ex += ", " + bb;
      if (info.arity > 2) ex += ", " + c;
      ex += ", " + v + ")";
    }
  }
  return ex;
}

}  // namespace codegen
}  // namespace cl
