// Program -> per-element C++ functions, shared by the CUDA kernels (ops/cuda/codegen.h)
// and the CPU's generated loops (ops/cpu/jit.h): see element.h.
#include "ops/codegen/element.h"

#include <stdexcept>
#include <string>

#include "ops/codegen/emit_instr.h"

namespace cl {
namespace codegen {

// The C++ type a dtype is stored as (kernel parameters and loads/stores).
const char* storage_type(int dt) {
  switch (dt) {
    case kFloat64: return "double";
    case kFloat32: return "float";
    case kFloat16:
    case kBFloat16: return "unsigned short";
    case kFloat8E4M3FN:
    case kFloat8E5M2:
    case kBool: return "unsigned char";
    case kInt32: return "int";
    case kInt64: return "long long";
  }
  throw std::invalid_argument("CUDA codegen: unsupported dtype " + std::to_string(dt));
}

// One rounding register -> storage (as store_rows). `rb` is the random-bits expression.
std::string store_expr(int dt, int rt, const std::string& src, int mode, bool sat,
                       const std::string& rb) {
  const bool f32 = rt == kRegF32;
  const std::string s = sat ? "true" : "false";
  const std::string m = std::to_string(mode);
  const std::string d = std::to_string(dt);
  switch (dt) {
    case kFloat64: return "static_cast<double>(" + src + ")";
    case kFloat32:
      if (f32 || mode == kNearestEven) return "static_cast<float>(" + src + ")";
      return "cl::f32_from_bits(cl::round_f64_to_bits(static_cast<double>(" + src +
             "), cl::kFloat32, " + m + ", " + s + ", " + rb + "))";
    case kBFloat16:
    case kFloat16:
      if (f32 && mode == kNearestEven) {
        if (dt == kBFloat16) return "cl::f32_to_bf16_rne(" + src + ")";
        return "static_cast<unsigned short>(cl::narrow_f32(" + src + ", " + d +
               ", cl::kNearestEven, " + s + ", 0u))";
      }
      return "static_cast<unsigned short>(cl::round_f64_to_bits(static_cast<double>(" + src +
             "), " + d + ", " + m + ", " + s + ", " + rb + "))";
    case kFloat8E4M3FN:
    case kFloat8E5M2:
      return "static_cast<unsigned char>(cl::round_f64_to_bits(static_cast<double>(" + src + "), " +
             d + ", " + m + ", " + s + ", " + rb + "))";
    case kBool: return "(unsigned char)(" + src + " != 0 ? 1 : 0)";
    case kInt32: return "static_cast<int>(cl::to_int_fmt(" + src + ", cl::kInt32))";
    case kInt64: return "static_cast<long long>(cl::to_int_fmt(" + src + ", cl::kInt64))";
  }
  throw std::invalid_argument("CUDA codegen: store of unsupported dtype");
}

ElementKernel::ElementKernel(const Program& program, const std::vector<uint8_t>& dts, int n_out)
    : prog(program),
      dtypes(dts),
      nops(static_cast<int>(dts.size())),
      nout(n_out),
      nin(static_cast<int>(dts.size()) - n_out) {
  if (nout != static_cast<int>(prog.outputs.size()))
    throw std::logic_error("CUDA codegen: output count mismatch");
  rtype.assign(prog.n_regs, -1);
  writes.assign(prog.n_regs, 0);
  for (const Instr& in : prog.code) {
    if (rtype[in.dst] >= 0 && rtype[in.dst] != in.rtype)
      throw std::logic_error("CUDA codegen: register r" + std::to_string(in.dst) +
                             " holds two register types");
    rtype[in.dst] = in.rtype;
    writes[in.dst]++;
  }
  // fp16 inputs arrive widened to float: the kernel converts each loaded vector at once
  // (cl_f16v_to_f32) and single elements with cl::f16_to_f32.
  wide.assign(nin, false);
  for (int k = 0; k < nin; ++k) wide[k] = dtypes[nout + k] == kFloat16;
  // bf16/fp16 outputs rounded to nearest from a float register: the kernel converts them
  // in pairs (f32x2_to_*16x2_rne) where it stores a vector, one at a time in the tail.
  paired.assign(nout, false);
  for (int k = 0; k < nout; ++k) {
    const OutputSpec& os = prog.outputs[k];
    paired[k] = (dtypes[k] == kBFloat16 || dtypes[k] == kFloat16) && rtype[os.reg] == 0 &&
                os.mode == kNearestEven;
  }
}

// With `hw16`: the body's loads of fp16 inputs (those it does not take widened, and not
// `hoisted`) written as cl_h2f<HW16>(x), HW16 the function's template parameter (default
// false: cl::f16_to_f32, NaN payloads kept), for a caller that has checked a vector of
// inputs holds no NaN (cl_f16_no_nan_in) to call name<true> (the hardware conversion alone,
// prelude.cuh). Returns the line that opens the template (a template even where the body loads no
// fp16 input, so that every caller may name both forms).
static std::string hw16_loads(const ElementKernel& K, const std::vector<bool>* hoisted,
                              std::vector<std::string>& exprs) {
  const Program& prog = K.prog;
  exprs.resize(prog.code.size());
  for (size_t i = 0; i < prog.code.size(); ++i) {
    const Instr& in = prog.code[i];
    if (in.op != kOpLoad || in.dtype != kFloat16 || in.rtype == kRegI64 || !exprs[i].empty() ||
        (hoisted && (*hoisted)[i]) || in.aux < 0 || in.aux >= K.nin || K.wide[in.aux])
      continue;
    exprs[i] = std::string("static_cast<") + reg_type_cxx(in.rtype) + ">(cl_h2f<HW16>(x" +
               std::to_string(in.aux) + "))";
  }
  return "template <bool HW16 = false>\n";
}

// The per-element __device__ function cl_body(seed, e, x..., y&...): one line per
// instruction, then one rounding store per output. It mirrors run_program_cpu.
// `hoisted` (the row kernel's split, emit_split_element_function): the instructions
// computed once per row; the body takes their values (those it reads) as parameters
// named as their registers, after the inputs.
std::string emit_body(const ElementKernel& K, const std::string& name,
                      const std::vector<bool>* hoisted, const std::vector<int>* handed,
                      const std::vector<std::string>* exprs) {
  const Program& prog = K.prog;
  Out b;
  b << "__device__ __forceinline__ void " << name
    << "(const unsigned long long seed, "
       "const unsigned long long e";
  for (int k = 0; k < K.nin; ++k)
    b << ", const " << (K.wide[k] ? std::string("float") : K.in_t(k)) << " x" << k;
  if (handed)
    for (int r : *handed) b << ", const " << reg_type_cxx(K.rtype[r]) << " " << reg_name(r);
  for (int k = 0; k < K.nout; ++k) b << ", " << K.body_t(k) << "& y" << k;
  b << ") {\n";
  b << "  (void)seed; (void)e;\n";
  // Registers written more than once (or never) are declared up front; the others are
  // const at their one assignment.
  const int nregs = static_cast<int>(K.rtype.size());  // (and the split's reciprocals)
  std::vector<bool> declared(nregs, false);
  std::vector<bool> read(nregs, false);
  for (const Instr& in : prog.code)
    for (int a : {in.a, in.b, in.c})
      if (a >= 0 && a < prog.n_regs) read[a] = true;
  for (const OutputSpec& os : prog.outputs) read[os.reg] = true;
  if (handed)
    for (int r : *handed) declared[r] = true;
  for (int r = 0; r < prog.n_regs; ++r) {
    if (!declared[r] && (K.writes[r] > 1 || (K.writes[r] == 0 && read[r]))) {
      b << "  " << reg_type_cxx(K.rtype[r] < 0 ? kRegF32 : K.rtype[r]) << " " << reg_name(r)
        << " = 0;\n";
      declared[r] = true;
    }
  }
  for (size_t i = 0; i < prog.code.size(); ++i) {
    const Instr& in = prog.code[i];
    if (hoisted && (*hoisted)[i]) continue;
    const std::string ex =
        exprs && !(*exprs)[i].empty() ? (*exprs)[i] : instr_expr(in, K.wide, K.nin);
    b << "  ";
    if (!declared[in.dst]) {
      b << "const " << reg_type_cxx(in.rtype) << " ";
      declared[in.dst] = true;
    }
    b << reg_name(in.dst) << " = " << ex << ";  // " << op_name(in.op) << "\n";
  }
  for (int k = 0; k < K.nout; ++k) {
    const OutputSpec& os = prog.outputs[k];
    if (K.paired[k]) {  // rounded by the kernel (emit_vstore, emit_sstore)
      b << "  y" << k << " = " << reg_name(os.reg) << ";\n";
      continue;
    }
    const std::string rb =
        os.mode == kStochastic
            ? "cl::random_bits(seed, " + std::to_string(static_cast<uint32_t>(os.salt)) + "u, e)"
            : std::string("0u");
    b << "  y" << k << " = "
      << store_expr(K.dtypes[k], K.rtype[os.reg] < 0 ? kRegF32 : K.rtype[os.reg], reg_name(os.reg),
                    os.mode, os.saturate != 0, rb)
      << ";\n";
  }
  b << "}\n";
  return b.str();
}

std::string emit_element_function(const Program& prog, const std::vector<uint8_t>& dtypes,
                                  int n_out, const std::string& name, bool hw16) {
  ElementKernel K(prog, dtypes, n_out);
  K.wide.assign(K.nin, false);     // inputs arrive as stored
  K.paired.assign(K.nout, false);  // outputs leave rounded
  if (!hw16) return emit_body(K, name);
  std::vector<std::string> exprs;
  const std::string tmpl = hw16_loads(K, nullptr, exprs);
  return tmpl + emit_body(K, name, nullptr, nullptr, &exprs);
}

SplitFunction emit_split_element_function(const Program& prog, const std::vector<uint8_t>& dtypes,
                                          int n_out, const std::string& name,
                                          const std::vector<bool>& invariant, bool pair_outputs,
                                          bool hw16) {
  ElementKernel K(prog, dtypes, n_out);
  K.wide.assign(K.nin, false);
  if (!pair_outputs) K.paired.assign(K.nout, false);
  // an instruction is the row's when it writes its register once and reads only constants,
  // invariant inputs and such registers (no random stream: that is per element)
  const size_t n = prog.code.size();
  std::vector<bool> hoisted(n, false), row_reg(prog.n_regs, false);
  for (size_t i = 0; i < n; ++i) {
    const Instr& in = prog.code[i];
    bool h = K.writes[in.dst] == 1;
    if (in.op == kOpLoad)
      h = h && in.aux >= 0 && in.aux < K.nin && invariant[in.aux];
    else if (in.op == kOpRandUniform || in.op == kOpRandNormal ||
             (in.op == kOpRound && in.mode == kStochastic))
      h = false;
    for (int a : {in.a, in.b, in.c})
      if (a >= 0) h = h && row_reg[a];
    hoisted[i] = h;
    row_reg[in.dst] = h;
  }
  // A division by a row value whose quotient is only rounded to bf16 or fp16 outputs (the
  // softmax epilogue's exp(x - max) / sum): the body multiplies by the divisor's
  // reciprocal, computed once per row, and divides only where that product lies too near a
  // 16-bit rounding boundary to be sure of its rounding (cl_div_rn_16, prelude.cuh). The
  // reciprocal is a register past the program's, handed like the row's values.
  std::vector<int> reads(prog.n_regs, 0);
  for (const Instr& in : prog.code)
    for (int a : {in.a, in.b, in.c})
      if (a >= 0) reads[a]++;
  std::vector<std::string> exprs(n);
  std::vector<int> recip(prog.n_regs, -1), recip_of;  // divisor -> its reciprocal's register
  for (size_t i = 0; i < n; ++i) {
    const Instr& in = prog.code[i];
    if (hoisted[i] || in.op != kOpDiv || in.rtype != kRegF32 || (in.var & kVarApproxDiv) ||
        in.a < 0 || in.b < 0 || !row_reg[in.b] || K.writes[in.dst] != 1 || reads[in.dst] != 0)
      continue;
    int dt = -1;
    bool only16 = true;
    for (int k = 0; k < K.nout; ++k) {
      const OutputSpec& os = prog.outputs[k];
      if (os.reg != in.dst) continue;
      only16 = only16 && (K.dtypes[k] == kBFloat16 || K.dtypes[k] == kFloat16) &&
               os.mode == kNearestEven && (dt < 0 || dt == K.dtypes[k]);
      dt = K.dtypes[k];
    }
    if (!only16 || dt < 0) continue;
    if (recip[in.b] < 0) {
      recip[in.b] = static_cast<int>(K.rtype.size());
      K.rtype.push_back(kRegF32);
      K.writes.push_back(1);
      recip_of.push_back(in.b);
    }
    exprs[i] = std::string("cl_div_rn_16<") + (dt == kBFloat16 ? "true" : "false") + ">(" +
               reg_name(in.a) + ", " + reg_name(in.b) + ", " + reg_name(recip[in.b]) + ")";
  }
  // what the element part reads of the row part
  std::vector<bool> needed(prog.n_regs, false);
  for (size_t i = 0; i < n; ++i) {
    const Instr& in = prog.code[i];
    if (hoisted[i]) continue;
    for (int a : {in.a, in.b, in.c})
      if (a >= 0 && row_reg[a]) needed[a] = true;
  }
  for (const OutputSpec& os : prog.outputs)
    if (row_reg[os.reg]) needed[os.reg] = true;
  SplitFunction f;
  f.paired = K.paired;
  for (int r = 0; r < prog.n_regs; ++r)
    if (needed[r]) f.handed.push_back(r);
  for (int b : recip_of) f.handed.push_back(recip[b]);
  Out b;
  b << "__device__ __forceinline__ void " << name << "_row(";
  bool first = true;
  for (int k = 0; k < K.nin; ++k) {
    if (!invariant[k]) continue;
    b << (first ? "" : ", ") << "const " << K.in_t(k) << " x" << k;
    first = false;
  }
  for (int r : f.handed) {
    b << (first ? "" : ", ") << reg_type_cxx(K.rtype[r]) << "& h" << r;
    first = false;
  }
  b << ") {\n";
  for (size_t i = 0; i < n; ++i) {
    if (!hoisted[i]) continue;
    const Instr& in = prog.code[i];
    b << "  const " << reg_type_cxx(in.rtype) << " " << reg_name(in.dst) << " = "
      << instr_expr(in, K.wide, K.nin) << ";  // " << op_name(in.op) << "\n";
  }
  for (int d : recip_of)
    b << "  const float " << reg_name(recip[d]) << " = cl_rcp_div16(" << reg_name(d)
      << ");  // for cl_div_rn_16\n";
  for (int r : f.handed) b << "  h" << r << " = " << reg_name(r) << ";\n";
  b << "}\n";
  const std::string tmpl = hw16 ? hw16_loads(K, &hoisted, exprs) : std::string();
  f.hw16 = hw16;
  f.src = b.str() + tmpl + emit_body(K, name, &hoisted, &f.handed, &exprs);
  for (int r : f.handed) f.types.push_back(reg_type_cxx(K.rtype[r]));
  return f;
}

std::string rne_16(int dtype, const std::string& src) {
  return std::string(dtype == kBFloat16 ? "cl::f32_to_bf16_rne(" : "cl::f32_to_f16_rne(") + src +
         ")";
}

std::string paired_rounding(int dtype, const std::string& dst, const std::string& src,
                            const std::string& count, bool even) {
  const bool bf = dtype == kBFloat16;
  if (even)
    return "for (int j = 0; j < " + count + "; j += 2) reinterpret_cast<unsigned int*>(" + dst +
           ")[j / 2] = cl::" + (bf ? "f32x2_to_bf16x2_rne" : "f32x2_to_f16x2_rne") + "(" + src +
           "[j], " + src + "[j + 1]);\n";
  return "for (int j = 0; j < " + count + "; ++j) " + dst + "[j] = " + rne_16(dtype, src + "[j]") +
         ";\n";
}

}  // namespace codegen
}  // namespace cl
