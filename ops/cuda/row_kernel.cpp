#include "ops/cuda/row_kernel.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "core/cuda/driver.h"
#include "ops/codegen/template.h"
#include "ops/cuda/codegen.h"
#include "ops/cuda/executor.h"
#include "ops/cuda/kernel_cache.h"

namespace cl {
namespace cuda {

namespace {

constexpr int64_t kRowThreads = 256;

std::vector<int32_t> pairwise_table(int64_t n);
bool balanced_table(const std::vector<int32_t>& tab);
constexpr int64_t kUnroll = 8;  // elements each thread loads before using any

std::string num(int64_t x) { return std::to_string(static_cast<long long>(x)); }

bool acc_f64(const RowStep& s, const Tensor* const* ops) {
  return ops[s.phases.at(0).q]->dtype() == kFloat64;
}

int64_t max_parts(const RowStep& s) {
  int64_t parts = 1;
  for (const RowPhase& p : s.phases)
    parts = std::max(parts, make_red_plan(p.spec, s.n, s.rows).nparts);
  return parts;
}

// Operands `ins` at elements j0 + u * blockDim (u < kUnroll, inside the row) into a<i>[u].
// The strides are the step's own (fixed when it was planned), so they are written in as
// constants: a unit stride indexes directly, and an operand constant along the row (a row
// result, a per-row scale: column stride 0) is read once per row into h<k> before the
// loop (`row_invariant_loads`), so that the epilogue's per-row arithmetic on it (RMSNorm's
// mean, + eps, rsqrt) is the same expression for every element and leaves the loop.
std::string row_invariant_loads(const RowStep& st, const Tensor* const* ops,
                                const std::vector<int>& ins) {
  std::string s;
  std::vector<int> done;
  for (int k : ins) {
    if (st.cs[k] != 0 || std::find(done.begin(), done.end(), k) != done.end()) continue;
    done.push_back(k);
    const std::string t = storage_type(ops[k]->dtype());
    s += "  const " + t + " h" + num(k) + " = ((const " + t + "*)P.ptr[" + num(k) + "])[row * " +
         num(st.rs[k]) + "LL];\n";
  }
  return s;
}

std::string unrolled_loads(const RowStep& st, const Tensor* const* ops, const std::vector<int>& ins,
                           const std::string& j0, int cached = -1) {
  std::string s;
  for (size_t a = 0; a < ins.size(); ++a) {
    const int k = ins[a];
    const std::string K = num(k), A = "a" + num(static_cast<int64_t>(a));
    const std::string t = storage_type(ops[k]->dtype());
    s += "      " + t + " " + A + "[" + num(kUnroll) + "];\n";
    if (st.cs[k] == 0) {
      s += "#pragma unroll\n      for (int u = 0; u < " + num(kUnroll) + "; ++u) " + A + "[u] = h" +
           K + ";\n";
      continue;
    }
    const std::string idx = st.cs[k] == 1 ? "j" : "(long long)j * " + num(st.cs[k]) + "LL";
    s += "      {\n        const " + t + "* p = " +
         (k == cached ? "cl_rc + csh"
                      : "(const " + t + "*)P.ptr[" + K + "] + row * " + num(st.rs[k]) + "LL") +
         ";\n";
    s += "#pragma unroll\n        for (int u = 0; u < " + num(kUnroll) + "; ++u) {\n";
    s += "          const int j = " + j0 + " + u * (int)blockDim.x;\n";
    s += "          " + A + "[u] = j < n ? p[" + idx + "] : (" + t + ")0;\n        }\n      }\n";
  }
  return s;
}

// The vector path (P.vec: every operand varying along the row has unit stride and 16-byte
// aligned rows, n % 8 == 0): thread c holds elements 8c .. 8c + 7 of each operand, read
// and written as 16-byte words (8-byte for 1-byte types).
std::string vector_word(size_t esize) { return esize == 1 ? "uint2" : "uint4"; }
int64_t vector_words(size_t esize) { return esize == 1 ? 1 : static_cast<int64_t>(esize / 2); }

std::string vector_loads(const RowStep& st, const Tensor* const* ops, const std::vector<int>& ins,
                         int cached = -1, const std::string& at = "8 * c", bool f16_mag = false) {
  std::string s = f16_mag ? "      unsigned int cl_n = 0u;\n" : "";
  for (size_t a = 0; a < ins.size(); ++a) {
    const int k = ins[a];
    const std::string K = num(k), A = "a" + num(static_cast<int64_t>(a));
    const std::string t = storage_type(ops[k]->dtype());
    const bool mag = f16_mag && ops[k]->dtype() == kFloat16;
    s += "      __align__(16) " + t + " " + A + "[8];\n";
    if (st.cs[k] == 0) {
      s += "#pragma unroll\n      for (int u = 0; u < 8; ++u) " + A + "[u] = h" + K + ";\n";
      if (mag) s += "      cl_n = cl_f16_mag(cl_n, h" + K + ");\n";
      continue;
    }
    const size_t es = static_cast<size_t>(itemsize(ops[k]->dtype()));
    const std::string w = vector_word(es);
    s += "      {\n        const " + w + "* p = (const " + w + "*)(" +
         (k == cached ? "cl_rc + csh"
                      : "(const " + t + "*)P.ptr[" + K + "] + row * " + num(st.rs[k]) + "LL") +
         " + " + at + ");\n";
    s += "#pragma unroll\n        for (int v = 0; v < " + num(vector_words(es)) + "; ++v) " +
         (es == 2 ? "{\n          cl_unpack16(" + A + " + 8 * v, p[v]);\n" +
                        (mag ? "          cl_n = cl_f16_mag(cl_n, p[v]);\n" : "") +
                        "        }\n      }\n"
                  : "((" + w + "*)" + A + ")[v] = p[v];\n      }\n");
  }
  return s;
}

// Whether any of operands `ins` is fp16.
bool any_f16(const Tensor* const* ops, const std::vector<int>& ins) {
  for (int k : ins)
    if (ops[k]->dtype() == kFloat16) return true;
  return false;
}

// Operands `ins` at element j (one element: a<i>[0], u = 0), for a row's ends around the
// vector path.
std::string single_loads(const RowStep& st, const Tensor* const* ops, const std::vector<int>& ins,
                         int cached) {
  std::string s = "      const int u = 0;\n      (void)u;\n";
  for (size_t a = 0; a < ins.size(); ++a) {
    const int k = ins[a];
    const std::string t = storage_type(ops[k]->dtype()), A = "a" + num(static_cast<int64_t>(a));
    s += "      " + t + " " + A + "[1];\n      " + A + "[0] = ";
    if (st.cs[k] == 0)
      s += "h" + num(k) + ";\n";
    else if (k == cached)
      s += "cl_rc[csh + j];\n";
    else
      s += "((const " + t + "*)P.ptr[" + num(k) + "])[row * " + num(st.rs[k]) + "LL + j];\n";
  }
  return s;
}

// The first element of the row from which every operand varying along it (`ins` and the
// stored `outs`, all of unit stride) sits on a vector boundary, in cl_hd; -1 where their
// offsets disagree (SoftMax.cu's WriteFpropResults: the same shift for input and output).
// Empty where some varying operand is strided: no vector path but P.vec's.
std::string row_head(const RowStep& st, const Tensor* const* ops, const std::vector<int>& ins,
                     const std::vector<int>& outs, int cached) {
  std::vector<int> vary;
  for (const std::vector<int>* v : {&ins, &outs})
    for (int k : *v) {
      if (st.cs[k] == 0) continue;
      if (st.cs[k] != 1) return "";
      if (std::find(vary.begin(), vary.end(), k) == vary.end()) vary.push_back(k);
    }
  if (vary.empty()) return "";
  std::string s = "    if (!P.vec) {\n";
  for (size_t i = 0; i < vary.size(); ++i) {
    const int k = vary[i];
    const size_t es = static_cast<size_t>(itemsize(ops[k]->dtype()));
    const std::string t = storage_type(ops[k]->dtype()), I = num(static_cast<int64_t>(i));
    const std::string a =
        k == cached ? "(cl_rc + csh)"
                    : "((" + t + "*)P.ptr[" + num(k) + "] + row * " + num(st.rs[k]) + "LL)";
    // vector words of 16 bytes (8 for 1-byte types): the boundary every word sits on
    const std::string m = num(es == 1 ? 7 : 15), E = num(static_cast<int64_t>(es));
    s += "      const unsigned cl_a" + I + " = (unsigned)((unsigned long long)" + a + " & " + m +
         "u);\n";
    if (i == 0) {
      s += "      cl_hd = cl_a0 % " + E + "u ? -1 : (int)(((" + m + "u + 1u - cl_a0) & " + m +
           "u) / " + E + "u);\n";
    } else {
      s += "      if (cl_hd >= 0 && ((cl_a" + I + " + (unsigned)cl_hd * " + E + "u) & " + m +
           "u) != 0u) cl_hd = -1;\n";
    }
  }
  return s + "      if (cl_hd > n) cl_hd = -1;\n    }\n";
}

// A loop over the row, twice: the vector path and the general one (kUnroll elements
// blockDim apart per thread, all loaded before any is used). `body(vec)` is the code for
// element j (its operands in a<i>[u]). The vector path runs where P.vec says every row is
// whole vectors, and else where a row's operands (`ins`, the stored `outs`) reach vector
// boundaries at the same element cl_hd (row_head): elements before it and after the last
// whole vector one at a time, as SoftMax.cu writes rows that start inside a word.
// With `hw16` and fp16 operands, the vector path folds their words' magnitudes as it loads
// them (vector_loads' cl_n), and where none is a NaN its elements run body(true,
// "each_hw") instead (row_preamble's hw16: the hardware conversion alone).
template <typename Body>
std::string row_loop(const RowStep& st, const Tensor* const* ops, const std::vector<int>& ins,
                     Body body, const std::string& row_part = "", int cached = -1,
                     const std::vector<int>& outs = {}, bool hw16 = false) {
  std::string s = "  {\n" + row_invariant_loads(st, ops, ins) + row_part;
  const std::string head = row_head(st, ops, ins, outs, cached);
  s += "    int cl_hd = P.vec ? 0 : -1;\n" + head;
  s += "    if (cl_hd >= 0) {\n";
  const std::string ends = single_loads(st, ops, ins, cached) + body(false, "each");
  if (!head.empty())
    s += "    for (int j = threadIdx.x; j < cl_hd; j += blockDim.x) {\n" + ends + "    }\n";
  s += "    const int cl_nv = (n - cl_hd) >> 3;\n#pragma unroll 2\n";
  s += "    for (int c = threadIdx.x; c < cl_nv; c += blockDim.x) {\n";
  s += "      const int cb = cl_hd + 8 * c;\n";
  const bool hw = hw16 && any_f16(ops, ins);
  s += vector_loads(st, ops, ins, cached, "cb", hw);
  s += body(true, "pre");
  const std::string each =
      "#pragma unroll\n      for (int u = 0; u < 8; ++u) {\n"
      "        const int j = cb + u;\n        (void)j;\n";
  if (hw)
    s += "      if (cl_f16_no_nan_in(cl_n)) {\n" + each + body(true, "each_hw") +
         "      }\n      } else {\n";
  s += each + body(true, "each") + "      }\n";
  if (hw) s += "      }\n";
  s += body(true, "post");
  s += "    }\n";
  if (!head.empty())
    s += "    for (int j = cl_hd + 8 * cl_nv + (int)threadIdx.x; j < n; j += blockDim.x) {\n" +
         ends + "    }\n";
  s += "    } else {\n";
  s += "    for (int j0 = threadIdx.x; j0 < n; j0 += step) {\n";
  s += unrolled_loads(st, ops, ins, "j0", cached);
  s += "#pragma unroll\n      for (int u = 0; u < " + num(kUnroll) + "; ++u) {\n";
  s += "        const int j = j0 + u * (int)blockDim.x;\n        if (j >= n) break;\n";
  s += body(false, "each");
  s += "      }\n    }\n    }\n  }\n";
  return s;
}

std::vector<uint8_t> dtypes_of(const Tensor* const* ops, const std::vector<int>& outs,
                               const std::vector<int>& ins) {
  std::vector<uint8_t> d;
  for (int k : outs) d.push_back(static_cast<uint8_t>(ops[k]->dtype()));
  for (int k : ins) d.push_back(static_cast<uint8_t>(ops[k]->dtype()));
  return d;
}

// The start of a row kernel's source: the includes, the accumulator type and the phases'
// and the epilogue's element functions (cl_phase<k>, cl_epi).
// `epi_invariant` (the register kernel): per epilogue input, whether it is the same for
// every element of the row; the epilogue is then split (emit_split_element_function) and
// `split` receives what its row part hands to its element part.
// `hw16`: the phases and the split epilogue's element part that load fp16 operands are
// templates whose <true> form widens them with the hardware conversion alone (the caller
// has checked them for NaNs: cl_f16_no_nan_in).
std::string row_preamble(const RowStep& s, const Tensor* const* ops, const std::string& what,
                         const std::vector<bool>* epi_invariant = nullptr,
                         SplitFunction* split = nullptr, bool pair_outputs = false,
                         bool hw16 = false) {
  std::string src = "// generated by castlab (ops/cuda/row_kernel.cpp" +
                    (what.empty() ? std::string() : ", " + what) + ")\n";
  bool linked_pow = s.epilogue && needs_linked_pow(*s.epilogue);
  for (const RowPhase& ph : s.phases)
    linked_pow = linked_pow || (ph.prog && needs_linked_pow(*ph.prog));
  if (linked_pow) src += kLinkPowDefine;
  src += "#include \"ops/scalar/ops.h\"\n#include \"ops/cuda/prelude.cuh\"\n";
  src += "#include \"ops/scalar/reduce.h\"\n";
  src += std::string("typedef ") + (acc_f64(s, ops) ? "double" : "float") + " ACC;\n";
  for (size_t k = 0; k < s.phases.size(); ++k) {
    const RowPhase& p = s.phases[k];
    if (p.prog)
      src += emit_element_function(*p.prog, dtypes_of(ops, {p.q}, p.ins), 1,
                                   "cl_phase" + num(static_cast<int64_t>(k)), hw16);
  }
  if (s.epilogue && epi_invariant) {
    *split = emit_split_element_function(*s.epilogue, dtypes_of(ops, s.epi_outs, s.epi_ins),
                                         static_cast<int>(s.epi_outs.size()), "cl_epi",
                                         *epi_invariant, pair_outputs, hw16);
    src += split->src;
  } else if (s.epilogue) {
    src += emit_element_function(*s.epilogue, dtypes_of(ops, s.epi_outs, s.epi_ins),
                                 static_cast<int>(s.epi_outs.size()), "cl_epi");
  }
  return src;
}

// ---- Triton's order: the row in registers ----
// Every phase in the triton order over one thread layout of 32-lane warps: thread t holds
// its tile positions (ops/scalar/reduce.h, red_triton_part) of every operand in registers,
// read once (16- or 8-byte words on the vector path); each phase folds its values as
// Triton does, combines across lanes by xor shuffles and across warps through shared
// memory, and the epilogue runs on the same registers: x is read once, y written once.
// The folds are red_triton_part's and red_triton_combine's, so the bits are theirs.
// Values per thread per operand that the register kernel holds, at most: the whole row's,
// or a tile's where a row of several tiles holds more than kTritonLoopAbove. Such a row
// runs looped (triton_looped): each phase and the epilogue read their operands a tile at
// a time from memory (the row is read once per phase, L2 holds it between them), as
// Triton's looped kernel does, in the same order of accumulation. (H100, fused HF
// RMSNorm: 16 values a thread, hidden 8,192, 0.152 ms whole-row against 0.097 ms looped;
// 12 values, hidden 5,120, 0.101 ms whole-row against 0.120 ms looped.)
constexpr int64_t kTritonMaxRegs = 64;
constexpr int64_t kTritonLoopAbove = 12;

// Blocks of `threads` threads a multiprocessor holds (the kernel's launch bound), and so
// the register kernel's grid: each block loops over rows. (One block per SM slot and a
// full SM: measured on the H200, RMSNorm [16384, 4096]: 0.143 ms against 0.166 ms with 1
// or 2 blocks of 512 threads.) The looped form keeps a tile's values and a position's
// accumulator per phase in registers: half the blocks, 64 registers a thread.
int64_t triton_blocks_per_sm(int64_t threads, bool looped = false) {
  return std::min<int64_t>(32, std::max<int64_t>(1, (looped ? 1024 : 2048) / threads));
}

// (threads, values per thread) of the register kernel for `s`, or (0, 0) where the step
// takes the general kernel.
std::pair<int64_t, int64_t> triton_layout(const RowStep& s) {
  RedPlan first;
  for (size_t k = 0; k < s.phases.size(); ++k) {
    const RowPhase& p = s.phases[k];
    if (p.spec.order != kOrdTriton || (p.spec.kind > kRedMin && p.spec.kind != kRedOnline))
      return {0, 0};
    const RedPlan P = make_red_plan(p.spec, s.n, s.rows);
    if (k == 0) first = P;
    if (P.a != first.a || P.b != first.b || P.c != first.c || P.d != first.d || P.e != first.e ||
        P.f != 0 || P.g != 0)  // (Inductor's C++ cascade or split sum: the general kernel)
      return {0, 0};
  }
  // warps combine by an xor butterfly over W lanes (a power of two, as Triton's warps)
  if (first.c != 32 || s.n <= 0 || first.d > 32 || (first.d & (first.d - 1)) != 0) return {0, 0};
  const int64_t tile = first.b * first.c * first.d;
  const int64_t its = (s.n + first.a - 1) / first.a;
  const int64_t per = its * (first.a / tile) * first.b;
  if ((first.a / tile) * first.b > kTritonMaxRegs || (its <= 1 && per > kTritonMaxRegs))
    return {0, 0};
  return {first.c * first.d, per};
}

// Whether the register kernel for `s` reads its rows a tile at a time (see kTritonMaxRegs).
bool triton_looped(const RowStep& s) {
  for (const RowPhase& p : s.phases)
    if (p.spec.kind == kRedOnline) return true;  // (its step is written for the loop only)
  const RedPlan P = make_red_plan(s.phases.at(0).spec, s.n, s.rows);
  return s.n > P.a && triton_layout(s).second > kTritonLoopAbove;
}

// For each operand: the phase whose row result it is (the same memory as that phase's q,
// read along the row with cs = 0), else -1. Such an operand takes the value the block
// already holds in registers, not a read back from global memory.
std::vector<int> row_result_aliases(const RowStep& s, const Tensor* const* ops, size_t nops) {
  std::vector<int> a(nops, -1);
  for (size_t k = 0; k < nops; ++k) {
    if (s.cs[k] != 0 || s.rs[k] != 1) continue;
    for (size_t j = 0; j < s.phases.size(); ++j) {
      const int q = s.phases[j].q;
      if (static_cast<size_t>(q) != k && ops[q]->data_ptr() == ops[k]->data_ptr() &&
          ops[q]->dtype() == ops[k]->dtype())
        a[k] = static_cast<int>(j);
    }
  }
  return a;
}

// The register kernel: its parameters, the row loop of one block (cl_trow, with the
// vector path as a template argument VEC, P.vec, so that each instantiation holds only
// its own loads and stores: one uniform branch at entry, where a runtime test inside the
// body left the element-wise loads in the loop as predicated-off instructions that still
// issue), and the kernel. A block takes row blockIdx.x, then rows by ticket
// (launch_row_kernel: as many blocks as the device holds at once; ticket base + k is row
// gridDim.x + k), so that a block that runs faster takes more rows and all finish
// together. Thread 0 takes a ticket a row before it is needed (the atomic's latency
// hides behind a row) and hands it to the block before the last phase's barrier (one
// warp: a shuffle); a block takes tickets until one is past the rows, so a launch takes
// exactly `rows` of them. `next`: the row after this one, read (`prefetch`) while this
// one is reduced; `tk`: thread 0's row after that. An operand the same for every row
// (RMSNorm's weight) is read once (`invariant_rows`). The warps' partials (wpart) are
// one buffer per parity of the block's row count: a row's writes and the previous row's
// reads of the same buffer are a barrier apart.
constexpr const char* kTritonRow = R"(
struct RowParams {
  const void* ptr[${nops}];
  long long rs[${nops}];
  long long cs[${nops}];
  long long n;
  long long vec;
  long long rows;
  unsigned long long* ctr;
  unsigned long long base;
};
template <bool VEC>
__device__ __forceinline__ void cl_trow(const RowParams P${wpart_param}) {
  const int t = threadIdx.x;
  const int n = ${n};
  (void)n;
${invariant_rows}
  const unsigned rows = (unsigned)P.rows, G = gridDim.x;
  auto take = [&]() -> unsigned {
    const unsigned long long k = atomicAdd(P.ctr, 1ull) - P.base;
    return k < (unsigned long long)(rows - G) ? G + (unsigned)k : rows;
  };
  unsigned row = blockIdx.x, next = rows, tk = rows;
  if (t == 0) {
    next = take();
    if (next < rows) tk = take();
  }
${first_next}
${first_loads}
  for (int par = 0; row < rows; par ^= 1) {
  const unsigned pre = next < rows ? next : row;
  (void)pre;  // (the looped form reads no row ahead)
  unsigned tk2 = rows;
  if (t == 0 && tk < rows) tk2 = take();
${prefetch}
${phases}
${epilogue}
${rotate}
  row = next;
  next = ${next_row};
  tk = tk2;
  }
}
extern "C" __global__ void __launch_bounds__(${threads}, ${blocks_per_sm}) KERNEL_NAME(const RowParams P) {
${wpart_decl}
  if (P.vec)
    cl_trow<true>(P${warg});
  else
    cl_trow<false>(P${warg});
}
)";

// Element e of a thread: tile `it`, repetition `rep`, k: (it * REPS + rep) * PER + k.
constexpr const char* kTritonElem =
    "((${e}) / ${rp}) * ${r} + (((${e}) / ${per}) % ${reps}) * ${tile} + t * ${per} + (${e}) % "
    "${per}";

// An operand's thread values of a row: on the vector path as words of PER elements
// (kTritonWords, absent where the operand is read one by one), else element by element.
constexpr const char* kTritonWords = R"(
    if (VEC) {
#pragma unroll
      for (int g = 0; g < ${words}; ++g) {
        const int j = ${elem};
${body}
      }
    } else
)";
constexpr const char* kTritonElems = R"(
    {
#pragma unroll
      for (int e = 0; e < ${e_count}; ++e) {
        const int j = ${elem};
${body}
      }
    }
)";

// One phase: the Program's value at each of the thread's positions, then the row's
// reduction into v (`reduce`), kept in red<K> where later code reads it.
constexpr const char* kTritonPhase = R"(
${invariants}
${hand_next}
${red_decl}
  {
    ACC y[${e_count}];
#pragma unroll
    for (int e = 0; e < ${e_count}; ++e) {
${value}
    }
    ACC v;
${reduce}
${red_keep}
    if (t == 0) ((ACC*)P.ptr[${q}])[row] = v;
  }
)";

// The looped form of one phase: each tile's operands read from memory (`loads`), the
// Program's value at each of the thread's positions of the tile, and each position's
// accumulators over the tiles (`init`, `step`: acc, Triton's r0-block accumulator; or an
// online softmax sum's running max and sum, am and as), then the positions, lanes and
// warps into v (`finish`: kTritonLoopFold, kTritonOnlineFinish).
constexpr const char* kTritonLoopPhase = R"(
${invariants}
${hand_next}
${red_decl}
  {
${init}
#pragma unroll ${unroll}
    for (int it = 0; it < ${its}; ++it) {
${loads}
      ACC y[${el}];
#pragma unroll
      for (int e = 0; e < ${el}; ++e) {
${value}
      }
#pragma unroll
      for (int e = 0; e < ${el}; ++e) {
        const bool in = ${in_row};
        ${step}
      }
    }
${finish}
${red_keep}
    if (t == 0) ((ACC*)P.ptr[${q}])[row] = v;
  }
)";

// The fold of kTritonFold after the loop: the positions' accumulators `arr` in register
// order by `op`, then the threads (TritonRow::threads).
constexpr const char* kTritonLoopFold = R"(
    ACC v = ${arr}[0];
#pragma unroll
    for (int r = 1; r < ${el}; ++r) v = ${op}v, ${arr}[r]);
${plus_zero}
${threads}
)";

// An online softmax sum (kRedOnline, ops/scalar/reduce.h red_online_part and
// red_online_combine) after the loop: the positions' maximum M (`max`: kTritonLoopFold
// over am), then each thread's sum of s_c exp(m_c - M) (RedOnlineFold) and tl.sum's
// butterflies (`sum`), the warps' buffer again once every thread has read the maximum's.
constexpr const char* kTritonOnlineFinish = R"(
${max}
    const ACC M = v;
    cl::RedOnlineFold<ACC> f;
#pragma unroll
    for (int r = 0; r < ${el}; ++r) f.add(as[r], cl::red_online_scale(am[r], M, ${impl}), ${impl});
    v = f.sum();
${sync}
${sum}
)";

// Triton's fold: per position over the tiles (looped) or the value (persistent; the
// identity past the row), then the positions in register order, then the threads (the
// lanes by an xor butterfly and the warps: TritonRow::threads).
constexpr const char* kTritonFold = R"(
    v = ACC(0);
#pragma unroll
    for (int r = 0; r < ${rp}; ++r) {
      ACC a = cl::red_identity<ACC>(${kind});
#pragma unroll
      for (int it = 0; it < ${its}; ++it) {
        const int e = it * ${rp} + r;
        const bool in = ${in_row};
        ${step}
      }
      v = r == 0 ? a : cl::red_op(${kind}, v, a);
    }
${plus_zero}
${threads}
)";

// `var` = op(var, the value `off` lanes away) for off = from, from / 2, .., 1.
constexpr const char* kTritonButterfly = R"(
#pragma unroll
    for (int off = ${from}; off > 0; off >>= 1)
      ${var} = ${op}${var}, __shfl_xor_sync(0xffffffffu, ${var}, off));
)";

// The warps' partials by Triton's tree (w += w + off for off = W/2 .. 1), as an xor
// butterfly over W lanes of every warp: lane 0 folds in the tree's order, and its value
// is every thread's (a NaN's payload included).
constexpr const char* kTritonAcrossWarps = R"(
    if ((t & 31) == 0) wpart[par][${k}][t >> 5] = ${var};
    __syncthreads();
    ${var} = wpart[par][${k}][t & ${w1}];
${butterfly}
)";

// A float maximum or minimum is one value whatever the order, unless it is a NaN (the
// fold keeps the first NaN's payload) or a zero (-0 < +0 ties): the hardware's
// NaN-propagating max/min over the row, and Triton's fold only where that gave a NaN or a
// zero (the same for every thread of the block: all see the row's value). Where every
// position is in the row the fold starts at the first value; the fold rewrites the
// warps' buffer that every thread has just read (`sync`).
constexpr const char* kTritonMaxMin = R"(
    {
      float m = ${m0};
#pragma unroll
      for (int e = ${e0}; e < ${e_count}; ++e) {
        const bool in = ${in_row};
        if (in) m = ${op}m, y[e]);
      }
${lanes}
${across_warps}
      v = m;
    }
    if (v != v || v == 0.0f) {
${sync}
${fold}
    }
)";

// The epilogue on the registers: its row-invariant part once per thread (cl_epi_row,
// RMSNorm's mean, + eps, rsqrt), then each position's outputs, those left in float
// rounded two at a time (the same bits), then stored.
constexpr const char* kTritonEpilogue = R"(
${invariants}
${out_decls}
  cl_epi_row(${row_args});
#pragma unroll
  for (int e = 0; e < ${e_count}; ++e) {
    cl_epi(0ull, 0ull${args});
  }
${rounding}
${stores}
)";

// The register kernel's generator for one step: its layout (RedPlan P0: R values a
// tile, PER a thread's run, W warps, NT threads, E values per thread per operand) and
// the operands' roles: phase results (registers), row invariants (one load), varying
// (registers; per_row: those read for every row).
struct TritonRow {
  const RowStep& s;
  const Tensor* const* ops;
  std::vector<int> alias, qs, varying, inv, per_row, loaded;
  RedPlan P0;
  int64_t R, PER, W, NT, TILE, ITS, REPS, E;
  // looped (triton_looped): the thread's values of one tile at a time, EL = REPS * PER of
  // them; else EL = E, the whole row's
  int64_t EL;
  bool f64, full, looped;
  std::vector<bool> epi_inv;  // the epilogue's row-invariant inputs
  SplitFunction epi;

  TritonRow(const RowStep& st, const Tensor* const* o, size_t nops, std::pair<int64_t, int64_t> lay)
      : s(st), ops(o), alias(row_result_aliases(st, o, nops)) {
    P0 = make_red_plan(s.phases[0].spec, s.n, s.rows);
    R = P0.a, PER = P0.b, W = P0.d, NT = lay.first, TILE = PER * NT;
    ITS = (s.n + R - 1) / R, REPS = R / TILE, E = lay.second;
    looped = triton_looped(s);
    EL = looped ? REPS * PER : E;
    f64 = acc_f64(s, ops);
    for (const RowPhase& p : s.phases) qs.push_back(p.q);
    for (int k : s.epi_ins) epi_inv.push_back(row_result(k) || s.cs[k] == 0);
    // every thread's positions inside the row (n a multiple of the tile): no bounds checks
    full = true;
    for (int64_t e = 0; e < E; ++e)
      full = full &&
             (e / (REPS * PER)) * R + ((e / PER) % REPS) * TILE + (NT - 1) * PER + e % PER < s.n;
    for (const RowPhase& p : s.phases)
      for (int k : p.ins) note(k);
    for (int k : s.epi_ins) note(k);
    for (int k : varying)
      if (s.rs[k] != 0) per_row.push_back(k);
  }
  bool row_result(int k) const {
    return std::find(qs.begin(), qs.end(), k) != qs.end() || alias[k] >= 0;
  }
  void note(int k) {
    if (row_result(k)) return;
    auto& v = s.cs[k] == 0 ? inv : varying;
    if (std::find(v.begin(), v.end(), k) == v.end()) v.push_back(k);
  }
  std::string guard() const { return full ? "" : "if (j < n) "; }
  // element `e` of the thread's values in the loop body: of the row, or of tile `it`
  std::string at(const std::string& e) const {
    return elem(looped ? "it * " + num(EL) + " + " + e : e);
  }
  // The looped form's reads of a tile: each operand of `ins` that runs along the row.
  std::string tile_loads(const std::vector<int>& ins) const {
    std::string r;
    std::vector<int> done;
    for (int k : ins) {
      if (std::find(varying.begin(), varying.end(), k) == varying.end() ||
          std::find(done.begin(), done.end(), k) != done.end())
        continue;
      done.push_back(k);
      r += decl(k, "o" + num(k)) + load_row(k, "row", "o" + num(k));
    }
    return r;
  }
  std::string wdims() const {
    return "[" + num(static_cast<int64_t>(s.phases.size())) + "][" + num(W) + "]";
  }
  std::string elem(const std::string& e) const {
    return codegen::fill(kTritonElem, {{"e", e},
                                       {"rp", num(REPS * PER)},
                                       {"r", num(R)},
                                       {"per", num(PER)},
                                       {"reps", num(REPS)},
                                       {"tile", num(TILE)}});
  }
  // A row invariant is read where it is first used, after the phases before it have
  // written their results (an operand may be an earlier phase's result under another
  // index: the same memory, written by thread 0 before the barrier).
  std::string load_invariants(const std::vector<int>& ins, bool after_phase) {
    std::string r;
    for (int k : ins) {
      if (std::find(inv.begin(), inv.end(), k) == inv.end() ||
          std::find(loaded.begin(), loaded.end(), k) != loaded.end())
        continue;
      if (r.empty() && after_phase) r += "  __syncthreads();\n";
      loaded.push_back(k);
      const std::string t = storage_type(ops[k]->dtype());
      r += "  const " + t + " h" + num(k) + " = ((const " + t + "*)P.ptr[" + num(k) + "])[row * " +
           num(s.rs[k]) + "LL];\n";
    }
    return r;
  }
  // Operand k's thread values as words of PER elements (unit stride, rows on 16-byte
  // boundaries: P.vec), or "" where they are read one by one.
  std::string word(int k) const {
    const int64_t bytes = PER * static_cast<int64_t>(itemsize(ops[k]->dtype()));
    if (s.cs[k] != 1 || PER > 8) return "";
    return bytes == 16 ? "uint4" : bytes == 8 ? "uint2" : bytes == 4 ? "uint1" : "";
  }
  std::string idx(int k) const {
    return s.cs[k] == 1 ? "j" : "(long long)j * " + num(s.cs[k]) + "LL";
  }
  // A loop over the thread's values: words (g) on the vector path, else elements (e).
  std::string loops(int k, const std::string& words, const std::string& elems) const {
    std::string r;
    if (!word(k).empty())
      r = codegen::fill(
          kTritonWords,
          {{"words", num(EL / PER)}, {"elem", at("g * " + num(PER))}, {"body", words}});
    return r +
           codegen::fill(kTritonElems, {{"e_count", num(EL)}, {"elem", at("e")}, {"body", elems}});
  }
  // Operand k's values of row `r` into the thread's array `o`.
  std::string load_row(int k, const std::string& r, const std::string& o) const {
    const std::string t = storage_type(ops[k]->dtype()), w = word(k);
    const std::string at = "(" + o + " + g * " + num(PER) + ")";
    const std::string words = "        " + guard() +
                              (itemsize(ops[k]->dtype()) == 2
                                   ? "cl_unpack16(" + at + ", *(const " + w + "*)(p + j));\n"
                                   : "*(" + w + "*)" + at + " = *(const " + w + "*)(p + j);\n") +
                              (full ? "" : "        else *(" + w + "*)" + at + " = " + w + "{};\n");
    const std::string elems =
        "        " + o +
        "[e] = " + (full ? "p[" + idx(k) + "]" : "j < n ? p[" + idx(k) + "] : (" + t + ")0") +
        ";\n";
    return "  {\n    const " + t + "* p = (const " + t + "*)P.ptr[" + num(k) + "] + " + r + " * " +
           num(s.rs[k]) + "LL;\n" + loops(k, words, elems) + "  }\n";
  }
  std::string decl(int k, const std::string& o) const {
    return std::string("  __align__(16) ") + storage_type(ops[k]->dtype()) + " " + o + "[" +
           num(EL) + "];\n";
  }
  std::string arg(int k) const {
    if (alias[k] >= 0) return "red" + num(alias[k]);
    for (size_t j = 0; j < qs.size(); ++j)
      if (qs[j] == k) return "red" + num(static_cast<int64_t>(j));
    return (s.cs[k] == 0 ? "h" : "o") + num(k) + (s.cs[k] == 0 ? "" : "[e]");
  }
  std::string in_row() const { return full ? "true" : at("e") + " < n"; }
  static std::string butterfly(const std::string& var, const std::string& op, int64_t from) {
    return codegen::fill(kTritonButterfly, {{"var", var}, {"op", op}, {"from", num(from)}});
  }
  std::string across_warps(const std::string& var, const std::string& op,
                           const std::string& K) const {
    return codegen::fill(
        kTritonAcrossWarps,
        {{"var", var}, {"k", K}, {"w1", num(W - 1)}, {"butterfly", butterfly(var, op, W / 2)}});
  }
  // The threads' values of v combined as Triton does, by `op`: the lanes' xor butterfly,
  // lane 0's value, then the warps' (every thread ends with the row's value).
  std::string threads(const std::string& op, const std::string& K) const {
    const std::string lane0 = "    v = __shfl_sync(0xffffffffu, v, 0);\n";
    return butterfly("v", op, 16) + lane0 + (W > 1 ? across_warps("v", op, K) + lane0 : "");
  }
  std::string fold(const RowPhase& p, const std::string& K) const;
  std::string phase(size_t ph);
  std::string epilogue();
  std::string source(size_t nops);
};

// Triton's fold of phase K's values y[] into v. A float sum starts each position's fold
// at its first value, not at 0 + that value (Triton's looped fold): the partial sums are
// the same numbers, and only a zero's sign can differ, where every value added was a
// zero. Triton's sum is never -0 (an addend 0 + y is not), and a NaN comes out of any
// addition as the canonical NaN: so one final + 0 gives its bits. One addition a row,
// not one a value.
std::string TritonRow::fold(const RowPhase& p, const std::string& K) const {
  const std::string kind = num(p.spec.kind);
  const bool from_first = P0.e && !f64 && p.spec.kind == kRedSum;
  const std::string step = from_first
                               ? "if (in) a = it == 0 ? y[e] : cl::red_op(" + kind + ", a, y[e]);"
                           : P0.e ? "if (in) a = cl::red_op(" + kind + ", a, y[e]);"
                                  : std::string("if (in) a = y[e];");
  const std::string red_op = "cl::red_op(" + kind + ", ";
  return codegen::fill(kTritonFold, {{"rp", num(REPS * PER)},
                                     {"kind", kind},
                                     {"its", num(ITS)},
                                     {"in_row", in_row()},
                                     {"step", step},
                                     {"plus_zero", from_first ? "    v = v + 0.0f;\n" : ""},
                                     {"threads", threads(red_op, K)}});
}

std::string TritonRow::phase(size_t ph) {
  const RowPhase& p = s.phases[ph];
  const std::string K = num(static_cast<int64_t>(ph));
  auto reads = [&](const std::vector<int>& ins) {
    for (int k : ins)
      if (k == p.q || alias[k] == static_cast<int>(ph)) return true;
    return false;
  };
  bool used = reads(s.epi_ins);
  for (const RowPhase& later : s.phases) used = used || reads(later.ins);
  std::string value;
  if (p.prog) {
    value = "      cl_phase" + K + "(0ull, 0ull";
    for (int k : p.ins) value += ", " + arg(k);
    value += ", y[e]);\n";
  } else {
    value = "      y[e] = " + arg(p.ins[0]) + ";\n";
  }
  if (looped) {
    const std::string kind = num(p.spec.kind), red_op = "cl::red_op(" + kind + ", ";
    std::string init, step, finish;
    if (p.spec.kind == kRedOnline) {
      const std::string mx = "cl::red_tri_maximum(", add = "cl::red_op(0, ";
      init = "    const ACC ninf = cl::red_identity<ACC>(1);\n    ACC am[" + num(EL) + "], as[" +
             num(EL) + "];\n#pragma unroll\n    for (int e = 0; e < " + num(EL) +
             "; ++e) {\n      am[e] = ninf;\n      as[e] = ACC(0);\n    }\n";
      const std::string impl = num(make_red_plan(p.spec, s.n, s.rows).impl);
      step = "if (in) cl::red_online_step(am[e], as[e], y[e], " + impl + ");";
      finish =
          codegen::fill(kTritonOnlineFinish,
                        {{"max", codegen::fill(kTritonLoopFold, {{"arr", "am"},
                                                                 {"el", num(EL)},
                                                                 {"op", mx},
                                                                 {"plus_zero", ""},
                                                                 {"threads", threads(mx, K)}})},
                         {"el", num(EL)},
                         {"impl", impl},
                         {"sync", W > 1 ? "    __syncthreads();\n" : ""},
                         {"sum", threads(add, K)}});
    } else {
      const bool from_first = !f64 && p.spec.kind == kRedSum;
      init = "    ACC acc[" + num(EL) + "];\n#pragma unroll\n    for (int e = 0; e < " + num(EL) +
             "; ++e) acc[e] = cl::red_identity<ACC>(" + kind + ");\n";
      step = from_first ? "if (in) acc[e] = it == 0 ? y[e] : " + red_op + "acc[e], y[e]);"
                        : "if (in) acc[e] = " + red_op + "acc[e], y[e]);";
      finish =
          codegen::fill(kTritonLoopFold, {{"arr", "acc"},
                                          {"el", num(EL)},
                                          {"op", red_op},
                                          {"plus_zero", from_first ? "    v = v + 0.0f;\n" : ""},
                                          {"threads", threads(red_op, K)}});
    }
    return codegen::fill(
        kTritonLoopPhase,
        {{"invariants", load_invariants(p.ins, ph > 0)},
         {"hand_next", W > 1 && ph + 1 == s.phases.size() ? "  if (t == 0) nxt[par] = tk;\n" : ""},
         {"red_decl", used ? "  ACC red" + K + ";\n" : ""},
         {"init", init},
         {"unroll", num(EL <= 8 ? 4 : 2)},
         {"its", num(ITS)},
         {"loads", tile_loads(p.ins)},
         {"el", num(EL)},
         {"value", value},
         {"in_row", in_row()},
         {"step", step},
         {"finish", finish},
         {"red_keep", used ? "    red" + K + " = v;\n" : ""},
         {"q", num(p.q)}});
  }
  std::string reduce = fold(p, K);
  if (!f64 && (p.spec.kind == kRedMax || p.spec.kind == kRedMin)) {
    const std::string op =
        std::string("cl::cl_max_min_nan<") + (p.spec.kind == kRedMax ? "true" : "false") + ">(";
    reduce = codegen::fill(
        kTritonMaxMin,
        {{"m0", full ? std::string("y[0]") : "cl::red_identity<ACC>(" + num(p.spec.kind) + ")"},
         {"e0", full ? "1" : "0"},
         {"e_count", num(E)},
         {"in_row", in_row()},
         {"op", op},
         {"lanes", butterfly("m", op, 16)},
         {"across_warps", W > 1 ? across_warps("m", op, K) : ""},
         {"sync", W > 1 ? "    __syncthreads();\n" : ""},
         {"fold", reduce}});
  }
  const std::string invariants = load_invariants(p.ins, ph > 0);
  return codegen::fill(
      kTritonPhase,
      {{"invariants", invariants},
       {"hand_next", W > 1 && ph + 1 == s.phases.size() ? "  if (t == 0) nxt[par] = tk;\n" : ""},
       {"red_decl", used ? "  ACC red" + K + ";\n" : ""},
       {"e_count", num(E)},
       {"value", value},
       {"reduce", reduce},
       {"red_keep", used ? "    red" + K + " = v;\n" : ""},
       {"q", num(p.q)}});
}

std::string TritonRow::epilogue() {
  if (!s.epilogue) return "";
  const std::string invariants = load_invariants(s.epi_ins, true);
  std::string out_decls, row_args, args, rounding, stores;
  for (size_t o = 0; o < s.epi_outs.size(); ++o) {
    const int k = s.epi_outs[o];
    const std::string t = storage_type(ops[k]->dtype()), O = num(static_cast<int64_t>(o));
    out_decls += "  __align__(16) " + t + " yo" + O + "[" + num(EL) + "];\n";
    if (epi.paired[o]) out_decls += "  float yf" + O + "[" + num(EL) + "];\n";
  }
  std::string handed_decls;
  for (size_t j = 0; j < s.epi_ins.size(); ++j)
    if (epi_inv[j]) row_args += (row_args.empty() ? "" : ", ") + arg(s.epi_ins[j]);
  for (int k : s.epi_ins) args += ", " + arg(k);
  for (size_t j = 0; j < epi.handed.size(); ++j) {
    const std::string h = "eh" + num(epi.handed[j]);
    handed_decls += "  " + epi.types[j] + " " + h + ";\n";
    row_args += (row_args.empty() ? "" : ", ") + h;
    args += ", " + h;
  }
  for (size_t o = 0; o < s.epi_outs.size(); ++o)
    args += (epi.paired[o] ? ", yf" : ", yo") + num(static_cast<int64_t>(o)) + "[e]";
  for (size_t o = 0; o < s.epi_outs.size(); ++o) {
    const int k = s.epi_outs[o];
    const std::string t = storage_type(ops[k]->dtype()), O = num(static_cast<int64_t>(o));
    if (epi.paired[o])
      rounding += "#pragma unroll\n  " +
                  paired_rounding(ops[k]->dtype(), "yo" + O, "yf" + O, num(EL), EL % 2 == 0);
    const std::string w = word(k);
    stores += "  {\n    " + t + "* p = (" + t + "*)P.ptr[" + num(k) + "] + row * " + num(s.rs[k]) +
              "LL;\n" +
              loops(k,
                    "        " + guard() + "*(" + w + "*)(p + j) = *(const " + w + "*)(yo" + O +
                        " + g * " + num(PER) + ");\n",
                    "        " + guard() + "p[" + idx(k) + "] = yo" + O + "[e];\n") +
              "  }\n";
  }
  if (!looped)
    return codegen::fill(kTritonEpilogue, {{"invariants", invariants},
                                           {"out_decls", handed_decls + out_decls},
                                           {"row_args", row_args},
                                           {"e_count", num(EL)},
                                           {"args", args},
                                           {"rounding", rounding},
                                           {"stores", stores}});
  // looped: the row-invariant part once, then tile by tile (kTritonEpilogue's body)
  const std::string body = codegen::fill(kTritonEpilogue, {{"invariants", tile_loads(s.epi_ins)},
                                                           {"out_decls", out_decls},
                                                           {"row_args", ""},
                                                           {"e_count", num(EL)},
                                                           {"args", args},
                                                           {"rounding", rounding},
                                                           {"stores", stores}});
  const std::string row_call = "  cl_epi_row(" + row_args + ");\n";
  std::string loop_body = body;
  const size_t at_call = loop_body.find("  cl_epi_row(");
  loop_body.erase(at_call, loop_body.find('\n', at_call) + 1 - at_call);
  return invariants + handed_decls + row_call + "#pragma unroll " + num(EL <= 8 ? 4 : 2) +
         "\n  for (int it = 0; it < " + num(ITS) + "; ++it) {\n" + loop_body + "  }\n";
}

std::string TritonRow::source(size_t nops) {
  std::string src = row_preamble(s, ops, "triton order", &epi_inv, &epi, true);
  std::string invariant_rows, first_loads, prefetch, phases, rotate;
  for (int k : looped ? std::vector<int>{} : varying) {
    invariant_rows += decl(k, "o" + num(k));
    if (s.rs[k] == 0) invariant_rows += load_row(k, "0", "o" + num(k));
  }
  for (int k : looped ? std::vector<int>{} : per_row) {
    first_loads += load_row(k, "row", "o" + num(k));
    prefetch += decl(k, "p" + num(k)) + load_row(k, "pre", "p" + num(k));
    rotate += "#pragma unroll\n  for (int e = 0; e < " + num(E) + "; ++e) o" + num(k) + "[e] = p" +
              num(k) + "[e];\n";
  }
  for (size_t ph = 0; ph < s.phases.size(); ++ph) phases += phase(ph);
  const std::string warg = W > 1 ? ", wpart" : "";
  src += codegen::fill(
      kTritonRow,
      {{"nops", num(static_cast<int64_t>(nops))},
       {"wpart_param", W > 1 ? ", ACC (*wpart)" + wdims() : std::string()},
       {"n", num(s.n)},
       {"invariant_rows", invariant_rows},
       {"first_next", W > 1 ? "  __shared__ unsigned nxt[2];\n  if (t == 0) nxt[1] = next;\n"
                              "  __syncthreads();\n  next = nxt[1];\n"
                            : "  next = __shfl_sync(0xffffffffu, next, 0);\n"},
       {"first_loads", first_loads},
       {"prefetch", prefetch},
       {"phases", phases},
       {"epilogue", epilogue()},
       {"rotate", rotate},
       {"next_row", W > 1 ? "nxt[par]" : "__shfl_sync(0xffffffffu, tk, 0)"},
       {"threads", num(NT)},
       {"blocks_per_sm", num(triton_blocks_per_sm(NT, looped))},
       {"wpart_decl", W > 1 ? "  __shared__ ACC wpart[2]" + wdims() + ";\n" : ""},
       {"warg", warg}});
  const std::string name = "castlab_trow" + sha256_hex(src).substr(0, 20);
  src.replace(src.find("KERNEL_NAME"), 11, name);
  return src;
}

std::string triton_row_source(const RowStep& s, const Tensor* const* ops, size_t nops) {
  const auto lay = triton_layout(s);
  if (lay.first == 0) return "";
  TritonRow g(s, ops, nops, lay);
  return g.source(nops);
}

// The general kernels' parameter block (ops[] pointers and strides, n, the vector path,
// each phase's plan and pairwise table), as launch_row_kernel fills it.
std::string row_params_struct(const RowStep& s, size_t nops) {
  return "struct RowParams {\n  const void* ptr[" + num(static_cast<int64_t>(nops)) +
         "];\n  long long rs[" + num(static_cast<int64_t>(nops)) + "];\n  long long cs[" +
         num(static_cast<int64_t>(nops)) +
         "];\n  long long n;\n  long long vec;\n  cl::RedPlan plan[" +
         num(static_cast<int64_t>(s.phases.size())) + "];\n  const int* tab[" +
         num(static_cast<int64_t>(s.phases.size())) + "];\n};\n";
}

// Per epilogue input, whether it is the same for every element of the row (a row result,
// a per-row scale: column stride 0).
std::vector<bool> epilogue_invariants(const RowStep& s) {
  std::vector<bool> inv;
  for (int k : s.epi_ins) inv.push_back(s.cs[k] == 0);
  return inv;
}

// The epilogue over the row's elements (row_loop: the vector path and the general one),
// writing the outputs; empty without an epilogue. With `split` (from row_preamble with
// epilogue_invariants) its row-invariant part (log_softmax's log of the row sum with its
// special cases) runs once per thread before the loop (cl_epi_row), and each element only
// what reads the row's elements (cl_epi); a bf16/fp16 output the split leaves in float
// (`paired`) is rounded two elements at a time on the vector path (one paired conversion,
// the same bits as two single ones).
std::string epilogue_source(const RowStep& s, const Tensor* const* ops,
                            const SplitFunction* split = nullptr, int cached = -1) {
  std::string src;
  if (s.epilogue) {
    std::string row_part, handed;
    if (split) {
      for (size_t j = 0; j < split->handed.size(); ++j) {
        const std::string h = "eh" + num(split->handed[j]);
        row_part += "    " + split->types[j] + " " + h + ";\n";
        handed += ", " + h;
      }
      std::string row_args;
      const std::vector<bool> inv = epilogue_invariants(s);
      for (size_t j = 0; j < s.epi_ins.size(); ++j)
        if (inv[j]) row_args += (row_args.empty() ? "h" : ", h") + num(s.epi_ins[j]);
      row_args += row_args.empty() && !handed.empty() ? handed.substr(2) : handed;
      row_part += "    cl_epi_row(" + row_args + ");\n";
    }
    const auto paired = [&](size_t o) {
      return split && o < split->paired.size() && split->paired[o];
    };
    const auto body = [&](bool vec, const char* where) -> std::string {
      const std::string w(where);
      std::string b;
      if (w == "pre") {  // the outputs of the 8 elements, stored as words after
        for (size_t o = 0; o < s.epi_outs.size(); ++o) {
          b += "      __align__(16) " + std::string(storage_type(ops[s.epi_outs[o]]->dtype())) +
               " yv" + num(static_cast<int64_t>(o)) + "[8];\n";
          if (paired(o)) b += "      float yf" + num(static_cast<int64_t>(o)) + "[8];\n";
        }
        return b;
      }
      if (w == "post") {
        for (size_t o = 0; o < s.epi_outs.size(); ++o) {
          const int k = s.epi_outs[o];
          const std::string t = storage_type(ops[k]->dtype());
          if (paired(o))
            b += "#pragma unroll\n      " +
                 paired_rounding(ops[k]->dtype(), "yv" + num(static_cast<int64_t>(o)),
                                 "yf" + num(static_cast<int64_t>(o)), "8", true);
          const size_t es = static_cast<size_t>(itemsize(ops[k]->dtype()));
          const std::string vw = vector_word(es);
          b += "      {\n        " + vw + "* q = (" + vw + "*)((" + t + "*)P.ptr[" + num(k) +
               "] + row * " + num(s.rs[k]) + "LL + cb);\n";
          b += "#pragma unroll\n        for (int v = 0; v < " + num(vector_words(es)) +
               "; ++v) q[v] = ((const " + vw + "*)yv" + num(static_cast<int64_t>(o)) +
               ")[v];\n      }\n";
        }
        return b;
      }
      for (size_t o = 0; o < s.epi_outs.size(); ++o)
        b += "        " +
             std::string(paired(o) ? "float" : storage_type(ops[s.epi_outs[o]]->dtype())) + " y" +
             num(static_cast<int64_t>(o)) + ";\n";
      b += std::string("        cl_epi") + (w == "each_hw" ? "<true>" : "") + "(0ull, 0ull";
      for (size_t a = 0; a < s.epi_ins.size(); ++a)
        b += ", a" + num(static_cast<int64_t>(a)) + "[u]";
      b += handed;
      for (size_t o = 0; o < s.epi_outs.size(); ++o) b += ", y" + num(static_cast<int64_t>(o));
      b += ");\n";
      for (size_t o = 0; o < s.epi_outs.size(); ++o) {
        const int k = s.epi_outs[o];
        const std::string Y = num(static_cast<int64_t>(o));
        if (vec) {
          b += "        y" + std::string(paired(o) ? "f" : "v") + Y + "[u] = y" + Y + ";\n";
        } else {
          const std::string idx = s.cs[k] == 1 ? "j" : "(long long)j * " + num(s.cs[k]) + "LL";
          const std::string y = paired(o) ? rne_16(ops[k]->dtype(), "y" + Y) : "y" + Y;
          b += "        ((" + std::string(storage_type(ops[k]->dtype())) + "*)P.ptr[" + num(k) +
               "])[row * " + num(s.rs[k]) + "LL + " + idx + "] = " + y + ";\n";
        }
      }
      return b;
    };
    src += row_loop(s, ops, s.epi_ins, body, row_part, cached, s.epi_outs, split && split->hw16);
  }
  return src;
}

// ---- SoftMax.cu's orders: the kernel's own threads, the row read from memory ----
// Where every phase takes SoftMax.cu's warp or block order, a block of the order's threads
// (block: one thread per SoftMax.cu thread, up to 1024) computes each thread's value
// (red_softmax_thread / red_softmax_part) straight from the operands in global memory,
// evaluating the phase's Program element by element as it reads them, as PyTorch's
// kernel does (any row length fits; a short enough row kept in shared memory after the
// first phase: srow_cache), then the warps' values and the block's in the order's trees;
// the epilogue as the general kernel's.
// Returns the block's thread count, 0 where the phases take other orders.
// The phase's values at elements i .. i + ilp - 1 of the row into out[]: each operand that
// runs along the row read as 16-byte words where its address allows (else one element at
// a time), then the phase's Program on each element, as `value` computes it.
std::string chunk_lambda(const RowStep& s, const Tensor* const* ops, const RowPhase& p,
                         const std::string& K, int64_t ilp, int cached, bool first) {
  const std::string L = num(ilp);
  // al: cl::RedBool<true> where the caller tested `aligned` once for the loop (every
  // chunk it reads is then on a 16-byte boundary), RedBool<false> to test each chunk
  std::string src = "    auto chunk = [&](long long i, ACC* out, auto al) {\n";
  std::string aligned;  // the vector operands' addresses at i, or'ed
  // fp16 operands: their magnitudes folded as they are read (cl_n), for one NaN test
  const bool hw = p.prog && any_f16(ops, p.ins);
  if (hw) src += "      unsigned int cl_n = 0u;\n";
  for (size_t a = 0; a < p.ins.size(); ++a) {
    const int q = p.ins[a];
    const std::string t = storage_type(ops[q]->dtype()), A = "a" + num(static_cast<int64_t>(a));
    const int64_t bytes = ilp * itemsize(ops[q]->dtype());
    const std::string mag =
        hw && ops[q]->dtype() == kFloat16 ? "cl_n = cl_f16_mag(cl_n, " : std::string();
    if (s.cs[q] == 0) {
      src += "      const " + t + " " + A + " = h" + num(q) + ";\n";
      if (!mag.empty()) src += "      " + mag + A + ");\n";
      continue;
    }
    src += "      __align__(16) " + t + " " + A + "[" + L + "];\n";
    const bool from_cache = q == cached && !first, to_cache = q == cached && first;
    const std::string base =
        from_cache ? "((const " + t + "*)(cl_rc + csh))"
                   : "((const " + t + "*)P.ptr[" + num(q) + "] + row * " + num(s.rs[q]) + "LL)";
    if (s.cs[q] == 1 && bytes % 16 == 0) {
      src += "      {\n        const " + t + "* p = " + base + " + i;\n";
      src +=
          "        if (decltype(al)::value || ((unsigned long long)p & 15ull) == 0ull) {\n"
          "#pragma unroll\n";
      aligned +=
          std::string(aligned.empty() ? "" : " | ") + "(unsigned long long)(" + base + " + i)";
      // 16-bit values by masks and shifts of the word's halves (cl_unpack16: one
      // instruction to widen each, where a copy through the array took two), and the row
      // cache's copy from the word itself (the cache's element csh + i is on a 16-byte
      // boundary where p is)
      const bool half = itemsize(ops[q]->dtype()) == 2;
      src += "          for (int w = 0; w < " + num(bytes / 16) +
             "; ++w) {\n            const uint4 cw = ((const uint4*)p)[w];\n            " +
             (half ? "cl_unpack16(" + A + " + 8 * w, cw);\n" : "((uint4*)" + A + ")[w] = cw;\n") +
             (mag.empty() ? "" : "            " + mag + "cw);\n") +
             (to_cache ? "            ((uint4*)(cl_rc + csh + i))[w] = cw;\n" : "") +
             "          }\n";
      src += "        } else {\n#pragma unroll\n          for (int k = 0; k < " + L + "; ++k) " +
             A + "[k] = p[k];\n";
      if (!mag.empty()) src += "          " + mag + A + ");\n";
      if (to_cache)
        src += "#pragma unroll\n          for (int k = 0; k < " + L +
               "; ++k) cl_rc[csh + i + k] = " + A + "[k];\n";
      src += "        }\n      }\n";
    } else {
      const std::string idx = s.cs[q] == 1 ? "(i + k)" : "(i + k) * " + num(s.cs[q]) + "LL";
      src += "#pragma unroll\n      for (int k = 0; k < " + L + "; ++k) " + A + "[k] = " + base +
             "[" + idx + "];\n";
      if (!mag.empty()) src += "      " + mag + A + ");\n";
    }
  }
  // the phase on each element; where its fp16 operands hold no NaN (one test for the
  // chunk), its <true> form, which widens them with the hardware conversion alone
  const auto each = [&](const std::string& tmpl) {
    std::string e = "#pragma unroll\n      for (int k = 0; k < " + L + "; ++k) {\n";
    if (p.prog) {
      e += "        ACC y;\n        cl_phase" + K + tmpl + "(0ull, 0ull";
      for (size_t a = 0; a < p.ins.size(); ++a) {
        const std::string A = "a" + num(static_cast<int64_t>(a));
        e += ", " + A + (s.cs[p.ins[a]] == 0 ? "" : "[k]");
      }
      e += ", y);\n        out[k] = y;\n";
    } else {
      e += "        out[k] = (ACC)a0" + std::string(s.cs[p.ins[0]] == 0 ? "" : "[k]") + ";\n";
    }
    return e + "      }\n";
  };
  if (hw)
    src += "      if (cl_f16_no_nan_in(cl_n)) {\n" + each("<true>") + "      } else {\n" +
           each("") + "      }\n";
  else
    src += each("");
  src += "    };\n";
  src += "    auto aligned = [&](long long i) -> bool {\n      (void)i;\n      return " +
         (aligned.empty() ? std::string("true") : "((" + aligned + ") & 15ull) == 0ull") +
         ";\n    };\n";
  return src;
}

int64_t torch_threads(const RowStep& s) {
  int64_t t = 0;
  for (const RowPhase& p : s.phases) {
    if (p.spec.kind > kRedMin) return 0;
    if (p.spec.order == kOrdSoftmaxWarp) {
      t = std::max<int64_t>(t, 32);
    } else if (p.spec.order == kOrdSoftmaxBlock) {
      t = std::max<int64_t>(t, make_red_plan(p.spec, s.n, s.rows).a);
    } else {
      return 0;
    }
  }
  return s.n > int64_t(0x3FFFFFFF) ? 0 : t;
}

// The SoftMax.cu kernel: a row accessor over the phase's values (CallRow; CallRowChunk
// with G: ILP consecutive values at once, cl::red_chunk, the operands read as vectors;
// H: whether those vectors are aligned at an element, cl::red_chunks_aligned),
// then each phase (kSoftmaxPhase) and the epilogue. `lanes`: the block order's per-thread
// values (the warp kernel's lanes are its parts).
constexpr const char* kSoftmaxKernel = R"(
template <typename F>
struct CallRow {
  F f;
  __device__ ACC operator[](long long i) const { return f(i); }
};
template <typename F, typename G, typename H>
struct CallRowChunk {
  F f;
  G g;
  H h;
  __device__ ACC operator[](long long i) const { return f(i); }
  template <int ILP, bool AL>
  __device__ void chunk(long long i, ACC* out) const { g(i, out, cl::RedBool<AL>{}); }
  __device__ bool aligned(long long i) const { return h(i); }
};
extern "C" __global__ void __launch_bounds__(${threads}, ${blocks}) KERNEL_NAME(const RowParams P) {
${lanes}
${parts}
  const long long row = blockIdx.x;
  const int n = (int)P.n;
  const int step = (int)blockDim.x * ${unroll};
  (void)step;
${cache}
${phases}
${epilogue}
}
)";

// One phase: its value at element i of the row (its operands read as the order reads
// them), the order's parts (`reduce`) and their combination into the phase's result.
constexpr const char* kSoftmaxPhase = R"(
  {
${invariants}
    auto value = [&](long long i) -> ACC {
${operands}
${value}
    };
${chunk}
    const ${call};
${reduce}
    __syncthreads();
  }
)";

// Thread 0 combines the parts in the order's tree (the warp kernel's butterfly, or
// blockReduce's warps in order).
constexpr const char* kSoftmaxCombine = R"(
    __syncthreads();
    if (threadIdx.x == 0) ((ACC*)P.ptr[${q}])[row] = cl::red_softmax_combine(${pl}, parts);
)";

// The forward block order as cuda_utils::BlockReduce runs it (block_reduce.cuh): each
// warp's 32 values by shuffles down, offsets 16 to 1 (red_warp_down's tree: lane l takes
// its own value op lane l + off's), lane 0's into parts[warp]; then warp 0 the same over
// the warps' values (the identity past the last warp), and lane 0 writes the row's value.
// No thread walks a tree alone, and no array of values lives in local memory.
constexpr const char* kSoftmaxBlockShfl = R"(
    const int t = threadIdx.x;
${thread}
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) r = cl::red_op(${kind}, r, __shfl_down_sync(0xffffffffu, r, off));
    if ((t & 31) == 0) parts[t >> 5] = r;
    __syncthreads();
    if (t < 32) {
      ACC w = t < ${pl}.nparts ? parts[t] : cl::red_identity<ACC>(${kind});
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) w = cl::red_op(${kind}, w, __shfl_down_sync(0xffffffffu, w, off));
      if (t == 0) ((ACC*)P.ptr[${q}])[row] = w;
    }
)";

// The backward block order (cunn_SoftMaxBackward's blockReduce): each thread's value
// (red_softmax_thread), then each warp's 32 values in order from the identity into the
// parts; thread 0 adds the parts in order (kSoftmaxCombine).
constexpr const char* kSoftmaxBlock = R"(
    const int t = threadIdx.x;
    lanes[t] = t < ${pl}.a ? cl::red_softmax_thread<${targs}>(${pl}, v, n, row, t) : cl::red_identity<ACC>(${kind});
    __syncthreads();
    if (t < ${pl}.nparts) {
      ACC* L = lanes + 32 * t;
      ACC r = cl::red_identity<ACC>(${kind});
      for (int l = 0; l < 32; ++l) r = cl::red_op(${kind}, r, L[l]);
      parts[t] = r;
    }
)";
// The warp order (softmax_warp_forward, persistent_softmax.cuh): lane t folds elements
// t + it * a in order (red_softmax_part's loop, its trip count a constant, so that the
// lane's loads all issue before its first fold), then the lanes combine by an xor
// butterfly of shuffles, offsets a/2 to 1 (red_softmax_combine's tree: lane l takes its
// own value op lane l ^ off's), and lane 0 writes the row's value. The values are read
// `chunk` at a time before they are folded, and the row's length is a constant, so that
// only a row's last iterations test it (a predicate each held the loads in flight to the
// few predicate registers). Before, the parts went through shared memory and thread 0
// walked the butterfly alone, one load at a time in a loop of unknown length: [65536,
// 1024] bf16 softmax 548 us on an H100, torch 118 us.
constexpr const char* kSoftmaxWarp = R"(
    ACC r = cl::red_identity<ACC>(${kind});
    if (threadIdx.x < ${a}) {
#pragma unroll
      for (int i0 = 0; i0 < ${b}; i0 += ${chunk}) {
        ACC x[${chunk}];
#pragma unroll
        for (int it = 0; it < ${chunk}; ++it) {
          const int i = (int)threadIdx.x + (i0 + it) * ${a};
          x[it] = i < ${n} ? v[i] : cl::red_identity<ACC>(${kind});
        }
#pragma unroll
        for (int it = 0; it < ${chunk}; ++it) r = cl::red_op(${kind}, r, x[it]);
      }
    }
#pragma unroll
    for (int off = ${a} / 2; off > 0; off >>= 1) r = cl::red_op(${kind}, r, __shfl_xor_sync(0xffffffffu, r, off));
    if (threadIdx.x == 0) ((ACC*)P.ptr[${q}])[row] = r;
)";

// The SoftMax.cu kernel's row cache: where every phase is the forward block order reading
// whole vectors (ilpReduce, the Smem kernel's loop) and one unit-stride operand is the only
// one varying along the row in every phase and the epilogue (softmax's and log_softmax's
// logits), the first phase keeps the row in shared memory as it reads it, and the later
// phases and the epilogue read it there: the same values in the same order, read from
// global memory once where PyTorch's kernel reads the row three times. The cache's
// element csh + i is the row's element i, csh the row's elements before its 16-byte
// boundary, so a 16-byte word of the row is one of the cache. Rows of up to `limit` bytes.
struct RowCache {
  int q = -1;         // the operand kept, -1: none
  int64_t bytes = 0;  // dynamic shared memory
};
RowCache srow_cache(const RowStep& s, const Tensor* const* ops, int64_t limit) {
  RowCache c;
  int q = -1;
  const auto only_q = [&](const std::vector<int>& ins) {
    for (int k : ins) {
      if (s.cs[k] == 0) continue;
      if (q < 0) q = k;
      if (k != q) return false;
    }
    return true;
  };
  for (const RowPhase& p : s.phases) {
    const RedPlan plan = make_red_plan(p.spec, s.n, s.rows);
    if (p.spec.order != kOrdSoftmaxBlock || plan.c == 0 || plan.f != 0 || plan.b > 16 ||
        !only_q(p.ins))
      return c;
  }
  if (q < 0 || s.cs[q] != 1 || (s.epilogue && !only_q(s.epi_ins)) ||
      std::find(s.phases[0].ins.begin(), s.phases[0].ins.end(), q) == s.phases[0].ins.end())
    return c;
  const int64_t es = itemsize(ops[q]->dtype());
  const int64_t bytes = ((s.n + 16 / es) * es + 15) / 16 * 16;
  if (bytes > limit) return c;
  c.q = q;
  c.bytes = bytes;
  return c;
}

// A thread's value of the forward block order (kSoftmaxBlockShfl's r). In the register
// kernel (cunn_SoftMaxForwardReg: fewer than 10 elements a thread, plan c = 0) thread t
// folds elements t + k * a in order (red_softmax_thread_fold's loop); its trip count and
// the row's length are constants here, so that the thread's loads all issue before its
// first fold (in the general loop they went one at a time: [16384, 4096] bf16 softmax
// 437 us on an H100, torch's kernel 213 us).
std::string block_thread(const RowStep& s, const RowPhase& p, const RedPlan& plan,
                         const std::string& PL, const std::string& targs) {
  const std::string kind = num(p.spec.kind);
  if (plan.c != 0 || plan.a <= 0)
    return "    ACC r = t < " + PL + ".a ? cl::red_softmax_thread<" + targs + ">(" + PL +
           ", v, n, row, t) : cl::red_identity<ACC>(" + kind + ");\n";
  const std::string A = num(plan.a), N = num(s.n), K = num((s.n + plan.a - 1) / plan.a);
  return codegen::fill(R"(    ACC r = cl::red_identity<ACC>(${kind});
    if (t < ${a}) {
      ACC x[${k}];
#pragma unroll
      for (int k = 0; k < ${k}; ++k) {
        const int i = t + k * ${a};
        x[k] = i < ${n} ? v[i] : cl::red_identity<ACC>(${kind});
      }
#pragma unroll
      for (int k = 0; k < ${k}; ++k)
        if (t + k * ${a} < ${n}) r = cl::red_op(${kind}, r, x[k]);
    }
)",
                       {{"kind", kind}, {"a", A}, {"n", N}, {"k", K}});
}

// Phase k of the SoftMax.cu kernel.
std::string softmax_phase(const RowStep& s, const Tensor* const* ops, size_t k, int cached) {
  const RowPhase& p = s.phases[k];
  const std::string K = num(static_cast<int64_t>(k)), PL = "P.plan[" + K + "]";
  std::string operands, value;
  for (size_t a = 0; a < p.ins.size(); ++a) {
    const int q = p.ins[a];
    const std::string t = storage_type(ops[q]->dtype()), A = "a" + num(static_cast<int64_t>(a));
    if (s.cs[q] == 0) {
      operands += "      const " + t + " " + A + " = h" + num(q) + ";\n";
    } else if (q == cached && k > 0) {
      operands += "      const " + t + " " + A + " = cl_rc[csh + i];\n";
    } else {
      const std::string idx = s.cs[q] == 1 ? "i" : "i * " + num(s.cs[q]) + "LL";
      operands += "      const " + t + " " + A + " = ((const " + t + "*)P.ptr[" + num(q) +
                  "])[row * " + num(s.rs[q]) + "LL + " + idx + "];\n";
      if (q == cached) operands += "      cl_rc[csh + i] = " + A + ";\n";
    }
  }
  if (p.prog) {
    value = "      ACC y;\n      cl_phase" + K + "(0ull, 0ull";
    for (size_t a = 0; a < p.ins.size(); ++a) value += ", a" + num(static_cast<int64_t>(a));
    value += ", y);\n      return y;\n";
  } else {
    value = "      return (ACC)a0;\n";
  }
  const std::string kind = num(p.spec.kind);
  // the block kernels that read whole vectors (Smem, ilpReduce): ILP values a call
  const RedPlan plan = make_red_plan(p.spec, s.n, s.rows);
  const int64_t ilp = p.spec.order == kOrdSoftmaxBlock && plan.c != 0 ? plan.b : 0;
  const bool chunked = ilp > 0 && ilp <= 16;
  // (int indices: the kernel runs rows of at most 2^30 elements, torch_threads)
  const std::string targs =
      chunked ? "ACC, " + num(ilp) + ", " + kind + ", int, " + num(plan.c) : "ACC";
  const std::string combine = codegen::fill(kSoftmaxCombine, {{"q", num(p.q)}, {"pl", PL}});
  const std::string reduce =
      p.spec.order == kOrdSoftmaxWarp
          ? codegen::fill(kSoftmaxWarp, {{"a", num(plan.a)},
                                         {"b", num(plan.b)},
                                         {"kind", kind},
                                         {"q", num(p.q)},
                                         {"chunk", num(std::min<int64_t>(plan.b, 16))},
                                         {"n", num(s.n)}})
      : plan.f == 0
          ? codegen::fill(kSoftmaxBlockShfl, {{"pl", PL},
                                              {"thread", block_thread(s, p, plan, PL, targs)},
                                              {"kind", kind},
                                              {"q", num(p.q)}})
          : codegen::fill(kSoftmaxBlock, {{"pl", PL}, {"targs", targs}, {"kind", kind}}) + combine;
  return codegen::fill(
      kSoftmaxPhase,
      {{"invariants", row_invariant_loads(s, ops, p.ins)},
       {"operands", operands},
       {"value", value},
       {"chunk", chunked ? chunk_lambda(s, ops, p, K, ilp, cached, k == 0) : ""},
       {"call", chunked
                    ? "CallRowChunk<decltype(value), decltype(chunk), decltype(aligned)> v{value, "
                      "chunk, aligned}"
                    : "CallRow<decltype(value)> v{value}"},
       {"reduce", reduce}});
}

// Whether phase p keeps each thread's value in shared memory (the backward blockReduce).
bool softmax_lanes(const RowStep& s, const RowPhase& p) {
  return p.spec.order == kOrdSoftmaxBlock && make_red_plan(p.spec, s.n, s.rows).f != 0;
}

std::string torch_row_source(const RowStep& s, const Tensor* const* ops, size_t nops,
                             int64_t cache_limit) {
  const int64_t NT = torch_threads(s);
  if (NT == 0) return "";
  const RowCache rc = srow_cache(s, ops, cache_limit);
  std::string cache;
  if (rc.q >= 0) {
    const std::string t = storage_type(ops[rc.q]->dtype());
    cache = "  extern __shared__ __align__(16) unsigned char cl_rowcache[];\n  " + t +
            "* const cl_rc = (" + t +
            "*)cl_rowcache;\n  const int csh = (int)(((unsigned long long)((const " + t +
            "*)P.ptr[" + num(rc.q) + "] + row * " + num(s.rs[rc.q]) + "LL) & 15ull) / " +
            num(itemsize(ops[rc.q]->dtype())) + "ull);\n";
  }
  bool block = false;  // (the warp kernel's lanes are its parts; BlockReduce shuffles)
  for (const RowPhase& p : s.phases) block = block || softmax_lanes(s, p);
  std::string phases;
  for (size_t k = 0; k < s.phases.size(); ++k) phases += softmax_phase(s, ops, k, rc.q);
  const std::vector<bool> inv = epilogue_invariants(s);
  SplitFunction split;
  std::string src = row_preamble(s, ops, "SoftMax.cu's threads", &inv, &split, true, true) +
                    row_params_struct(s, nops);
  src += codegen::fill(
      kSoftmaxKernel,
      {{"threads", num(NT)},
       // as many blocks an SM as its 2048 threads hold (SoftMax.cu's kernel
       // runs in 32 registers; 48 halved the occupancy: measured, H100)
       {"blocks", num(triton_blocks_per_sm(NT))},
       {"lanes", block ? "  __shared__ ACC lanes[" + num(NT) + "];\n" : ""},
       // (the warp order combines by shuffles alone)
       {"parts", std::all_of(s.phases.begin(), s.phases.end(),
                             [](const RowPhase& p) { return p.spec.order == kOrdSoftmaxWarp; })
                     ? ""
                     : "  __shared__ ACC parts[32];\n"},
       {"unroll", num(kUnroll)},
       {"cache", cache},
       {"phases", phases},
       {"epilogue", epilogue_source(s, ops, &split, rc.q)}});
  const std::string name = "castlab_srow" + sha256_hex(src).substr(0, 20);
  src.replace(src.find("KERNEL_NAME"), 11, name);
  return src;
}

// ---- The general kernel: the row in shared memory ----
// The row in shared memory, one pad word per 32 (parts reading chunks of 32 m elements, m
// odd, or NumPy's leaves of 128, start in different banks); 4 blocks per SM: at most 64
// registers. Each phase writes its values into the padded row, then reduces it.
constexpr const char* kSmemKernel = R"(
struct PadRow {
  const ACC* p;
  long long o;
  __device__ ACC operator[](long long i) const { const long long j = o + i; return p[j + (j >> 5)]; }
  __device__ PadRow operator+(long long k) const { return PadRow{p, o + k}; }
  __device__ PadRow operator-(long long k) const { return PadRow{p, o - k}; }
};
extern "C" __global__ void __launch_bounds__(${threads}, 4) KERNEL_NAME(const RowParams P) {
  extern __shared__ __align__(16) unsigned char cl_smem[];
  ACC* buf = reinterpret_cast<ACC*>(cl_smem);
  const int n = (int)P.n;
  ACC* parts = buf + (n + (n >> 5) + 1);
  const long long row = blockIdx.x;
  const int step = (int)blockDim.x * ${unroll};
${phases}
${epilogue}
}
)";

// NumPy's tree from its table (its leaves, then its additions in order). Each leaf (at
// most 128 elements) is summed by 8 lanes, lane k holding NumPy's accumulator r[k]; the
// xor shuffles add them as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)) (a + b == b + a exactly,
// so every lane's sum is the one NumPy forms), then lane 0 adds the last n % 8 in order.
// `tree` combines the leaves (kSmemBalancedTree or kSmemTableTree).
constexpr const char* kSmemPairwise = R"(
  {
    const int* T = P.tab[${k}];
    const int L = ${leaves};
    const PadRow rowv{buf, 0};
    for (int base = 0; base < L; base += blockDim.x >> 3) {
      const int t = base + (threadIdx.x >> 3), k = threadIdx.x & 7;
      int st = 0, len = 0;
      if (t < L) { st = T[1 + 2 * t]; len = T[2 + 2 * t]; }
      const int full = len - len % 8;
      ACC v = ACC(0);
      if (len >= 8) {
        v = rowv[st + k];
        for (int i = 8; i < full; i += 8) v += rowv[st + i + k];
      }
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      if (k == 0 && t < L) {
        ACC r = len >= 8 ? v : ACC(-0.0);
        for (int i = full; i < len; ++i) r += rowv[st + i];
        parts[t] = r;
      }
    }
    __syncthreads();
${tree}
  }
)";

// A row of 2^k equal leaves (4096 = 32 x 128, 3584 = 32 x 112) has the complete tree over
// neighbours: each lane's complete subtree of m neighbouring leaves, level by level
// (`subtree`, where m > 1), then a butterfly over the lanes (`shuffles`).
constexpr const char* kSmemBalancedTree = R"(
    if (threadIdx.x < ${lanes}) {
${subtree}
      ACC v = parts[threadIdx.x * ${m}];
${shuffles}
      if (threadIdx.x == 0) ${q} = v;
    }
)";
constexpr const char* kSmemSubtree = R"(
      ACC* q = parts + threadIdx.x * ${m};
      for (int h = 1; h < ${m}; h *= 2)
        for (int i = 0; i < ${m}; i += 2 * h) q[i] = q[i] + q[i + h];
)";
// Any other tree runs from the table on one thread.
constexpr const char* kSmemTableTree = R"(
    if (threadIdx.x == 0) {
      const int* G = T + 1 + 2 * L;
      for (int i = 0; i < L - 1; ++i) parts[G[3 * i]] = parts[G[3 * i + 1]] + parts[G[3 * i + 2]];
      ${q} = parts[L == 1 ? 0 : 2 * L - 2];
    }
)";

// The other orders: the parts (red_part) on many threads, then `combine` (the order and
// kind as template arguments, O: only their code compiles).
constexpr const char* kSmemParts = R"(
  for (long long t = threadIdx.x; t < ${pl}.nparts; t += blockDim.x)
    parts[t] = cl::red_part<ACC, ${o}>(${pl}, PadRow{buf, 0}, n, row, t);
  __syncthreads();
${combine}
)";
// Reduce.cuh's block reduction, each tree level by all threads at once (the levels of
// red_cuda_block; several CTAs per row: one thread, red_combine).
constexpr const char* kSmemTorchCuda = R"(
  if (${pl}.f <= 1) {
    const long long bw = ${pl}.a, bh = ${pl}.b;
    const long long nr = ${pl}.e ? bh : 1;
    for (long long off = bw / 2; off > 0; off >>= 1) {
      for (long long i = threadIdx.x; i < nr * off; i += blockDim.x) {
        const long long y = i / off, x = i - y * off;
        parts[y * bw + x] = cl::red_op(${pl}.kind, parts[y * bw + x], parts[y * bw + x + off]);
      }
      __syncthreads();
    }
    if (${pl}.e) {
      for (long long off = bh / 2; off > 0; off >>= 1) {
        for (long long y = threadIdx.x; y < off; y += blockDim.x)
          parts[bw * y] = cl::red_op(${pl}.kind, parts[bw * y], parts[bw * (y + off)]);
        __syncthreads();
      }
    }
    if (threadIdx.x == 0) ${q} = parts[0];
  } else if (threadIdx.x == 0) {
    ${q} = cl::red_combine<ACC, ${o}>(${pl}, parts);
  }
)";
// Max/min chunks: a tree of neighbours (the lower chunk on the left keeps the row's first
// NaN, as one pass would); else red_combine on one thread.
constexpr const char* kSmemChunks = R"(
  if (${pl}.chunk > 0) {
    for (long long s = 1; s < ${pl}.nparts; s *= 2) {
      for (long long i = threadIdx.x * 2 * s; i + s < ${pl}.nparts; i += (long long)blockDim.x * 2 * s)
        parts[i] = cl::red_op(${pl}.kind, parts[i], parts[i + s]);
      __syncthreads();
    }
    if (threadIdx.x == 0) ${q} = ${pl}.nparts > 0 ? parts[0] : cl::red_identity<ACC>(${pl}.kind);
  } else if (threadIdx.x == 0) {
    ${q} = cl::red_combine<ACC, ${o}>(${pl}, parts);
  }
)";

// NumPy's pairwise sum of phase K's row (kSmemPairwise) into q, the phase's result.
std::string smem_pairwise(const RowStep& s, const std::string& K, const std::string& q) {
  const std::vector<int32_t> tab = pairwise_table(s.n);
  const int64_t L = tab[0];
  std::string tree;
  if (balanced_table(tab)) {
    const int64_t m = L > 32 ? L / 32 : 1, lanes = L > 32 ? 32 : L;
    char mask[24];
    std::snprintf(mask, sizeof mask, "%llx", static_cast<unsigned long long>((1ull << lanes) - 1));
    std::string shuffles;
    for (int64_t h = 1; h < lanes; h *= 2)
      shuffles += "      v += __shfl_xor_sync(0x" + std::string(lanes == 32 ? "ffffffff" : mask) +
                  "u, v, " + num(h) + ");\n";
    tree = codegen::fill(kSmemBalancedTree,
                         {{"lanes", num(lanes)},
                          {"m", num(m)},
                          {"subtree", m > 1 ? codegen::fill(kSmemSubtree, {{"m", num(m)}}) : ""},
                          {"shuffles", shuffles},
                          {"q", q}});
  } else {
    tree = codegen::fill(kSmemTableTree, {{"q", q}});
  }
  return codegen::fill(kSmemPairwise, {{"k", K}, {"leaves", num(L)}, {"tree", tree}});
}

// Phase k of the general kernel: its values into the padded row, then its reduction.
std::string smem_phase(const RowStep& s, const Tensor* const* ops, size_t k) {
  const RowPhase& p = s.phases[k];
  const std::string K = num(static_cast<int64_t>(k));
  const std::string PL = "P.plan[" + K + "]";
  std::string src = row_loop(s, ops, p.ins, [&](bool, const char* where) -> std::string {
    if (std::string(where) != "each") return "";
    if (!p.prog) return "        buf[j + (j >> 5)] = a0[u];\n";
    std::string b = "        ACC y;\n        cl_phase" + K + "(0ull, 0ull";
    for (size_t a = 0; a < p.ins.size(); ++a) b += ", a" + num(static_cast<int64_t>(a)) + "[u]";
    return b + ", y);\n        buf[j + (j >> 5)] = y;\n";
  });
  src += "  __syncthreads();\n";
  const std::string Q = "((ACC*)P.ptr[" + num(p.q) + "])[row]";
  const std::string O = num(p.spec.order) + ", " + num(p.spec.kind);
  if (p.spec.order == kOrdPairwise && p.spec.kind == kRedSum) {
    src += smem_pairwise(s, K, Q);
  } else {
    const codegen::Slots slots = {{"pl", PL}, {"o", O}, {"q", Q}};
    const std::string combine =
        codegen::fill(p.spec.order == kOrdTorchCuda ? kSmemTorchCuda : kSmemChunks, slots);
    src += codegen::fill(kSmemParts, {{"pl", PL}, {"o", O}, {"combine", combine}});
  }
  return src + "  __syncthreads();\n";
}

}  // namespace

int64_t row_kernel_smem(const RowStep& s, bool f64) {
  if (triton_layout(s).first || torch_threads(s)) return 0;  // static shared memory only
  return (s.n + (s.n >> 5) + 1 + 2 * max_parts(s)) * (f64 ? 8 : 4);
}

bool row_kernel_fits(const RowStep& s, bool f64, int dev) {
  if (s.rows <= 0 || s.rows > int64_t(0x7FFFFFFF) || s.phases.empty()) return false;
  return row_kernel_smem(s, f64) <= max_shared_per_block(dev);
}

int64_t srow_cache_limit(int dev) { return srow_cache_limit_of(max_shared_per_block(dev)); }

std::string row_kernel_source(const RowStep& s, const Tensor* const* ops, size_t nops,
                              int64_t cache_limit) {
  check_row_step(s, ops, nops);
  const std::string tri = triton_row_source(s, ops, nops);
  if (!tri.empty()) return tri;
  const std::string tor = torch_row_source(s, ops, nops, cache_limit);
  if (!tor.empty()) return tor;
  std::string phases;
  for (size_t k = 0; k < s.phases.size(); ++k) phases += smem_phase(s, ops, k);
  std::string src = row_preamble(s, ops, "") + row_params_struct(s, nops);
  src += codegen::fill(kSmemKernel, {{"threads", num(kRowThreads)},
                                     {"unroll", num(kUnroll)},
                                     {"phases", phases},
                                     {"epilogue", epilogue_source(s, ops)}});
  const std::string name = "castlab_row" + sha256_hex(src).substr(0, 20);
  src.replace(src.find("KERNEL_NAME"), 11, name);
  return src;
}

namespace {

// A node of NumPy's pairwise tree, as red_pairwise combines them: adding two records the
// addition (node, left, right) and names its result node, so that running red_pairwise on
// nodes writes down its own tree (no second copy of the halving rule here).
struct PairNode {
  int32_t id = -1;
  PairNode() = default;
  PairNode(double) {}  // red_pairwise's zeros (for leaf sums, never taken here)
  static thread_local std::vector<int32_t>* adds;
  static thread_local int32_t next;
  PairNode operator+(const PairNode& o) const {
    PairNode r;
    r.id = next++;
    adds->insert(adds->end(), {r.id, id, o.id});
    return r;
  }
  PairNode& operator+=(const PairNode& o) { return *this = *this + o; }
};
thread_local std::vector<int32_t>* PairNode::adds = nullptr;
thread_local int32_t PairNode::next = 0;

// NumPy's pairwise tree for rows of n: [L, the L leaves (start, length), then the L - 1
// additions (node, left, right) in red_pairwise's order, nodes L.. after the leaves].
std::vector<int32_t> pairwise_table(int64_t n) {
  int64_t start = 0, len = n;
  const int64_t L = n <= 128 ? 1 : red_pairwise_leaf(n, -1, &start, &len);
  std::vector<int32_t> out{static_cast<int32_t>(L)};
  std::vector<PairNode> leaves(static_cast<size_t>(L));
  for (int64_t k = 0; k < L; ++k) {
    if (n > 128) red_pairwise_leaf(n, k, &start, &len);
    out.push_back(static_cast<int32_t>(start));
    out.push_back(static_cast<int32_t>(len));
    leaves[static_cast<size_t>(k)].id = static_cast<int32_t>(k);
  }
  PairNode::adds = &out;
  PairNode::next = static_cast<int32_t>(L);
  red_pairwise_leaves(leaves.data(), n);
  PairNode::adds = nullptr;
  return out;
}

// Whether the table's tree is the complete binary tree over 2^k leaves of neighbours (each
// addition joins two neighbouring, equally large, aligned runs of leaves), so that a
// butterfly over lanes forms the same sums.
bool balanced_table(const std::vector<int32_t>& tab) {
  const int32_t L = tab[0];
  if (L < 1 || (L & (L - 1)) != 0) return false;
  std::vector<std::pair<int32_t, int32_t>> range(static_cast<size_t>(2 * L));
  for (int32_t k = 0; k < L; ++k) range[static_cast<size_t>(k)] = {k, k + 1};
  for (int32_t i = 0; i < L - 1; ++i) {
    const size_t at = static_cast<size_t>(1 + 2 * L + 3 * i);
    const auto node = tab[at], l = tab[at + 1], r = tab[at + 2];
    if (node < L || node >= 2 * L || l < 0 || r < 0 || l >= 2 * L || r >= 2 * L) return false;
    const auto a = range[static_cast<size_t>(l)], b = range[static_cast<size_t>(r)];
    const int32_t w = a.second - a.first;
    if (a.second != b.first || b.second - b.first != w || a.first % (2 * w) != 0) return false;
    range[static_cast<size_t>(node)] = {a.first, b.second};
  }
  return L == 1 || range[static_cast<size_t>(2 * L - 2)] == std::make_pair(0, L);
}

// Compiled row kernels (and the pairwise tables on the device) by (step id, device,
// operand dtypes): the source is generated once.
struct RowKernel {
  CompiledKernel k;
  std::vector<Tensor> tabs;           // the pairwise tables (owners of tab_ptrs)
  std::vector<const void*> tab_ptrs;  // per phase (null: none)
  int64_t cache_bytes = 0;            // the SoftMax.cu kernel's row cache (srow_cache)
};
std::mutex g_mu;
// leaked on purpose: device tables must not be freed during static destruction
auto& g_kernels = *new std::map<std::tuple<uint64_t, int, std::string>, RowKernel>;

const RowKernel& kernel_for(const RowStep& s, const Tensor* const* ops, size_t nops, int dev) {
  std::string dts;
  for (size_t k = 0; k < nops; ++k) dts += static_cast<char>(ops[k]->dtype());
  for (int a : row_result_aliases(s, ops, nops)) dts += static_cast<char>('A' + a);
  const auto key = std::make_tuple(s.id, dev, dts);
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_kernels.find(key);
    if (it != g_kernels.end()) return it->second;
  }
  const int64_t cache_limit = srow_cache_limit(dev);
  const std::string src = row_kernel_source(s, ops, nops, cache_limit);
  size_t a = src.find("castlab_row");
  if (a == std::string::npos) a = src.find("castlab_trow");
  if (a == std::string::npos) a = src.find("castlab_srow");
  const std::string name = src.substr(a, src.find('(', a) - a);
  RowKernel rk;
  rk.k = get_kernel(dev, name, src);
  if (!triton_layout(s).first && !torch_threads(s))  // (static shared memory only)
    check(driver().cuFuncSetAttribute(rk.k.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                      max_shared_per_block(dev)),
          "cuFuncSetAttribute");
  if (torch_threads(s)) {
    rk.cache_bytes = srow_cache(s, ops, cache_limit).bytes;
    if (rk.cache_bytes > 0)
      check(driver().cuFuncSetAttribute(rk.k.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                        static_cast<int>(rk.cache_bytes)),
            "cuFuncSetAttribute");
  }
  for (const RowPhase& p : s.phases) {
    if (p.spec.order != kOrdPairwise || p.spec.kind != kRedSum) {
      rk.tab_ptrs.push_back(nullptr);
      continue;
    }
    const std::vector<int32_t> tab = pairwise_table(s.n);
    const int64_t len = static_cast<int64_t>(tab.size());
    Tensor host = Tensor::empty({len}, kInt32, Device{});
    std::memcpy(host.data_ptr(), tab.data(), tab.size() * sizeof(int32_t));
    Tensor d = Tensor::empty({len}, kInt32, Device{DeviceType::CUDA, static_cast<int32_t>(dev)});
    copy_tensor(host, d);
    synchronize(dev);  // the host table is freed on return
    rk.tabs.push_back(d);
    rk.tab_ptrs.push_back(d.data_ptr());
  }
  std::lock_guard<std::mutex> lk(g_mu);
  return g_kernels.emplace(key, std::move(rk)).first->second;
}

// The register row kernel's ticket counter on each device (8 bytes, zeroed once). Each
// launch takes exactly `rows` tickets (every block takes until one is past the rows), so
// the host knows the next launch's base without a reset; launches on a device run in
// order on castlab's one stream, and the mutex keeps the bases in launch order.
struct Tickets {
  Tensor ctr;
  unsigned long long base = 0;
  std::mutex mu;
};
Tickets& tickets(int dev) {
  static auto& all = *new std::map<int, std::unique_ptr<Tickets>>;  // leaked, as g_kernels
  std::lock_guard<std::mutex> lk(g_mu);
  std::unique_ptr<Tickets>& t = all[dev];
  if (!t) {
    auto made = std::make_unique<Tickets>();
    Tensor host = Tensor::empty({1}, kInt64, Device{});
    std::memset(host.data_ptr(), 0, 8);
    made->ctr = Tensor::empty({1}, kInt64, Device{DeviceType::CUDA, static_cast<int32_t>(dev)});
    copy_tensor(host, made->ctr);
    synchronize(dev);  // the host zero is freed on return
    t = std::move(made);
  }
  return *t;
}

}  // namespace

void launch_row_kernel(const RowStep& s, const Tensor* const* ops, size_t nops) {
  check_row_bounds(s, ops, nops);
  const Device dev = ops[s.phases[0].q]->device();
  for (size_t k = 0; k < nops; ++k)
    if (ops[k]->device() != dev)
      throw std::invalid_argument("row kernel: operands on " + dev.str() + " and " +
                                  ops[k]->device().str());
  if (s.rows == 0) return;
  const bool f64 = acc_f64(s, ops);
  if (!row_kernel_fits(s, f64, dev.index))
    throw std::invalid_argument("row kernel: a row of " + std::to_string(s.n) +
                                " elements does not fit in shared memory");
  const RowKernel& rk = kernel_for(s, ops, nops, dev.index);
  const CompiledKernel& k = rk.k;
  const CUstream stream = launch_stream(dev.index);
  // the parameter block: ptr[], rs[], cs[], n, vec, plan[] (8-byte fields; RedPlan is the same
  // struct on both sides)
  std::vector<unsigned char> buf((3 * nops + 5) * 8 + s.phases.size() * (sizeof(RedPlan) + 8));
  size_t w = 0;
  auto put = [&](const void* p, size_t sz) {
    std::memcpy(buf.data() + w, p, sz);
    w += sz;
  };
  for (size_t k2 = 0; k2 < nops; ++k2) {
    const void* p = ops[k2]->data_ptr();
    put(&p, 8);
  }
  for (size_t k2 = 0; k2 < nops; ++k2) put(&s.rs[k2], 8);
  for (size_t k2 = 0; k2 < nops; ++k2) put(&s.cs[k2], 8);
  const long long n = s.n;
  put(&n, 8);
  // the vector path: every operand varying along the row has unit stride and rows that
  // start on 16-byte boundaries, and rows are whole words (n % 8 == 0)
  long long vec = s.n % 8 == 0;
  for (size_t k2 = 0; k2 < nops && vec; ++k2) {
    if (s.cs[k2] == 0) continue;
    const auto es = ops[k2]->itemsize();
    const auto addr = reinterpret_cast<uintptr_t>(ops[k2]->data_ptr());
    if (s.cs[k2] != 1 || addr % 16 != 0 || (s.rows > 1 && (s.rs[k2] * es) % 16 != 0)) vec = 0;
  }
  put(&vec, 8);
  const int64_t tri_threads = triton_layout(s).first;
  if (!tri_threads) {
    for (const RowPhase& p : s.phases) {
      const RedPlan plan = make_red_plan(p.spec, s.n, s.rows);
      put(&plan, sizeof(RedPlan));
    }
    for (const void* p : rk.tab_ptrs) put(&p, 8);
  }
  const unsigned smem = static_cast<unsigned>(row_kernel_smem(s, f64) + rk.cache_bytes);
  const int64_t sm_threads = torch_threads(s);
  const unsigned threads = static_cast<unsigned>(
      tri_threads  ? tri_threads
      : sm_threads ? sm_threads
                   : std::min<int64_t>(kRowThreads, std::max<int64_t>(32, (s.n + 31) / 32 * 32)));
  int64_t grid = s.rows;
  Tickets* tk = nullptr;
  std::unique_lock<std::mutex> lk;  // the ticket base and the launch in the same order
  if (tri_threads) {
    // as many blocks as the device holds at once (block b takes row b, then rows by
    // ticket): a block reads its next row while it reduces this one
    const long long rows = s.rows;
    put(&rows, 8);
    grid = std::min<int64_t>(s.rows, multiprocessor_count(dev.index) *
                                         triton_blocks_per_sm(tri_threads, triton_looped(s)));
    tk = &tickets(dev.index);
    lk = std::unique_lock<std::mutex>(tk->mu);
    void* ctr = tk->ctr.data_ptr();
    put(&ctr, 8);
    put(&tk->base, 8);
  }
  void* args[] = {buf.data()};
  CUresult r = driver().cuLaunchKernel(k.fn, static_cast<unsigned>(grid), 1, 1, threads, 1, 1, smem,
                                       stream, args, nullptr);
  if (tk && r == CUDA_SUCCESS) tk->base += static_cast<unsigned long long>(s.rows);
  note_launch(dev.index, k.name.c_str());
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("CUDA error launching the row kernel: " + error_string(r));
}

}  // namespace cuda
}  // namespace cl
