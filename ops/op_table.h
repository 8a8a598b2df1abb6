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

// The aten column of an op PyTorch has no ATen op for.
constexpr const char* kCastlabOnly = nullptr;

// CL_OP(Enum, "name", aten, arity, category, factors, cost, cost_fast, fn, py, "formula", "grad")
//   aten       the ATen op PyTorch computes it with ("aten.<name>", then any keyword
//              arguments as key=value, space-separated), or kCastlabOnly; castlab.torch's
//              ATen map and the tests' op -> torch function lists derive from it
//   arity      operands (registers a, b, c)
//   factors    VariantBits the op's formula reads
//   cost       rough SASS instructions per element on the GPU (CUDA's precise
//              functions); cost_fast: the same with approximate division
//   fn         scalar function in ops/scalar/ops.h: fn(a[, b[, c]], var) in op-math
//   py         1: exported as castlab.<name> and Tensor.<name>; 0: reached through
//              another function (gelu(approximate="tanh"))
//   formula    what traces and docs show
//   grad       the derivative rule: Python statements over castlab ops (x or a, b, c:
//              the operands; y: the result; g: the cotangent) assigning dx (or da, db,
//              dc); "" for no derivative. A "[kernel_name]" prefix says PyTorch eager
//              computes the rule as that one kernel (castlab.grad's KERNELS says where
//              it rounds). castlab/_autodiff.py reads it; the derivation is PyTorch's
//              (tools/autograd/derivatives.yaml), checked against torch.autograd.
#define CL_ELEMENTWISE_OPS(X)                                                                      \
  X(Neg, "neg", "aten.neg", 1, kCatUnarySigned, kVarNegZeroMinus, 1, 1, op_neg, 1, "-x, exact",    \
    "dx = -g")                                                                                     \
  X(Abs, "abs", "aten.abs", 1, kCatUnarySigned, 0, 1, 1, op_abs, 1, "|x|, exact",                  \
    "dx = g * sgn(x)")                                                                             \
  X(Exp, "exp", "aten.exp", 1, kCatUnaryFloat, kFImpl | kVarTorchVml, 8, 8, op_exp, 1, "e**x",     \
    "dx = g * y")                                                                                  \
  X(Log, "log", "aten.log", 1, kCatUnaryFloat, kFImpl | kVarTorchVml, 24, 24, op_log, 1,           \
    "natural logarithm", "dx = g / x")                                                             \
  X(Sigmoid, "sigmoid", "aten.sigmoid", 1, kCatUnaryFloat,                                         \
    kFImpl | kFDiv | kVarSigmoidEx2 | kVarTorchTail, 18, 18, op_sigmoid, 1, "1/(1+exp(-x))",       \
    "[sigmoid_backward] dx = g * (1 - y) * y")                                                     \
  X(Silu, "silu", "aten.silu", 1, kCatUnaryFloat,                                                  \
    kFImpl | kFDiv | kVarSiluMulSigmoid | kVarSigmoidEx2 | kVarTorchTail, 18, 18, op_silu, 1,      \
    "x/(1+exp(-x))", "[silu_backward] s = 1 / (1 + exp(-x)); dx = g * s * (1 + x * (1 - s))")      \
  X(Tanh, "tanh", "aten.tanh", 1, kCatUnaryFloat, kFImpl | kVarTorchVml, 16, 16, op_tanh, 1,       \
    "hyperbolic tangent", "[tanh_backward] dx = g * (1 - y * y)")                                  \
  X(Gelu, "gelu", "aten.gelu", 1, kCatUnaryFloat, kFImpl | kVarTorchTail, 24, 24, op_gelu, 1,      \
    "x*0.5*(1+erf(x/sqrt(2)))",                                                                    \
    "[gelu_backward] cdf = 0.5 * (1 + erf(x * M_SQRT1_2)); pdf = exp(-0.5 * x * x) * GELU_BETA; "  \
    "dx = g * (cdf + x * pdf)")                                                                    \
  X(GeluTanh, "gelu_tanh", "aten.gelu approximate=tanh", 1, kCatUnaryFloat,                        \
    kFImpl | kVarFmaInOp | kVarTorchTail, 22, 22, op_gelu_tanh, 0,                                 \
    "0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x**3)))",                                                \
    "[gelu_tanh_backward] x_sq = x * x; x_cube = x_sq * x; "                                       \
    "inner = GELU_TANH_BETA * (x + 0.044715 * x_cube); t = tanh(inner); left = 0.5 * x; "          \
    "right = 1 + t; left_derivative = 0.5 * right; tanh_derivative = 1 - t * t; "                  \
    "inner_derivative = GELU_TANH_BETA * (1 + GELU_TANH_3KAPPA * x_sq); "                          \
    "right_derivative = left * tanh_derivative * inner_derivative; "                               \
    "dx = g * (left_derivative + right_derivative)")                                               \
  X(Sqrt, "sqrt", "aten.sqrt", 1, kCatUnaryFloat, kVarTorchVml, 6, 6, op_sqrt, 1,                  \
    "IEEE square root", "dx = g / (2 * y)")                                                        \
  X(Rsqrt, "rsqrt", "aten.rsqrt", 1, kCatUnaryFloat,                                               \
    kVarRsqrtFast | kVarRsqrtScalar16 | kVarTorchTail | kVarTorchScalarLoop | kVarRsqrtApproxFtz,  \
    4, 4, op_rsqrt, 1, "1/sqrt(x)", "dx = -0.5 * g * pow(y, 3)")                                   \
  X(Reciprocal, "reciprocal", "aten.reciprocal", 1, kCatUnaryFloat, kFDiv, 8, 3, op_reciprocal, 1, \
    "1/x", "dx = -g * (y * y)")                                                                    \
  X(Square, "square", "aten.square", 1, kCatUnarySigned, 0, 1, 1, op_square, 1, "x*x",             \
    "dx = g * (2.0 * x)")                                                                          \
  X(Cos, "cos", "aten.cos", 1, kCatUnaryFloat, kFImpl | kVarTorchVml, 24, 24, op_cos, 1, "cosine", \
    "dx = g * -sin(x)")                                                                            \
  X(Sin, "sin", "aten.sin", 1, kCatUnaryFloat, kFImpl | kVarTorchVml, 24, 24, op_sin, 1, "sine",   \
    "dx = g * cos(x)")                                                                             \
  X(Erf, "erf", "aten.erf", 1, kCatUnaryFloat, kFImpl | kVarTorchVml, 20, 20, op_erf, 1,           \
    "error function", "dx = 1.1283791670955126 * exp(-pow(x, 2)) * g")                             \
  X(Hardswish, "hardswish", "aten.hardswish", 1, kCatUnaryFloat, kVarHardswishRecip6, 4, 4,        \
    op_hardswish, 1, "x*min(max(x+3,0),6)/6",                                                      \
    "[hardswish_backward] dx = where(x <= -3, 0, where(x < 3, g * (x / 3 + 0.5), g))")             \
  X(Hardsigmoid, "hardsigmoid", "aten.hardsigmoid", 1, kCatUnaryFloat, kVarHardswishRecip6, 4, 4,  \
    op_hardsigmoid, 1, "min(max(x+3,0),6)/6",                                                      \
    "[hardsigmoid_backward] dx = where(x > -3, where(x < 3, g * 0.1666666716337204, 0), 0)")       \
  X(Add, "add", "aten.add", 2, kCatBinary, 0, 1, 1, op_add, 1, "a+b", "da = g; db = g")            \
  X(Sub, "sub", "aten.sub", 2, kCatBinary, 0, 1, 1, op_sub, 1, "a-b", "da = g; db = -g")           \
  X(Mul, "mul", "aten.mul", 2, kCatBinary, 0, 1, 1, op_mul, 1, "a*b", "da = g * b; db = g * a")    \
  X(Div, "div", "aten.div", 2, kCatBinary, kFDiv, 8, 3, op_div, 1, "a/b (true division)",          \
    "da = g / b; db = -g * ((a / b) / b)")                                                         \
  X(Maximum, "maximum", "aten.maximum", 2, kCatBinary, 0, 1, 1, op_maximum, 1,                     \
    "max(a, b), NaN-propagating, -0 < +0",                                                         \
    "h = where(a == b, g / 2, g); da = where(a < b, 0, h); db = where(a > b, 0, h)")               \
  X(Minimum, "minimum", "aten.minimum", 2, kCatBinary, 0, 1, 1, op_minimum, 1,                     \
    "min(a, b), NaN-propagating, -0 < +0",                                                         \
    "h = where(a == b, g / 2, g); da = where(a > b, 0, h); db = where(a < b, 0, h)")               \
  X(Pow, "pow", "aten.pow", 2, kCatBinary,                                                         \
    kFImpl | kVarPowDevice | kVarPowTensorExp | kVarTorchTail, 24, 24, op_pow, 1,                  \
    "a**b (C pow specials)",                                                                       \
    "da = pow_backward_self(g, a, b); db = pow_backward_exponent(g, a, b, y)")                     \
  X(Eq, "eq", "aten.eq", 2, kCatCompare, 0, 1, 1, op_eq, 1, "a == b", "")                          \
  X(Ne, "ne", "aten.ne", 2, kCatCompare, 0, 1, 1, op_ne, 1, "a != b", "")                          \
  X(Lt, "lt", "aten.lt", 2, kCatCompare, 0, 1, 1, op_lt, 1, "a < b", "")                           \
  X(Le, "le", "aten.le", 2, kCatCompare, 0, 1, 1, op_le, 1, "a <= b", "")                          \
  X(Gt, "gt", "aten.gt", 2, kCatCompare, 0, 1, 1, op_gt, 1, "a > b", "")                           \
  X(Ge, "ge", "aten.ge", 2, kCatCompare, 0, 1, 1, op_ge, 1, "a >= b", "")                          \
  X(Fma, "fma", kCastlabOnly, 3, kCatTernary, 0, 1, 1, op_fma, 1, "a*b+c, one rounding",           \
    "da = g * b; db = g * a; dc = g")                                                              \
  X(Where, "where", "aten.where", 3, kCatSelect, 0, 1, 1, op_where, 1, "a if cond else b",         \
    "db = where(a, g, 0); dc = where(a, 0, g)")                                                    \
  X(DivAdd, "div_add", kCastlabOnly, 3, kCatTernary, kFDiv, 9, 4, op_div_add, 0,                   \
    "a/b+c, the lowering's contraction of Triton's division into an add",                          \
    "da = g / b; db = -g * ((a / b) / b); dc = g")

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
#define CL_ENUM_OP(E, name, aten, arity, cat, factors, cost, cost_fast, fn, py, formula, grad) \
  kOp##E,
  CL_INTERNAL_OPS(CL_ENUM_INTERNAL) CL_ELEMENTWISE_OPS(CL_ENUM_OP)
#undef CL_ENUM_INTERNAL
#undef CL_ENUM_OP
      kOpCount
};

struct OpInfo {
  const char* name;
  const char* aten;  // "aten.<name>[ key=value...]", nullptr: castlab-only (or internal)
  int arity;
  OpCategory category;
  uint32_t factors;
  int cost, cost_fast;
  const char* cuda_fn;  // the scalar function's name in generated CUDA code
  bool py;
  const char* formula;
  const char* grad;  // derivative rule ("" for none)
};

// The table's entry for `op` (throws std::out_of_range for an unknown opcode).
const OpInfo& op_info(int op);
const char* op_name(int op);  // "?" for an unknown opcode
// Rough per-element GPU cost of one instruction (see the table's cost column).
int instr_cost(int op, uint32_t var, int mode);

}  // namespace cl
