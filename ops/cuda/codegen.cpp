// Program -> CUDA C++ (see codegen.h), written by small emitters: the per-element body
// (emit_body) mirrors run_program_cpu in ops/cpu/executor.cpp instruction by instruction,
// including the loads (exact widening), the stores (one rounding, with the same fast
// paths) and the random stream index; emit_contiguous and emit_nd write the kernel that
// calls it once per element. One instruction's expression: emit_instr.cpp.
#include "ops/cuda/codegen.h"

#include <stdexcept>
#include <string>
#include <type_traits>

#include "ops/cuda/emit_instr.h"
#include "ops/cuda/kernel_cache.h"

namespace cl {
namespace cuda {

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

bool needs_linked_pow(const Program& prog) {
  for (const Instr& in : prog.code)
    if (in.op == kOpPow && in.rtype == kRegF64 && (in.var & kVarPowDevice)) return true;
  return false;
}

namespace {

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

// What every emitter needs to know about one kernel: the program, its layout and the
// per-operand decisions taken once up front.
struct Kernel {
  const Program& prog;
  const KernelLayout& L;
  int nops, nout, nin, nd, V;
  std::vector<int> rtype;    // per register: RegType, -1 never written
  std::vector<int> writes;   // per register: instructions writing it
  std::vector<bool> wide;    // per input: fp16, handed to the body widened to float
  std::vector<bool> paired;  // per output: left unrounded by the body (see analyse)

  std::string in_t(int k) const { return storage_type(L.dtypes[nout + k]); }
  std::string out_t(int k) const { return storage_type(L.dtypes[k]); }
  // The type the body writes output k as.
  std::string body_t(int k) const { return paired[k] ? std::string("float") : out_t(k); }
  std::string in_ptr(int k) const {
    return "((const " + in_t(k) + "*)P.ptr[" + std::to_string(nout + k) + "])";
  }
  std::string out_ptr(int k) const {
    return "((" + out_t(k) + "*)P.ptr[" + std::to_string(k) + "])";
  }
  // Static layouts: operand k's stride along dimension dd.
  int64_t stride(int k, int dd) const { return L.strides[static_cast<size_t>(k) * nd + dd]; }
  // Static layouts: is operand k broadcast along an outer dimension (stride 0 where the
  // extent is > 1), so that several lanes read each of its elements?
  bool outer_broadcast(int k) const {
    for (int dd = 0; dd + 1 < nd; ++dd)
      if (stride(k, dd) == 0 && L.shape[static_cast<size_t>(dd)] > 1) return true;
    return false;
  }
};

// Register types and write counts (a register holds one type), and which operands take
// the vector fast paths.
Kernel analyse(const Program& prog, const KernelLayout& L) {
  const int nops = static_cast<int>(L.dtypes.size());
  Kernel K{prog, L, nops, L.n_out, nops - L.n_out, L.nd, L.vec, {}, {}, {}, {}};
  if (K.nout != static_cast<int>(prog.outputs.size()))
    throw std::logic_error("CUDA codegen: output count mismatch");
  K.rtype.assign(prog.n_regs, -1);
  K.writes.assign(prog.n_regs, 0);
  for (const Instr& in : prog.code) {
    if (K.rtype[in.dst] >= 0 && K.rtype[in.dst] != in.rtype)
      throw std::logic_error("CUDA codegen: register r" + std::to_string(in.dst) +
                             " holds two register types");
    K.rtype[in.dst] = in.rtype;
    K.writes[in.dst]++;
  }
  // fp16 inputs arrive widened to float: the kernel converts each loaded vector at once
  // (cl_f16v_to_f32) and single elements with cl::f16_to_f32.
  K.wide.assign(K.nin, false);
  for (int k = 0; k < K.nin; ++k) K.wide[k] = L.dtypes[K.nout + k] == kFloat16;
  // bf16/fp16 outputs rounded to nearest from a float register: the kernel converts them
  // in pairs (f32x2_to_*16x2_rne) where it stores a vector, one at a time in the tail.
  K.paired.assign(K.nout, false);
  for (int k = 0; k < K.nout; ++k) {
    const OutputSpec& os = prog.outputs[k];
    K.paired[k] = (L.dtypes[k] == kBFloat16 || L.dtypes[k] == kFloat16) && K.rtype[os.reg] == 0 &&
                  os.mode == kNearestEven;
  }
  return K;
}

// The per-element __device__ function cl_body(seed, e, x..., y&...): one line per
// instruction, then one rounding store per output. It mirrors run_program_cpu.
// `hoisted` (the row kernel's split, emit_split_element_function): the instructions
// computed once per row; the body takes their values (those it reads) as parameters
// named as their registers, after the inputs.
std::string emit_body(const Kernel& K, const std::string& name = "cl_body",
                      const std::vector<bool>* hoisted = nullptr,
                      const std::vector<int>* handed = nullptr) {
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
  std::vector<bool> declared(prog.n_regs, false);
  std::vector<bool> read(prog.n_regs, false);
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
    const std::string ex = instr_expr(in, K.wide, K.nin);
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
      << store_expr(K.L.dtypes[k], K.rtype[os.reg] < 0 ? kRegF32 : K.rtype[os.reg],
                    reg_name(os.reg), os.mode, os.saturate != 0, rb)
      << ";\n";
  }
  b << "}\n";
  return b.str();
}

// Source head: the scalar functions and the device prelude (both embedded headers), the
// index type and the parameter block (layout: codegen.h, param_words).
std::string emit_head(const Kernel& K) {
  Out s;
  s << "// generated by castlab (ops/cuda/codegen.cpp)\n";
  if (needs_linked_pow(K.prog)) s << kLinkPowDefine;
  s << "#include \"ops/scalar/ops.h\"\n";
  s << "#include \"ops/cuda/prelude.cuh\"\n";
  s << "typedef " << (K.L.idx32 ? "int" : "long long") << " idx_t;\n";
  s << "struct Params {\n  void* ptr[" << K.nops << "];\n";
  if (params_have_layout(K.L))
    s << "  long long shape[" << K.nd << "];\n  long long stride[" << K.nops << "][" << K.nd
      << "];\n";
  s << "  long long numel;\n  unsigned long long seed;\n  long long rbase;\n";
  if (magic_division(K.L)) s << "  unsigned long long div[" << K.nd << "];\n";
  s << "};\n";
  return s.str();
}

// Store of output k's vector `arr` at `dst`; paired outputs are rounded here, two
// elements per conversion.
std::string emit_vstore(const Kernel& K, int k, const std::string& ind, const std::string& dst,
                        const std::string& arr) {
  Out c;
  if (!K.paired[k]) {
    c << ind << "cl_vstore(" << dst << ", " << arr << ");\n";
    return c.str();
  }
  c << ind << "{\n" << ind << "  alignas(16) unsigned short c[V];\n" << ind << "#pragma unroll\n";
  c << ind << "  " << paired_rounding(K.L.dtypes[k], "c", arr, "V", K.V % 2 == 0);
  c << ind << "  cl_vstore(" << dst << ", c);\n" << ind << "}\n";
  return c.str();
}

// Store of output k's single element b<k> to `lv`; paired outputs get the rounding the
// body left out (the same store_expr, mode nearest).
std::string emit_sstore(const Kernel& K, int k, const std::string& ind, const std::string& lv) {
  const OutputSpec& os = K.prog.outputs[k];
  return ind + lv + " = " +
         (K.paired[k] ? store_expr(K.L.dtypes[k], kRegF32, "b" + std::to_string(k), os.mode,
                                   os.saturate != 0, "0u")
                      : "b" + std::to_string(k)) +
         ";\n";
}

// The body call for stream index `e`: inputs a<k><jx> (or the widened w<k><jx> of fp16
// vectors), outputs b<k><jy>.
std::string emit_call(const Kernel& K, const std::string& e, const std::string& jx,
                      const std::string& jy) {
  Out c;
  c << "cl_body(P.seed, " << e;
  for (int k = 0; k < K.nin; ++k) {
    if (!K.wide[k])
      c << ", a" << k << jx;
    else if (jx.empty())
      c << ", cl::f16_to_f32(a" << k << ")";
    else
      c << ", w" << k << jx;
  }
  for (int k = 0; k < K.nout; ++k) c << ", b" << k << jy;
  c << ");";
  return c.str();
}

// After the loads of a vector path: fp16 inputs widened into w<k> (dims "[V]" or "[U][V]").
std::string emit_widen(const Kernel& K, const std::string& ind, bool two_d) {
  Out c;
  for (int k = 0; k < K.nin; ++k) {
    if (!K.wide[k]) continue;
    if (two_d)
      c << ind << "float w" << k << "[U][V];\n"
        << ind << "#pragma unroll\n"
        << ind << "for (int u = 0; u < U; ++u) cl_f16v_to_f32(a" << k << "[u], w" << k << "[u]);\n";
    else
      c << ind << "float w" << k << "[V];\n"
        << ind << "cl_f16v_to_f32(a" << k << ", w" << k << ");\n";
  }
  return c.str();
}

// Contiguous kernel, all U vectors of the lane inside the tensor: every load is issued
// before any arithmetic.
std::string emit_contig_unrolled(const Kernel& K) {
  const int T = kThreadsPerBlock;
  Out s;
  for (int k = 0; k < K.nin; ++k) {
    s << "    alignas(16) " << K.in_t(k) << " a" << k << "[U][V];\n";
    s << "#pragma unroll\n    for (int u = 0; u < U; ++u) cl_vload(a" << k << "[u], " << K.in_ptr(k)
      << " + base + u * " << T << " * V);\n";
  }
  s << emit_widen(K, "    ", true);
  for (int k = 0; k < K.nout; ++k)
    s << "    alignas(16) " << K.body_t(k) << " b" << k << "[U][V];\n";
  s << "#pragma unroll\n    for (int u = 0; u < U; ++u)\n#pragma unroll\n"
    << "      for (int j = 0; j < V; ++j) "
    << emit_call(K,
                 "(unsigned long long)(P.rbase + (long long)(base + u * " + std::to_string(T) +
                     " * V + j))",
                 "[u][j]", "[u][j]")
    << "\n";
  s << "#pragma unroll\n    for (int u = 0; u < U; ++u) {\n";
  for (int k = 0; k < K.nout; ++k)
    s << emit_vstore(K, k, "      ", K.out_ptr(k) + " + base + u * " + std::to_string(T) + " * V",
                     "b" + std::to_string(k) + "[u]");
  s << "    }\n    return;\n";
  return s.str();
}

// Contiguous kernel near the end of the tensor: one whole vector at i0.
std::string emit_contig_vector(const Kernel& K) {
  Out s;
  s << "    if (i0 + V <= n) {\n";
  for (int k = 0; k < K.nin; ++k)
    s << "      alignas(16) " << K.in_t(k) << " a" << k << "[V]; cl_vload(a" << k << ", "
      << K.in_ptr(k) << " + i0);\n";
  s << emit_widen(K, "      ", false);
  for (int k = 0; k < K.nout; ++k)
    s << "      alignas(16) " << K.body_t(k) << " b" << k << "[V];\n";
  s << "#pragma unroll\n      for (int j = 0; j < V; ++j) "
    << emit_call(K, "(unsigned long long)(P.rbase + (long long)i0 + j)", "[j]", "[j]") << "\n";
  for (int k = 0; k < K.nout; ++k)
    s << emit_vstore(K, k, "      ", K.out_ptr(k) + " + i0", "b" + std::to_string(k));
  s << "      continue;\n    }\n";
  return s.str();
}

// Contiguous kernel, the last elements (fewer than V): one at a time.
std::string emit_contig_tail(const Kernel& K) {
  Out s;
  s << "    for (idx_t i = i0; i < n && i < i0 + V; ++i) {  // the tail: fewer than V\n";
  for (int k = 0; k < K.nin; ++k)
    s << "      const " << K.in_t(k) << " a" << k << " = " << K.in_ptr(k) << "[i];\n";
  for (int k = 0; k < K.nout; ++k) s << "      " << K.body_t(k) << " b" << k << ";\n";
  s << "      " << emit_call(K, "(unsigned long long)(P.rbase + (long long)i)", "", "") << "\n";
  for (int k = 0; k < K.nout; ++k) s << emit_sstore(K, k, "      ", K.out_ptr(k) + "[i]");
  s << "    }\n";
  return s.str();
}

// 1-D contiguous kernel: each lane takes U vectors of V elements, kThreadsPerBlock * V
// elements apart (each warp access stays one contiguous run); past the end of the tensor
// the vectors are taken one at a time. (idx32 leaves 2^26 of headroom: the indices of the
// last lanes cannot overflow.)
std::string emit_contiguous(const Kernel& K) {
  const int T = kThreadsPerBlock;
  Out s;
  s << "  constexpr int U = " << K.L.unroll << ";\n";
  s << "  const idx_t base = (idx_t)blockIdx.x * (U * " << T << " * V) + (idx_t)threadIdx.x * V;\n";
  s << "  if (base + (U - 1) * " << T << " * V + V <= n) {\n";
  s << emit_contig_unrolled(K);
  s << "  }\n";
  s << "  for (int u = 0; u < U; ++u) {\n";
  s << "    const idx_t i0 = base + u * " << T << " * V;\n";
  s << "    if (i0 >= n) return;\n";
  if (K.V > 1) s << emit_contig_vector(K);
  s << emit_contig_tail(K);
  s << "  }\n";
  return s.str();
}

// n-D kernel, static layout: the shape and strides as constants (unsigned decomposition:
// the index is never negative, so division by a constant is a multiply and shift).
// Opens the lane's block with `rem`, its first element index.
std::string emit_nd_static_start(const Kernel& K) {
  const KernelLayout& L = K.L;
  Out s;
  s << "  // static layout: shape";
  for (int dd = 0; dd < K.nd; ++dd) s << (dd ? " x " : " ") << L.shape[dd];
  s << "\n";
  s << "  (void)n;\n  typedef " << (L.idx32 ? "unsigned int" : "unsigned long long")
    << " uidx_t;\n";
  int64_t nel = 1;
  for (int dd = 0; dd < K.nd; ++dd) nel *= L.shape[dd];
  s << "  constexpr uidx_t NV = " << nel / K.V << (L.idx32 ? "u" : "ull") << ";\n";
  for (int dd = 1; dd < K.nd; ++dd)
    s << "  constexpr uidx_t SH" << dd << " = " << L.shape[dd] << (L.idx32 ? "u" : "ull") << ";\n";
  for (int k = 0; k < K.nops; ++k)
    for (int dd = 0; dd < K.nd; ++dd)
      if (K.stride(k, dd) != 0)
        s << "  constexpr idx_t ST" << k << "_" << dd << " = " << K.stride(k, dd) << ";\n";
  s << "  const uidx_t v = (uidx_t)blockIdx.x * " << kThreadsPerBlock
    << "u + (uidx_t)threadIdx.x;\n";
  s << "  if (v >= NV) return;\n";
  s << "  {\n    uidx_t rem = v * V;\n";
  return s.str();
}

// n-D kernel, runtime layout: shape and strides from the parameter block.
std::string emit_nd_runtime_start() {
  Out s;
  s << "  const idx_t v = (idx_t)blockIdx.x * " << kThreadsPerBlock << " + (idx_t)threadIdx.x;\n";
  s << "  if (v >= n / V) return;\n";
  s << "  {\n    idx_t rem = v * V;\n";
  return s.str();
}

// Element index `rem` -> every operand's offset o<k>, innermost dimension first.
std::string emit_nd_offsets(const Kernel& K, bool stat) {
  Out s;
  for (int k = 0; k < K.nops; ++k) s << "    idx_t o" << k << " = 0;\n";
  for (int dd = K.nd - 1; dd >= 0; --dd) {
    s << "    {\n";
    if (stat) {
      if (dd > 0) {
        s << "      const uidx_t q = rem / SH" << dd
          << ";\n      const idx_t id = (idx_t)(rem - q * SH" << dd << ");\n      rem = q;\n";
      } else {
        s << "      const idx_t id = (idx_t)rem;\n";
      }
      for (int k = 0; k < K.nops; ++k)
        if (K.stride(k, dd) != 0) s << "      o" << k << " += id * ST" << k << "_" << dd << ";\n";
      s << "      (void)id;\n";
    } else {
      if (dd > 0) {
        s << "      const idx_t sh = (idx_t)P.shape[" << dd << "];\n";
        if (magic_division(K.L))  // q = (umulhi(rem, m) + rem) >> shift, all below 2^31
          s << "      const unsigned long long dv = P.div[" << dd << "];\n"
            << "      const idx_t q = (idx_t)((__umulhi((unsigned)rem, (unsigned)dv) + "
               "(unsigned)rem) >> (unsigned)(dv >> 32));\n";
        else
          s << "      const idx_t q = rem / sh;\n";
        s << "      const idx_t id = rem - q * sh;\n      rem = q;\n";
      } else {
        s << "      const idx_t id = rem;\n";
      }
      for (int k = 0; k < K.nops; ++k)
        s << "      o" << k << " += id * (idx_t)P.stride[" << k << "][" << dd << "];\n";
    }
    s << "    }\n";
  }
  return s.str();
}

// n-D vector load of input k into a<k>[V]: one value repeated where the input is
// broadcast along the vector (innermost stride 0), else a vector load; with a static
// layout, an input broadcast along an outer dimension is loaded with an L2 evict-last
// policy (cl_vload_keep, prelude.cuh), and under evict_first_reads the others with an
// evict-first one (cl_vload_first).
std::string emit_nd_vload(const Kernel& K, int k, bool stat) {
  const int op = K.nout + k;
  const std::string t = K.in_t(k);
  Out s;
  s << "    alignas(16) " << t << " a" << k << "[V];\n";
  if (stat) {
    if (K.stride(op, K.nd - 1) == 0)
      s << "    {\n      const " << t << " t = ((const " << t << "*)P.ptr[" << op << "])[o" << op
        << "];\n#pragma unroll\n      for (int j = 0; j < V; ++j) a" << k << "[j] = t;\n    }\n";
    else
      s << "    "
        << (K.outer_broadcast(op)   ? "cl_vload_keep(a"
            : K.L.evict_first_reads ? "cl_vload_first(a"
                                    : "cl_vload(a")
        << k << ", ((const " << t << "*)P.ptr[" << op << "]) + o" << op << ");\n";
    return s.str();
  }
  s << "    if (P.stride[" << op << "][" << K.nd - 1 << "] == 0) {\n"
    << "      const " << t << " t = ((const " << t << "*)P.ptr[" << op << "])[o" << op << "];\n"
    << "#pragma unroll\n      for (int j = 0; j < V; ++j) a" << k << "[j] = t;\n"
    << "    } else {\n      cl_vload(a" << k << ", ((const " << t << "*)P.ptr[" << op << "]) + o"
    << op << ");\n    }\n";
  return s.str();
}

// n-D kernel: decompose the (vector) index once per lane. With V > 1 every operand's
// innermost stride is 1 (or 0 for inputs: one value for the whole vector) and the vector
// lies in one row.
std::string emit_nd(const Kernel& K) {
  const KernelLayout& L = K.L;
  const bool stat = !L.shape.empty();
  if (stat && (static_cast<int>(L.shape.size()) != K.nd ||
               static_cast<int>(L.strides.size()) != K.nops * K.nd))
    throw std::logic_error("CUDA codegen: static layout size mismatch");
  Out s;
  s << (stat ? emit_nd_static_start(K) : emit_nd_runtime_start());
  s << emit_nd_offsets(K, stat);
  s << "    const unsigned long long e0 = (unsigned long long)(P.rbase + (long long)o0);\n";
  if (K.V > 1) {
    for (int k = 0; k < K.nin; ++k) s << emit_nd_vload(K, k, stat);
    s << emit_widen(K, "    ", false);
    for (int k = 0; k < K.nout; ++k)
      s << "    alignas(16) " << K.body_t(k) << " b" << k << "[V];\n";
    s << "#pragma unroll\n    for (int j = 0; j < V; ++j) " << emit_call(K, "e0 + j", "[j]", "[j]")
      << "\n";
    for (int k = 0; k < K.nout; ++k)
      s << emit_vstore(K, k, "    ", K.out_ptr(k) + " + o" + std::to_string(k),
                       "b" + std::to_string(k));
  } else {
    for (int k = 0; k < K.nin; ++k)
      s << "    const " << K.in_t(k) << " a" << k << " = " << K.in_ptr(k) << "[o" << K.nout + k
        << "];\n";
    for (int k = 0; k < K.nout; ++k) s << "    " << K.body_t(k) << " b" << k << ";\n";
    s << "    " << emit_call(K, "e0", "", "") << "\n";
    for (int k = 0; k < K.nout; ++k)
      s << emit_sstore(K, k, "    ", K.out_ptr(k) + "[o" + std::to_string(k) + "]");
  }
  s << "  }\n";
  return s.str();
}

}  // namespace

std::string emit_element_function(const Program& prog, const std::vector<uint8_t>& dtypes,
                                  int n_out, const std::string& name) {
  KernelLayout L;
  L.dtypes = dtypes;
  L.n_out = n_out;
  Kernel K = analyse(prog, L);
  K.wide.assign(K.nin, false);     // inputs arrive as stored
  K.paired.assign(K.nout, false);  // outputs leave rounded
  return emit_body(K, name);
}

SplitFunction emit_split_element_function(const Program& prog, const std::vector<uint8_t>& dtypes,
                                          int n_out, const std::string& name,
                                          const std::vector<bool>& invariant, bool pair_outputs) {
  KernelLayout L;
  L.dtypes = dtypes;
  L.n_out = n_out;
  Kernel K = analyse(prog, L);
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
  for (int r : f.handed) b << "  h" << r << " = " << reg_name(r) << ";\n";
  b << "}\n";
  f.src = b.str() + emit_body(K, name, &hoisted, &f.handed);
  for (int r : f.handed) f.types.push_back(reg_type_cxx(K.rtype[r]));
  return f;
}

std::string paired_rounding(int dtype, const std::string& dst, const std::string& src,
                            const std::string& count, bool even) {
  const bool bf = dtype == kBFloat16;
  if (even)
    return "for (int j = 0; j < " + count + "; j += 2) reinterpret_cast<unsigned int*>(" + dst +
           ")[j / 2] = cl::" + (bf ? "f32x2_to_bf16x2_rne" : "f32x2_to_f16x2_rne") + "(" + src +
           "[j], " + src + "[j + 1]);\n";
  return "for (int j = 0; j < " + count + "; ++j) " + dst +
         "[j] = cl::" + (bf ? "f32_to_bf16_rne" : "f32_to_f16_rne") + "(" + src + "[j]);\n";
}

bool params_have_layout(bool contig, bool static_layout) { return !contig && !static_layout; }

size_t param_words(int nops, int nd, bool contig, bool static_layout, bool idx32) {
  const size_t n = static_cast<size_t>(nops), d = static_cast<size_t>(nd);
  const size_t layout = params_have_layout(contig, static_layout) ? d + n * d : 0;
  return n + layout + 3 + (magic_division(contig, static_layout, idx32, nd) ? d : 0);
}

bool magic_division(bool contig, bool static_layout, bool idx32, int nd) {
  return !contig && !static_layout && idx32 && nd > 1;
}

uint64_t division_magic(uint32_t d) {
  if (d == 0 || d >= (uint32_t(1) << 31)) throw std::invalid_argument("division_magic: divisor");
  uint32_t shift = 0;
  while ((uint64_t(1) << shift) < d) ++shift;
  const uint64_t m = ((uint64_t(1) << 32) * ((uint64_t(1) << shift) - d)) / d + 1;
  return m | (uint64_t(shift) << 32);
}

// One thread per lane (U vectors of V elements), no grid-stride loop: the launch covers
// every lane, as PyTorch's and Triton's pointwise kernels (see benchmarks/RESULTS.md).
// The kernel is named after the hash of its source.
GeneratedKernel generate_kernel(const Program& prog, const KernelLayout& L) {
  const Kernel K = analyse(prog, L);
  const std::string body = emit_body(K);
  Out s;
  s << emit_head(K) << body;
  s << "extern \"C\" __global__ void __launch_bounds__(" << kThreadsPerBlock
    << ") KERNEL_NAME(const Params P) {\n";
  s << "  cl_pdl_enter();  // before any global access (launched with programmatic "
       "serialization)\n";
  s << "  const idx_t n = (idx_t)P.numel;\n";
  s << "  constexpr int V = " << K.V << ";\n";
  s << (L.contig ? emit_contiguous(K) : emit_nd(K));
  s << "}\n";
  std::string src = s.str();
  const std::string name = "castlab_k" + sha256_hex(src).substr(0, 20);
  const std::string ph = "KERNEL_NAME";
  src.replace(src.find(ph), ph.size(), name);
  return {name, src};
}

}  // namespace cuda
}  // namespace cl
