// Program -> CUDA C++ (see codegen.h). The per-element body mirrors run_program_cpu in
// ops/cpu/executor.cpp instruction by instruction, including the loads (exact widening),
// the stores (one rounding, with the same fast paths) and the random stream index.
#include "ops/cuda/codegen.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace cl {
namespace cuda {

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

const char* raw_type(int dt) {
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

std::string R(int r) { return "r" + std::to_string(r); }

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

// One rounding register -> storage (as store_rows). `rb` is the random-bits expression.
std::string store_expr(int dt, bool f64, const std::string& src, int mode, bool sat,
                       const std::string& rb) {
  const std::string s = sat ? "true" : "false";
  const std::string m = std::to_string(mode);
  const std::string d = std::to_string(dt);
  switch (dt) {
    case kFloat64: return "static_cast<double>(" + src + ")";
    case kFloat32:
      if (!f64 || mode == kNearestEven) return "static_cast<float>(" + src + ")";
      return "cl::f32_from_bits(cl::round_f64_to_bits(static_cast<double>(" + src +
             "), cl::kFloat32, " + m + ", " + s + ", " + rb + "))";
    case kBFloat16:
    case kFloat16:
      if (!f64 && mode == kNearestEven) {
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
    case kInt32: return "static_cast<int>(" + src + ")";
    case kInt64: return "static_cast<long long>(" + src + ")";
  }
  throw std::invalid_argument("CUDA codegen: store of unsupported dtype");
}

const char* kPrelude = R"(
template <int B> struct cl_word;
template <> struct cl_word<16> { typedef uint4 T; };
template <> struct cl_word<8> { typedef uint2 T; };
template <> struct cl_word<4> { typedef unsigned int T; };
template <> struct cl_word<2> { typedef unsigned short T; };
template <> struct cl_word<1> { typedef unsigned char T; };
// B bytes in 16-byte (or smaller) words; the caller checked alignment.
template <int B>
__device__ __forceinline__ void cl_copy_words(void* dst, const void* src) {
  constexpr int C = B >= 16 ? 16 : B;
  typedef typename cl_word<C>::T W;
#pragma unroll
  for (int c = 0; c < B / C; ++c) reinterpret_cast<W*>(dst)[c] = reinterpret_cast<const W*>(src)[c];
}
// N consecutive elements between memory and an array.
template <typename T, int N>
__device__ __forceinline__ void cl_vload(T (&dst)[N], const T* src) {
  cl_copy_words<(int)sizeof(T) * N>(dst, src);
}
template <typename T, int N>
__device__ __forceinline__ void cl_vstore(T* dst, const T (&src)[N]) {
  cl_copy_words<(int)sizeof(T) * N>(dst, src);
}
// N fp16 values widened to float, exactly. The hardware conversion (one instruction each,
// subnormals kept) unless one of them is a NaN: castlab keeps NaN sign and payload bit for
// bit (as NumPy), which cl::f16_to_f32 does and the hardware need not. The bit-built
// conversion for every element made fp16 eager kernels 0.6-0.8x of PyTorch's speed.
template <int N>
__device__ __forceinline__ void cl_f16v_to_f32(const unsigned short (&h)[N], float (&f)[N]) {
  if constexpr (N % 2 == 0) {
    unsigned int m = 0;
#pragma unroll
    for (int c = 0; c < N / 2; ++c)
      m = __vmaxu2(m, reinterpret_cast<const unsigned int*>(h)[c] & 0x7FFF7FFFu);
    if (__vmaxu2(m, 0x7C007C00u) == 0x7C007C00u) {  // no magnitude above Inf: no NaN
#pragma unroll
      for (int j = 0; j < N; ++j) asm("cvt.f32.f16 %0, %1;" : "=f"(f[j]) : "h"(h[j]));
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < N; ++j) f[j] = cl::f16_to_f32(h[j]);
}
)";

}  // namespace

size_t param_bytes(const KernelLayout& L) {
  const size_t nops = L.dtypes.size();
  return 8 * (nops + L.nd + nops * L.nd + 3);
}

GeneratedKernel generate_kernel(const Program& prog, const KernelLayout& L) {
  const int nops = static_cast<int>(L.dtypes.size());
  const int nout = L.n_out;
  const int nin = nops - nout;
  const int nd = L.nd;
  const int V = L.vec;
  if (nout != static_cast<int>(prog.outputs.size()))
    throw std::logic_error("CUDA codegen: output count mismatch");

  // Register types and write counts.
  std::vector<int> rtype(prog.n_regs, -1), writes(prog.n_regs, 0);
  for (const Instr& in : prog.code) {
    if (rtype[in.dst] >= 0 && rtype[in.dst] != in.f64)
      throw std::logic_error("CUDA codegen: register r" + std::to_string(in.dst) +
                             " holds both float and double");
    rtype[in.dst] = in.f64;
    writes[in.dst]++;
  }
  std::vector<bool> declared(prog.n_regs, false);

  Out b;  // body
  b << "__device__ __forceinline__ void cl_body(const unsigned long long seed, "
       "const unsigned long long e";
  // fp16 inputs arrive widened to float: the kernel converts each loaded vector at once
  // (cl_f16v_to_f32: the hardware conversion unless the vector holds a NaN) and single
  // elements with cl::f16_to_f32.
  std::vector<bool> wide(nin, false);
  for (int k = 0; k < nin; ++k) wide[k] = L.dtypes[nout + k] == kFloat16;
  for (int k = 0; k < nin; ++k)
    b << ", const " << (wide[k] ? "float" : raw_type(L.dtypes[nout + k])) << " x" << k;
  // Outputs stored as bf16/fp16 rounded to nearest from a float register leave the body
  // unrounded: the kernel converts them in pairs (f32x2_to_*16x2_rne) where it stores a
  // vector, and one at a time in the tail.
  std::vector<bool> paired(nout, false);
  for (int k = 0; k < nout; ++k) {
    const OutputSpec& os = prog.outputs[k];
    paired[k] = (L.dtypes[k] == kBFloat16 || L.dtypes[k] == kFloat16) && rtype[os.reg] == 0 &&
                os.mode == kNearestEven;
  }
  for (int k = 0; k < nout; ++k)
    b << ", " << (paired[k] ? "float" : raw_type(L.dtypes[k])) << "& y" << k;
  b << ") {\n";
  b << "  (void)seed; (void)e;\n";
  // registers written more than once (or never) are declared up front
  for (int r = 0; r < prog.n_regs; ++r) {
    if (writes[r] != 1) {
      b << "  " << (rtype[r] == 1 ? "double " : "float ") << R(r) << " = 0;\n";
      declared[r] = true;
    }
  }
  for (const Instr& in : prog.code) {
    const bool f64 = in.f64 != 0;
    const char* T = f64 ? "double" : "float";
    const std::string t = T;
    const std::string d = R(in.dst);
    const std::string a = in.a >= 0 ? R(in.a) : d;
    const std::string bb = in.b >= 0 ? R(in.b) : d;
    const std::string c = in.c >= 0 ? R(in.c) : d;
    const std::string v = std::to_string(static_cast<int>(in.var));
    std::string ex;
    switch (in.op) {
      case kOpLoad:
        if (in.aux < 0 || in.aux >= nin)
          throw std::invalid_argument("program loads a missing input");
        if (wide[in.aux] && in.dtype == kFloat16)
          ex = std::string("static_cast<") + T + ">(x" + std::to_string(in.aux) + ")";
        else
          ex = load_expr(in.dtype, f64, "x" + std::to_string(in.aux));
        break;
      case kOpConst: ex = "static_cast<" + t + ">(" + dlit(in.imm) + ")"; break;
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
      default: {
        // An op of the table: its scalar function, operands, variant bits.
        const OpInfo& info = op_info(in.op);
        if (info.category == kCatInternal)
          throw std::logic_error(std::string("CUDA codegen: unexpected op ") + info.name);
        ex = std::string(info.cuda_fn) + "(" + a;
        if (info.arity > 1) ex += ", " + bb;
        if (info.arity > 2) ex += ", " + c;
        ex += ", " + v + ")";
      }
    }
    b << "  ";
    if (!declared[in.dst]) {
      b << "const " << T << " ";
      declared[in.dst] = true;
    }
    b << d << " = " << ex << ";  // " << op_name(in.op) << "\n";
  }
  for (int k = 0; k < nout; ++k) {
    const OutputSpec& os = prog.outputs[k];
    const bool rf64 = rtype[os.reg] == 1;
    const std::string rb =
        os.mode == kStochastic
            ? "cl::random_bits(seed, " + std::to_string(static_cast<uint32_t>(os.salt)) + "u, e)"
            : std::string("0u");
    if (paired[k]) {
      b << "  y" << k << " = " << R(os.reg) << ";\n";
      continue;
    }
    b << "  y" << k << " = "
      << store_expr(L.dtypes[k], rf64, R(os.reg), os.mode, os.saturate != 0, rb) << ";\n";
  }
  b << "}\n";

  // ---- the kernel ----
  Out s;
  s << "// generated by castlab (ops/cuda/codegen.cpp)\n";
  s << "#include \"ops/scalar/ops.h\"\n";
  s << kPrelude;
  s << "typedef " << (L.idx32 ? "int" : "long long") << " idx_t;\n";
  s << "struct Params {\n  void* ptr[" << nops << "];\n  long long shape[" << nd
    << "];\n  long long stride[" << nops << "][" << nd
    << "];\n  long long numel;\n  unsigned long long seed;\n  long long rbase;\n};\n";
  s << b.str();
  // One thread per lane (U vectors of V elements), no grid-stride loop: the launch covers
  // every lane (as PyTorch's and Triton's pointwise kernels). A loop the compiler cannot
  // prove runs once costs registers and, in sinf's slow path, up to 30% of the time.
  s << "extern \"C\" __global__ void __launch_bounds__(" << kThreadsPerBlock
    << ") KERNEL_NAME(const Params P) {\n";
  s << "  const idx_t n = (idx_t)P.numel;\n";
  s << "  constexpr int V = " << V << ";\n";
  auto in_t = [&](int k) { return std::string(raw_type(L.dtypes[nout + k])); };
  auto out_t = [&](int k) { return std::string(raw_type(L.dtypes[k])); };
  auto body_t = [&](int k) { return paired[k] ? std::string("float") : out_t(k); };
  // Stores of the body's outputs: the vector `arr` at `dst`, or one element b<k> to `lv`.
  auto vstore = [&](int k, const std::string& ind, const std::string& dst, const std::string& arr) {
    Out c;
    if (!paired[k]) {
      c << ind << "cl_vstore(" << dst << ", " << arr << ");\n";
      return c.str();
    }
    const bool bf = L.dtypes[k] == kBFloat16;
    c << ind << "{\n" << ind << "  alignas(16) unsigned short c[V];\n" << ind << "#pragma unroll\n";
    if (V % 2 == 0)
      c << ind
        << "  for (int j = 0; j < V; j += 2) reinterpret_cast<unsigned int*>(c)[j / 2] = cl::"
        << (bf ? "f32x2_to_bf16x2_rne" : "f32x2_to_f16x2_rne") << "(" << arr << "[j], " << arr
        << "[j + 1]);\n";
    else
      c << ind << "  for (int j = 0; j < V; ++j) c[j] = cl::"
        << (bf ? "f32_to_bf16_rne" : "f32_to_f16_rne") << "(" << arr << "[j]);\n";
    c << ind << "  cl_vstore(" << dst << ", c);\n" << ind << "}\n";
    return c.str();
  };
  auto sstore = [&](int k, const std::string& ind, const std::string& lv) {
    // paired outputs: the rounding the body left out (the same store_expr, mode nearest)
    const OutputSpec& os = prog.outputs[k];
    return ind + lv + " = " +
           (paired[k] ? store_expr(L.dtypes[k], false, "b" + std::to_string(k), os.mode,
                                   os.saturate != 0, "0u")
                      : "b" + std::to_string(k)) +
           ";\n";
  };

  // The body call. Vector paths pass the widened arrays w<k> of fp16 inputs (see widen).
  auto call = [&](const std::string& e, const std::string& jx, const std::string& jy) {
    Out c;
    c << "cl_body(P.seed, " << e;
    for (int k = 0; k < nin; ++k) {
      if (!wide[k])
        c << ", a" << k << jx;
      else if (jx.empty())
        c << ", cl::f16_to_f32(a" << k << ")";
      else
        c << ", w" << k << jx;
    }
    for (int k = 0; k < nout; ++k) c << ", b" << k << jy;
    c << ");";
    return c.str();
  };
  // After the loads of a vector path: fp16 inputs widened into w<k> (dims "[V]" or "[U][V]").
  auto widen = [&](const std::string& ind, bool two_d) {
    Out c;
    for (int k = 0; k < nin; ++k) {
      if (!wide[k]) continue;
      if (two_d)
        c << ind << "float w" << k << "[U][V];\n"
          << ind << "#pragma unroll\n"
          << ind << "for (int u = 0; u < U; ++u) cl_f16v_to_f32(a" << k << "[u], w" << k
          << "[u]);\n";
      else
        c << ind << "float w" << k << "[V];\n"
          << ind << "cl_f16v_to_f32(a" << k << ", w" << k << ");\n";
    }
    return c.str();
  };
  auto in_ptr = [&](int k) {
    return "((const " + in_t(k) + "*)P.ptr[" + std::to_string(nout + k) + "])";
  };
  auto out_ptr = [&](int k) { return "((" + out_t(k) + "*)P.ptr[" + std::to_string(k) + "])"; };
  if (L.contig) {
    // Each lane takes U vectors of V elements, 128 * V elements apart (each warp access
    // stays one contiguous run). When all U are inside the tensor, every load is issued
    // before any arithmetic; otherwise the vectors are taken one at a time up to the end.
    // (idx32 leaves 2^26 of headroom: the indices of the last lanes cannot overflow.)
    const int U = L.unroll;
    const int T = kThreadsPerBlock;
    s << "  constexpr int U = " << U << ";\n";
    s << "  const idx_t base = (idx_t)blockIdx.x * (U * " << T
      << " * V) + (idx_t)threadIdx.x * V;\n";
    s << "  if (base + (U - 1) * " << T << " * V + V <= n) {\n";
    for (int k = 0; k < nin; ++k) {
      s << "    alignas(16) " << in_t(k) << " a" << k << "[U][V];\n";
      s << "#pragma unroll\n    for (int u = 0; u < U; ++u) cl_vload(a" << k << "[u], " << in_ptr(k)
        << " + base + u * " << T << " * V);\n";
    }
    s << widen("    ", true);
    for (int k = 0; k < nout; ++k) s << "    alignas(16) " << body_t(k) << " b" << k << "[U][V];\n";
    s << "#pragma unroll\n    for (int u = 0; u < U; ++u)\n#pragma unroll\n"
      << "      for (int j = 0; j < V; ++j) "
      << call("(unsigned long long)(P.rbase + (long long)(base + u * " + std::to_string(T) +
                  " * V + j))",
              "[u][j]", "[u][j]")
      << "\n";
    s << "#pragma unroll\n    for (int u = 0; u < U; ++u) {\n";
    for (int k = 0; k < nout; ++k)
      s << vstore(k, "      ", out_ptr(k) + " + base + u * " + std::to_string(T) + " * V",
                  "b" + std::to_string(k) + "[u]");
    s << "    }\n    return;\n  }\n";
    s << "  for (int u = 0; u < U; ++u) {\n";
    s << "    const idx_t i0 = base + u * " << T << " * V;\n";
    s << "    if (i0 >= n) return;\n";
    if (V > 1) {
      s << "    if (i0 + V <= n) {\n";
      for (int k = 0; k < nin; ++k)
        s << "      alignas(16) " << in_t(k) << " a" << k << "[V]; cl_vload(a" << k << ", "
          << in_ptr(k) << " + i0);\n";
      s << widen("      ", false);
      for (int k = 0; k < nout; ++k)
        s << "      alignas(16) " << body_t(k) << " b" << k << "[V];\n";
      s << "#pragma unroll\n      for (int j = 0; j < V; ++j) "
        << call("(unsigned long long)(P.rbase + (long long)i0 + j)", "[j]", "[j]") << "\n";
      for (int k = 0; k < nout; ++k)
        s << vstore(k, "      ", out_ptr(k) + " + i0", "b" + std::to_string(k));
      s << "      continue;\n    }\n";
    }
    s << "    for (idx_t i = i0; i < n && i < i0 + V; ++i) {  // the tail: fewer than V\n";
    for (int k = 0; k < nin; ++k)
      s << "      const " << in_t(k) << " a" << k << " = " << in_ptr(k) << "[i];\n";
    for (int k = 0; k < nout; ++k) s << "      " << body_t(k) << " b" << k << ";\n";
    s << "      " << call("(unsigned long long)(P.rbase + (long long)i)", "", "") << "\n";
    for (int k = 0; k < nout; ++k) s << sstore(k, "      ", out_ptr(k) + "[i]");
    s << "    }\n  }\n}\n";
  } else {
    // n-D: decompose the (vector) index once per lane; with V > 1 every operand's innermost
    // stride is 1 (or 0: one value for the whole vector) and the vector lies in one row.
    // Static layouts name the shape and strides as constants (unsigned decomposition:
    // the index is never negative, so division by a constant is a multiply and shift).
    const bool stat = !L.shape.empty();
    if (stat &&
        (static_cast<int>(L.shape.size()) != nd || static_cast<int>(L.strides.size()) != nops * nd))
      throw std::logic_error("CUDA codegen: static layout size mismatch");
    auto stv = [&](int k, int dd) { return L.strides[static_cast<size_t>(k) * nd + dd]; };
    if (stat) {
      s << "  // static layout: shape";
      for (int dd = 0; dd < nd; ++dd) s << (dd ? " x " : " ") << L.shape[dd];
      s << "\n";
      s << "  (void)n;\n  typedef " << (L.idx32 ? "unsigned int" : "unsigned long long")
        << " uidx_t;\n";
      int64_t nel = 1;
      for (int dd = 0; dd < nd; ++dd) nel *= L.shape[dd];
      s << "  constexpr uidx_t NV = " << nel / V << (L.idx32 ? "u" : "ull") << ";\n";
      for (int dd = 1; dd < nd; ++dd)
        s << "  constexpr uidx_t SH" << dd << " = " << L.shape[dd] << (L.idx32 ? "u" : "ull")
          << ";\n";
      for (int k = 0; k < nops; ++k)
        for (int dd = 0; dd < nd; ++dd)
          if (stv(k, dd) != 0)
            s << "  constexpr idx_t ST" << k << "_" << dd << " = " << stv(k, dd) << ";\n";
      s << "  const uidx_t v = (uidx_t)blockIdx.x * " << kThreadsPerBlock
        << "u + (uidx_t)threadIdx.x;\n";
      s << "  if (v >= NV) return;\n";
      s << "  {\n    uidx_t rem = v * V;\n";
    } else {
      s << "  const idx_t v = (idx_t)blockIdx.x * " << kThreadsPerBlock
        << " + (idx_t)threadIdx.x;\n";
      s << "  if (v >= n / V) return;\n";
      s << "  {\n    idx_t rem = v * V;\n";
    }
    for (int k = 0; k < nops; ++k) s << "    idx_t o" << k << " = 0;\n";
    for (int dd = nd - 1; dd >= 0; --dd) {
      s << "    {\n";
      if (stat) {
        if (dd > 0) {
          s << "      const uidx_t q = rem / SH" << dd
            << ";\n      const idx_t id = (idx_t)(rem - q * SH" << dd << ");\n      rem = q;\n";
        } else {
          s << "      const idx_t id = (idx_t)rem;\n";
        }
        for (int k = 0; k < nops; ++k)
          if (stv(k, dd) != 0) s << "      o" << k << " += id * ST" << k << "_" << dd << ";\n";
        s << "      (void)id;\n";
      } else {
        if (dd > 0) {
          s << "      const idx_t sh = (idx_t)P.shape[" << dd << "];\n";
          s << "      const idx_t q = rem / sh;\n      const idx_t id = rem - q * sh;\n      rem = "
               "q;\n";
        } else {
          s << "      const idx_t id = rem;\n";
        }
        for (int k = 0; k < nops; ++k)
          s << "      o" << k << " += id * (idx_t)P.stride[" << k << "][" << dd << "];\n";
      }
      s << "    }\n";
    }
    s << "    const unsigned long long e0 = (unsigned long long)(P.rbase + (long long)o0);\n";
    if (V > 1) {
      for (int k = 0; k < nin; ++k) {
        const int op = nout + k;
        s << "    alignas(16) " << in_t(k) << " a" << k << "[V];\n";
        if (stat) {
          if (stv(op, nd - 1) == 0)
            s << "    {\n      const " << in_t(k) << " t = ((const " << in_t(k) << "*)P.ptr[" << op
              << "])[o" << op << "];\n#pragma unroll\n      for (int j = 0; j < V; ++j) a" << k
              << "[j] = t;\n    }\n";
          else
            s << "    cl_vload(a" << k << ", ((const " << in_t(k) << "*)P.ptr[" << op << "]) + o"
              << op << ");\n";
          continue;
        }
        s << "    if (P.stride[" << op << "][" << nd - 1 << "] == 0) {\n"
          << "      const " << in_t(k) << " t = ((const " << in_t(k) << "*)P.ptr[" << op << "])[o"
          << op << "];\n"
          << "#pragma unroll\n      for (int j = 0; j < V; ++j) a" << k << "[j] = t;\n"
          << "    } else {\n      cl_vload(a" << k << ", ((const " << in_t(k) << "*)P.ptr[" << op
          << "]) + o" << op << ");\n    }\n";
      }
      s << widen("    ", false);
      for (int k = 0; k < nout; ++k) s << "    alignas(16) " << body_t(k) << " b" << k << "[V];\n";
      s << "#pragma unroll\n    for (int j = 0; j < V; ++j) " << call("e0 + j", "[j]", "[j]")
        << "\n";
      for (int k = 0; k < nout; ++k)
        s << vstore(k, "    ", out_ptr(k) + " + o" + std::to_string(k), "b" + std::to_string(k));
    } else {
      for (int k = 0; k < nin; ++k)
        s << "    const " << in_t(k) << " a" << k << " = ((const " << in_t(k) << "*)P.ptr["
          << nout + k << "])[o" << nout + k << "];\n";
      for (int k = 0; k < nout; ++k) s << "    " << body_t(k) << " b" << k << ";\n";
      s << "    " << call("e0", "", "") << "\n";
      for (int k = 0; k < nout; ++k)
        s << sstore(
            k, "    ",
            "((" + out_t(k) + "*)P.ptr[" + std::to_string(k) + "])[o" + std::to_string(k) + "]");
    }
    s << "  }\n}\n";
  }
  std::string src = s.str();
  const std::string name = "castlab_k" + sha256_hex(src).substr(0, 20);
  const std::string ph = "KERNEL_NAME";
  src.replace(src.find(ph), ph.size(), name);
  return {name, src};
}

}  // namespace cuda
}  // namespace cl
