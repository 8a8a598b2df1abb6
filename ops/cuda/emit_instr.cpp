// Program instruction -> C++ expression (see emit_instr.h). Each case calls the scalar
// function the CPU interpreter calls (ops/scalar/ops.h, core/convert.h, core/rng.h).
#include "ops/cuda/emit_instr.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

namespace cl {
namespace cuda {

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

}  // namespace

std::string reg_name(int r) { return "r" + std::to_string(r); }

std::string instr_expr(const Instr& in, const std::vector<bool>& wide, int nin) {
  const bool f64 = in.f64 != 0;
  const char* T = f64 ? "double" : "float";
  const std::string t = T;
  const std::string d = R(in.dst);
  const std::string a = in.a >= 0 ? R(in.a) : d;
  const std::string bb = in.b >= 0 ? R(in.b) : d;
  const std::string c = in.c >= 0 ? R(in.c) : d;
  const std::string v = std::to_string(static_cast<int>(in.var));
  const std::string impl = std::to_string(static_cast<int>(in.var & kVarImplMask));
  std::string ex;
  switch (in.op) {
    case kOpLoad:
      if (in.aux < 0 || in.aux >= nin) throw std::invalid_argument("program loads a missing input");
      if (wide[in.aux] && in.dtype == kFloat16)
        ex = std::string("static_cast<") + T + ">(x" + std::to_string(in.aux) + ")";
      else
        ex = load_expr(in.dtype, f64, "x" + std::to_string(in.aux));
      break;
    case kOpConst: ex = "static_cast<" + t + ">(" + dlit(in.imm) + ")"; break;
    case kOpNeg: ex = "-" + a; break;
    case kOpAbs:
      ex = "(" + a + " < " + t + "(0) ? -" + a + " : (" + a + " == " + t + "(0) ? " + t +
           "(0) : " + a + "))";
      break;
    case kOpExp: ex = "cl::op_exp(" + a + ", " + v + ")"; break;
    case kOpLog: ex = "cl::m_log(" + a + ", " + impl + ")"; break;
    case kOpSigmoid: ex = "cl::op_sigmoid(" + a + ", " + v + ")"; break;
    case kOpSilu: ex = "cl::op_silu(" + a + ", " + v + ")"; break;
    case kOpTanh: ex = "cl::m_tanh(" + a + ", " + impl + ")"; break;
    case kOpGeluErf: ex = "cl::op_gelu_erf(" + a + ", " + v + ")"; break;
    case kOpGeluTanh: ex = "cl::op_gelu_tanh(" + a + ", " + v + ")"; break;
    case kOpSqrt: ex = "cl::op_sqrt(" + a + ")"; break;
    case kOpRsqrt: ex = "cl::op_rsqrt(" + a + ", " + v + ")"; break;
    case kOpReciprocal: ex = "cl::div_f(" + t + "(1), " + a + ", " + v + ")"; break;
    case kOpSquare: ex = a + " * " + a; break;
    case kOpCos: ex = "cl::m_cos(" + a + ", " + impl + ")"; break;
    case kOpSin: ex = "cl::m_sin(" + a + ", " + impl + ")"; break;
    case kOpErf: ex = "cl::m_erf(" + a + ", " + impl + ")"; break;
    case kOpAdd: ex = a + " + " + bb; break;
    case kOpSub: ex = a + " - " + bb; break;
    case kOpMul: ex = a + " * " + bb; break;
    case kOpDiv: ex = "cl::div_f(" + a + ", " + bb + ", " + v + ")"; break;
    case kOpMaximum: ex = "cl::op_maximum(" + a + ", " + bb + ")"; break;
    case kOpMinimum: ex = "cl::op_minimum(" + a + ", " + bb + ")"; break;
    case kOpPow: ex = "cl::op_pow(" + a + ", " + bb + ", " + v + ")"; break;
    case kOpEq: ex = "(" + a + " == " + bb + " ? " + t + "(1) : " + t + "(0))"; break;
    case kOpNe: ex = "(" + a + " != " + bb + " ? " + t + "(1) : " + t + "(0))"; break;
    case kOpLt: ex = "(" + a + " < " + bb + " ? " + t + "(1) : " + t + "(0))"; break;
    case kOpLe: ex = "(" + a + " <= " + bb + " ? " + t + "(1) : " + t + "(0))"; break;
    case kOpGt: ex = "(" + a + " > " + bb + " ? " + t + "(1) : " + t + "(0))"; break;
    case kOpGe: ex = "(" + a + " >= " + bb + " ? " + t + "(1) : " + t + "(0))"; break;
    case kOpFma:
      ex = std::string(f64 ? "cl::fma_d(" : "cl::fma_f(") + a + ", " + bb + ", " + c + ")";
      break;
    case kOpWhere: ex = "(" + a + " != " + t + "(0) ? " + bb + " : " + c + ")"; break;
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
    case kOpRandUniform:
      ex = "static_cast<" + t + ">(cl::rand_uniform(seed, " +
           std::to_string(static_cast<uint32_t>(in.aux)) + "u, e))";
      break;
    case kOpRandNormal:
      ex = "static_cast<" + t + ">(cl::rand_normal(seed, " +
           std::to_string(static_cast<uint32_t>(in.aux)) + "u, e))";
      break;
    default: throw std::logic_error(std::string("CUDA codegen: unexpected op ") + op_name(in.op));
  }
  return ex;
}

}  // namespace cuda
}  // namespace cl
