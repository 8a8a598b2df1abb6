// Code generation shared by the backends: a Program's per-element function as C++ source,
// one line per instruction calling the same scalar functions (ops/scalar/ops.h,
// core/convert.h, core/rng.h) the CPU interpreter calls, then one rounding store per
// output. The CUDA kernels (ops/cuda/codegen.h, row_kernel.h, exhaustive) wrap it in
// their walks over the operands; the CPU's generated loops (ops/cpu/jit.h) call it per
// element. Nothing here knows a device: this folder includes neither ops/cpu nor ops/cuda.
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/program.h"

namespace cl {
namespace codegen {

// String builder (no iostreams: the generated source is plain concatenation).
struct Out {
  std::string s;
  Out& operator<<(const std::string& x) {
    s += x;
    return *this;
  }
  Out& operator<<(const char* x) {
    s += x;
    return *this;
  }
  Out& operator<<(char x) {
    s += x;
    return *this;
  }
  template <typename T, typename = typename std::enable_if<std::is_integral<T>::value>::type>
  Out& operator<<(T x) {
    s += std::to_string(static_cast<long long>(x));
    return *this;
  }
  const std::string& str() const { return s; }
};

// The C++ type a dtype is stored as in generated kernels ("unsigned short" for bf16...).
const char* storage_type(int dt);

// One rounding register -> storage: the expression that rounds `src` (a register of type
// `rt`) to dtype `dt` in `mode` (saturating or not); `rb` is the random-bits expression.
std::string store_expr(int dt, int rt, const std::string& src, int mode, bool sat,
                       const std::string& rb);

// What every emitter needs to know about one Program's element function: the per-register
// types and write counts (a register holds one type) and the per-operand decisions taken
// once up front. Operands: outputs first, then inputs (`dtypes` is borrowed).
struct ElementKernel {
  ElementKernel(const Program& program, const std::vector<uint8_t>& dts, int n_out);
  const Program& prog;
  const std::vector<uint8_t>& dtypes;
  int nops, nout, nin;
  std::vector<int> rtype;    // per register: RegType, -1 never written
  std::vector<int> writes;   // per register: instructions writing it
  std::vector<bool> wide;    // per input: fp16, handed to the body widened to float
  std::vector<bool> paired;  // per output: bf16/fp16 rounded to nearest from a float
                             // register, left unrounded by the body for the caller to
                             // convert two at a time

  std::string in_t(int k) const { return storage_type(dtypes[nout + k]); }
  std::string out_t(int k) const { return storage_type(dtypes[k]); }
  // The type the body writes output k as.
  std::string body_t(int k) const { return paired[k] ? std::string("float") : out_t(k); }
};

// The per-element __device__ function `name`(seed, e, x..., y&...) of K. `hoisted` (the
// row kernel's split, emit_split_element_function): the instructions computed once per
// row; the body takes their values (those it reads, `handed`) as parameters named as
// their registers, after the inputs. `exprs`: per instruction, an expression written in
// place of its own where not empty (the split's divisions, cl_div_rn_16).
std::string emit_body(const ElementKernel& K, const std::string& name = "cl_body",
                      const std::vector<bool>* hoisted = nullptr,
                      const std::vector<int>* handed = nullptr,
                      const std::vector<std::string>* exprs = nullptr);

// The per-element device function of `prog` alone, named `name`:
//   void name(seed, e, x0, x1, ..., y0&, ...)
// with inputs and outputs in their storage types (dtypes: outputs first, then inputs), for
// kernels of other shapes (the row kernel, the CPU's loops) that evaluate a Program
// element by element. With `hw16` (CUDA only) the function is a template, name<HW16 =
// false>: name<true> widens its fp16 inputs with the hardware conversion alone, for a
// caller that knows they hold no NaN (cl_f16_no_nan_in, ops/cuda/prelude.cuh).
std::string emit_element_function(const Program& prog, const std::vector<uint8_t>& dtypes,
                                  int n_out, const std::string& name, bool hw16 = false);

// One float expression `src` rounded to bf16 (`dtype` kBFloat16) or fp16, nearest even:
// the unsigned short bits (cl::f32_to_bf16_rne / cl::f32_to_f16_rne).
std::string rne_16(int dtype, const std::string& src);

// The loop that rounds `count` floats of array `src` to bf16 (`dtype` kBFloat16) or fp16
// into the unsigned short array `dst`, nearest even: two per conversion where `even`
// (cl::f32x2_to_bf16x2_rne, aligned `dst`), else one by one. A statement ending in "\n".
std::string paired_rounding(int dtype, const std::string& dst, const std::string& src,
                            const std::string& count, bool even);

// emit_element_function split in two where `invariant` (per input) marks the inputs that
// are the same for every element of a row: `name`_row(x_k of those inputs..., h_r&...)
// computes once per row every instruction that depends on nothing else, and
// `name`(seed, e, x..., r..., y&...) the rest, taking those values (`handed`: their
// registers, `types`: their C++ types) after the inputs.
// With `pair_outputs`, bf16/fp16 outputs rounded to nearest from a float register are
// left unrounded (`paired`: written as float), for the caller to convert two at a time.
// `hw16`: the element part as emit_element_function's, a template.
struct SplitFunction {
  std::string src;
  std::vector<int> handed;
  std::vector<std::string> types;
  std::vector<bool> paired;  // per output
  bool hw16 = false;
};
SplitFunction emit_split_element_function(const Program& prog, const std::vector<uint8_t>& dtypes,
                                          int n_out, const std::string& name,
                                          const std::vector<bool>& invariant,
                                          bool pair_outputs = false, bool hw16 = false);

}  // namespace codegen
}  // namespace cl
