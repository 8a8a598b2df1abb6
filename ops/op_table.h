// The op table: the one place an elementwise op is defined. Everything else is derived
// from it: the opcode enum, op names, per-element cost, the CPU executor's dispatch
// loops, the CUDA code generator's call strings and, through castlab._C.op_table(),
// the Python op lists (categories, what traces show, the functions exported from
// castlab and installed on Tensor).
//
// Adding an elementwise op: one CL_OP line here, its scalar function op_<name> in
// ops/scalar/ops.h, and its tests.
#pragma once
#include <cstdint>

#include "ops/scalar/ops.h"

namespace cl {

// How an op's operands and result type are checked (Python applies PyTorch's rules).
enum OpCategory : uint8_t {
  kCatInternal = 0,  // emitted by the lowering only (load, round, ...)
  kCatUnaryFloat,    // float in, float out; integer inputs compute in float32
  kCatUnarySigned,   // floating-point inputs only; result keeps the input dtype
  kCatBinary,        // arithmetic: PyTorch's type promotion, floating-point result
  kCatCompare,       // bool result
  kCatTernary,       // a*b+c style: promotion over all three operands
  kCatSelect,        // where(cond, a, b): bool condition, promotion over a and b ("conditional")
};

// The math-variant factors an op listens to (its mask of VariantBits); the lowering
// sets only these bits, so a trace shows, and a kernel key holds, exactly what matters.
constexpr uint32_t kFImpl = kVarImplMask;
constexpr uint32_t kFDiv = kVarApproxDiv;

// CL_OP(Enum, "name", arity, category, factors, cost, cost_fast, fn, py, "formula")
//   arity      operands (registers a, b, c)
//   factors    VariantBits the op's formula reads
//   cost       rough SASS instructions per element on the GPU (CUDA's precise
//              functions); cost_fast: the same with approximate division
//   fn         scalar function in ops/scalar/ops.h: fn(a[, b[, c]], var) in op-math
//   py         1: exported as castlab.<name> and Tensor.<name>; 0: reached through
//              another function (gelu(approximate="tanh"))
//   formula    what traces and docs show
#define CL_ELEMENTWISE_OPS(X)                                                                      \
  X(Neg, "neg", 1, kCatUnarySigned, 0, 1, 1, op_neg, 1, "-x, exact")                               \
  X(Abs, "abs", 1, kCatUnarySigned, 0, 1, 1, op_abs, 1, "|x|, exact")                              \
  X(Exp, "exp", 1, kCatUnaryFloat, kFImpl, 8, 8, op_exp, 1, "e**x")                                \
  X(Log, "log", 1, kCatUnaryFloat, kFImpl, 24, 24, op_log, 1, "natural logarithm")                 \
  X(Sigmoid, "sigmoid", 1, kCatUnaryFloat, kFImpl | kFDiv | kVarSigmoidEx2, 18, 18, op_sigmoid, 1, \
    "1/(1+exp(-x))")                                                                               \
  X(Silu, "silu", 1, kCatUnaryFloat, kFImpl | kFDiv | kVarSiluMulSigmoid | kVarSigmoidEx2, 18, 18, \
    op_silu, 1, "x/(1+exp(-x))")                                                                   \
  X(Tanh, "tanh", 1, kCatUnaryFloat, kFImpl, 16, 16, op_tanh, 1, "hyperbolic tangent")             \
  X(Gelu, "gelu", 1, kCatUnaryFloat, kFImpl, 24, 24, op_gelu, 1, "x*0.5*(1+erf(x/sqrt(2)))")       \
  X(GeluTanh, "gelu_tanh", 1, kCatUnaryFloat, kFImpl | kVarFmaInOp, 22, 22, op_gelu_tanh, 0,       \
    "0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x**3)))")                                                \
  X(Sqrt, "sqrt", 1, kCatUnaryFloat, 0, 6, 6, op_sqrt, 1, "IEEE square root")                      \
  X(Rsqrt, "rsqrt", 1, kCatUnaryFloat, kVarRsqrtFast, 4, 4, op_rsqrt, 1, "1/sqrt(x)")              \
  X(Reciprocal, "reciprocal", 1, kCatUnaryFloat, kFDiv, 8, 3, op_reciprocal, 1, "1/x")             \
  X(Square, "square", 1, kCatUnarySigned, 0, 1, 1, op_square, 1, "x*x")                            \
  X(Cos, "cos", 1, kCatUnaryFloat, kFImpl, 24, 24, op_cos, 1, "cosine")                            \
  X(Sin, "sin", 1, kCatUnaryFloat, kFImpl, 24, 24, op_sin, 1, "sine")                              \
  X(Erf, "erf", 1, kCatUnaryFloat, kFImpl, 20, 20, op_erf, 1, "error function")                    \
  X(Hardswish, "hardswish", 1, kCatUnaryFloat, kVarHardswishRecip6, 4, 4, op_hardswish, 1,         \
    "x*min(max(x+3,0),6)/6")                                                                       \
  X(Add, "add", 2, kCatBinary, 0, 1, 1, op_add, 1, "a+b")                                          \
  X(Sub, "sub", 2, kCatBinary, 0, 1, 1, op_sub, 1, "a-b")                                          \
  X(Mul, "mul", 2, kCatBinary, 0, 1, 1, op_mul, 1, "a*b")                                          \
  X(Div, "div", 2, kCatBinary, kFDiv, 8, 3, op_div, 1, "a/b (true division)")                      \
  X(Maximum, "maximum", 2, kCatBinary, 0, 1, 1, op_maximum, 1,                                     \
    "max(a, b), NaN-propagating, -0 < +0")                                                         \
  X(Minimum, "minimum", 2, kCatBinary, 0, 1, 1, op_minimum, 1,                                     \
    "min(a, b), NaN-propagating, -0 < +0")                                                         \
  X(Pow, "pow", 2, kCatBinary, kFImpl, 24, 24, op_pow, 1, "a**b (C pow specials)")                 \
  X(Eq, "eq", 2, kCatCompare, 0, 1, 1, op_eq, 1, "a == b")                                         \
  X(Ne, "ne", 2, kCatCompare, 0, 1, 1, op_ne, 1, "a != b")                                         \
  X(Lt, "lt", 2, kCatCompare, 0, 1, 1, op_lt, 1, "a < b")                                          \
  X(Le, "le", 2, kCatCompare, 0, 1, 1, op_le, 1, "a <= b")                                         \
  X(Gt, "gt", 2, kCatCompare, 0, 1, 1, op_gt, 1, "a > b")                                          \
  X(Ge, "ge", 2, kCatCompare, 0, 1, 1, op_ge, 1, "a >= b")                                         \
  X(Fma, "fma", 3, kCatTernary, 0, 1, 1, op_fma, 1, "a*b+c, one rounding")                         \
  X(Where, "where", 3, kCatSelect, 0, 1, 1, op_where, 1, "a if cond else b")

// Instructions only the lowering emits; each executor implements them itself (they
// touch memory, formats or the random stream rather than computing a formula).
// CL_INTERNAL(Enum, "name", cost)
#define CL_INTERNAL_OPS(X)                                                            \
  X(Load, "load", 1)                 /* dst <- input[aux], widened exactly */         \
  X(Const, "const", 1)               /* dst <- imm */                                 \
  X(Round, "round", 3)               /* a rounded to format dtype (mode, saturate) */ \
  X(ToF64, "to_f64", 1)              /* f32/i64 register -> f64 register, nearest */  \
  X(ToF32, "to_f32", 1)              /* f64/i64 register -> f32 register, nearest */  \
  X(ToI64, "to_i64", 1)              /* -> i64 register as integer format dtype */    \
  X(RandUniform, "rand_uniform", 12) /* uniform [0, 1) (seed, stream aux, index) */   \
  X(RandNormal, "rand_normal", 30)   /* standard normal (seed, stream aux, index) */

enum OpCode : uint8_t {
#define CL_ENUM_INTERNAL(E, name, cost) kOp##E,
#define CL_ENUM_OP(E, name, arity, cat, factors, cost, cost_fast, fn, py, formula) kOp##E,
  CL_INTERNAL_OPS(CL_ENUM_INTERNAL) CL_ELEMENTWISE_OPS(CL_ENUM_OP)
#undef CL_ENUM_INTERNAL
#undef CL_ENUM_OP
      kOpCount
};

struct OpInfo {
  const char* name;
  int arity;
  OpCategory category;
  uint32_t factors;
  int cost, cost_fast;
  const char* cuda_fn;  // the scalar function's name in generated CUDA code
  bool py;
  const char* formula;
};

// The table's entry for `op` (throws std::out_of_range for an unknown opcode).
const OpInfo& op_info(int op);
const char* op_name(int op);  // "?" for an unknown opcode
// Rough per-element GPU cost of one instruction (see the table's cost column).
int instr_cost(int op, uint32_t var, int mode);

}  // namespace cl
