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
                           const std::string& j0) {
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
    s += "      {\n        const " + t + "* p = (const " + t + "*)P.ptr[" + K + "] + row * " +
         num(st.rs[k]) + "LL;\n";
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

std::string vector_loads(const RowStep& st, const Tensor* const* ops, const std::vector<int>& ins) {
  std::string s;
  for (size_t a = 0; a < ins.size(); ++a) {
    const int k = ins[a];
    const std::string K = num(k), A = "a" + num(static_cast<int64_t>(a));
    const std::string t = storage_type(ops[k]->dtype());
    s += "      __align__(16) " + t + " " + A + "[8];\n";
    if (st.cs[k] == 0) {
      s += "#pragma unroll\n      for (int u = 0; u < 8; ++u) " + A + "[u] = h" + K + ";\n";
      continue;
    }
    const size_t es = static_cast<size_t>(itemsize(ops[k]->dtype()));
    const std::string w = vector_word(es);
    s += "      {\n        const " + w + "* p = (const " + w + "*)((const " + t + "*)P.ptr[" + K +
         "] + row * " + num(st.rs[k]) + "LL + 8 * c);\n";
    s += "#pragma unroll\n        for (int v = 0; v < " + num(vector_words(es)) + "; ++v) ((" + w +
         "*)" + A + ")[v] = p[v];\n      }\n";
  }
  return s;
}

// A loop over the row, twice: the vector path and the general one (kUnroll elements
// blockDim apart per thread, all loaded before any is used). `body(vec)` is the code for
// element j (its operands in a<i>[u]).
template <typename Body>
std::string row_loop(const RowStep& st, const Tensor* const* ops, const std::vector<int>& ins,
                     Body body) {
  std::string s = "  {\n" + row_invariant_loads(st, ops, ins);
  s += "    if (P.vec) {\n#pragma unroll 2\n";
  s += "    for (int c = threadIdx.x; c < (n >> 3); c += blockDim.x) {\n";
  s += vector_loads(st, ops, ins);
  s += body(true, "pre");
  s += "#pragma unroll\n      for (int u = 0; u < 8; ++u) {\n        const int j = 8 * c + u;\n"
       "        (void)j;\n";
  s += body(true, "each");
  s += "      }\n";
  s += body(true, "post");
  s += "    }\n    } else {\n";
  s += "    for (int j0 = threadIdx.x; j0 < n; j0 += step) {\n";
  s += unrolled_loads(st, ops, ins, "j0");
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
std::string row_preamble(const RowStep& s, const Tensor* const* ops, const std::string& what,
                         const std::vector<bool>* epi_invariant = nullptr,
                         SplitFunction* split = nullptr, bool pair_outputs = false) {
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
                                   "cl_phase" + num(static_cast<int64_t>(k)));
  }
  if (s.epilogue && epi_invariant) {
    *split = emit_split_element_function(*s.epilogue, dtypes_of(ops, s.epi_outs, s.epi_ins),
                                         static_cast<int>(s.epi_outs.size()), "cl_epi",
                                         *epi_invariant, pair_outputs);
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
constexpr int64_t kTritonMaxRegs = 64;  // values per thread per operand, at most

// Blocks of `threads` threads a multiprocessor holds (the kernel's launch bound), and so
// the register kernel's grid: each block loops over rows. (One block per SM slot and a
// full SM: measured on the H200, RMSNorm [16384, 4096]: 0.143 ms against 0.166 ms with 1
// or 2 blocks of 512 threads.)
int64_t triton_blocks_per_sm(int64_t threads) {
  return std::min<int64_t>(32, std::max<int64_t>(1, 2048 / threads));
}

// (threads, values per thread) of the register kernel for `s`, or (0, 0) where the step
// takes the general kernel.
std::pair<int64_t, int64_t> triton_layout(const RowStep& s) {
  RedPlan first;
  for (size_t k = 0; k < s.phases.size(); ++k) {
    const RowPhase& p = s.phases[k];
    if (p.spec.order != kOrdTriton || p.spec.kind > kRedMin) return {0, 0};
    const RedPlan P = make_red_plan(p.spec, s.n, s.rows);
    if (k == 0) first = P;
    if (P.a != first.a || P.b != first.b || P.c != first.c || P.d != first.d || P.e != first.e)
      return {0, 0};
  }
  // warps combine by an xor butterfly over W lanes (a power of two, as Triton's warps)
  if (first.c != 32 || s.n <= 0 || first.d > 32 || (first.d & (first.d - 1)) != 0) return {0, 0};
  const int64_t tile = first.b * first.c * first.d;
  const int64_t its = (s.n + first.a - 1) / first.a;
  const int64_t per = its * (first.a / tile) * first.b;
  if (per > kTritonMaxRegs) return {0, 0};
  return {first.c * first.d, per};
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

std::string triton_row_source(const RowStep& s, const Tensor* const* ops, size_t nops) {
  const std::vector<int> alias = row_result_aliases(s, ops, nops);
  const auto lay = triton_layout(s);
  if (lay.first == 0) return "";
  const RedPlan P0 = make_red_plan(s.phases[0].spec, s.n, s.rows);
  const int64_t R = P0.a, PER = P0.b, W = P0.d, NT = lay.first, TILE = PER * NT;
  const int64_t ITS = (s.n + R - 1) / R, REPS = R / TILE, E = lay.second;
  const bool f64 = acc_f64(s, ops);
  // the operands: phase results (registers), row invariants (one load), varying (registers)
  std::vector<int> qs, varying, inv;
  for (const RowPhase& p : s.phases) qs.push_back(p.q);
  auto row_result = [&](int k) {
    return std::find(qs.begin(), qs.end(), k) != qs.end() || alias[k] >= 0;
  };
  // the epilogue's row-invariant part (RMSNorm's mean, + eps, rsqrt) runs once per thread
  std::vector<bool> epi_inv;
  for (int k : s.epi_ins) epi_inv.push_back(row_result(k) || s.cs[k] == 0);
  SplitFunction epi;
  std::string src = row_preamble(s, ops, "triton order", &epi_inv, &epi, true);
  src += "struct RowParams {\n  const void* ptr[" + num(static_cast<int64_t>(nops)) +
         "];\n  long long rs[" + num(static_cast<int64_t>(nops)) + "];\n  long long cs[" +
         num(static_cast<int64_t>(nops)) + "];\n  long long n;\n  long long vec;\n" +
         "  long long rows;\n  unsigned long long* ctr;\n  unsigned long long base;\n};\n";
  // The kernel body takes the vector path as a template argument (VEC: P.vec), so that
  // each instantiation holds only its own loads and stores: one uniform branch at entry,
  // where a runtime test inside the body left the element-wise loads in the loop as
  // predicated-off instructions that still issue.
  // The warps' partials, one buffer per parity of the block's row count: a row's writes
  // and the previous row's reads of the same buffer are a barrier apart.
  const std::string wdims = "[" + num(static_cast<int64_t>(s.phases.size())) + "][" + num(W) + "]";
  src += "template <bool VEC>\n__device__ __forceinline__ void cl_trow(const RowParams P" +
         (W > 1 ? ", ACC (*wpart)" + wdims : std::string()) + ") {\n";
  src += "  const int t = threadIdx.x;\n";
  src += "  const int n = " + num(s.n) + ";\n  (void)n;\n";
  // element e of a thread: tile `it`, repetition `rep`, k: (it * REPS + rep) * PER + k
  auto elem = [&](const std::string& e) {
    return "((" + e + ") / " + num(REPS * PER) + ") * " + num(R) + " + (((" + e + ") / " +
           num(PER) + ") % " + num(REPS) + ") * " + num(TILE) + " + t * " + num(PER) + " + (" + e +
           ") % " + num(PER);
  };
  // every thread's positions inside the row (n a multiple of the tile): no bounds checks
  bool full = true;
  for (int64_t e = 0; e < E; ++e)
    full =
        full && (e / (REPS * PER)) * R + ((e / PER) % REPS) * TILE + (NT - 1) * PER + e % PER < s.n;
  const std::string guard = full ? "" : "if (j < n) ";
  auto note = [&](int k) {
    if (row_result(k)) return;
    auto& v = s.cs[k] == 0 ? inv : varying;
    if (std::find(v.begin(), v.end(), k) == v.end()) v.push_back(k);
  };
  for (const RowPhase& p : s.phases)
    for (int k : p.ins) note(k);
  for (int k : s.epi_ins) note(k);
  // a row invariant is read where it is first used, after the phases before it have
  // written their results (an operand may be an earlier phase's result under another
  // index: the same memory, written by thread 0 before the barrier)
  std::vector<int> loaded;
  auto load_invariants = [&](const std::vector<int>& ins, bool after_phase) {
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
  };
  // operand k's thread values as words of PER elements (unit stride, rows on 16-byte
  // boundaries: P.vec), or "" where they are read one by one
  auto word = [&](int k) -> std::string {
    const int64_t bytes = PER * static_cast<int64_t>(itemsize(ops[k]->dtype()));
    if (s.cs[k] != 1 || PER > 8) return "";
    return bytes == 16 ? "uint4" : bytes == 8 ? "uint2" : bytes == 4 ? "uint1" : "";
  };
  // a loop over the thread's values: words (g) on the vector path, else elements (e)
  auto loops = [&](int k, const std::string& words, const std::string& elems) {
    std::string r;
    if (!word(k).empty())
      r += "    if (VEC) {\n#pragma unroll\n      for (int g = 0; g < " + num(E / PER) +
           "; ++g) {\n        const int j = " + elem("g * " + num(PER)) + ";\n" + words +
           "      }\n    } else\n";
    const std::string idx = s.cs[k] == 1 ? "j" : "(long long)j * " + num(s.cs[k]) + "LL";
    std::string body = elems;
    body.replace(body.find("IDX"), 3, idx);
    return r + "    {\n#pragma unroll\n      for (int e = 0; e < " + num(E) +
           "; ++e) {\n        const int j = " + elem("e") + ";\n" + body + "      }\n    }\n";
  };
  // operand k's values of row `r` into the thread's array `o`
  auto load_row = [&](int k, const std::string& r, const std::string& o) {
    const std::string t = storage_type(ops[k]->dtype()), w = word(k);
    const std::string at = "(" + o + " + g * " + num(PER) + ")";
    return "  {\n    const " + t + "* p = (const " + t + "*)P.ptr[" + num(k) + "] + " + r + " * " +
           num(s.rs[k]) + "LL;\n" +
           loops(k,
                 "        " + guard +
                     (itemsize(ops[k]->dtype()) == 2
                          ? "cl_unpack16(" + at + ", *(const " + w + "*)(p + j));\n"
                          : "*(" + w + "*)" + at + " = *(const " + w + "*)(p + j);\n") +
                     (full ? "" : "        else *(" + w + "*)" + at + " = " + w + "{};\n"),
                 "        " + o + "[e] = " + (full ? "p[IDX]" : "j < n ? p[IDX] : (" + t + ")0") +
                     ";\n") +
           "  }\n";
  };
  auto decl = [&](int k, const std::string& o) {
    return std::string("  __align__(16) ") + storage_type(ops[k]->dtype()) + " " + o + "[" +
           num(E) + "];\n";
  };
  // A block takes row blockIdx.x, then rows by ticket (below; launch_row_kernel: as many
  // blocks as the device holds at once). An operand the same for every row (RMSNorm's
  // weight) is read once; the others' next row is read before this row's reductions, so
  // that its loads are in flight while the block waits on its barriers.
  std::vector<int> per_row;
  for (int k : varying) {
    src += decl(k, "o" + num(k));
    if (s.rs[k] == 0)
      src += load_row(k, "0", "o" + num(k));
    else
      per_row.push_back(k);
  }
  // Block b's first row is b; its later rows are tickets from the device's counter
  // (launch_row_kernel: ticket base + k is row gridDim.x + k), so that a block that runs
  // faster takes more rows and all finish together. Thread 0 takes a ticket a row before
  // it is needed (the atomic's latency hides behind a row) and hands it to the block
  // before the last phase's barrier (one warp: a shuffle); a block takes tickets until
  // one is past the rows, so a launch takes exactly `rows` of them. `next`: the row after
  // this one, read while this one is reduced; `tk`: thread 0's row after that.
  src += "  const unsigned rows = (unsigned)P.rows, G = gridDim.x;\n";
  src +=
      "  auto take = [&]() -> unsigned {\n    const unsigned long long k = atomicAdd(P.ctr, "
      "1ull) - P.base;\n    return k < (unsigned long long)(rows - G) ? G + (unsigned)k : "
      "rows;\n  };\n";
  src += "  unsigned row = blockIdx.x, next = rows, tk = rows;\n";
  src += "  if (t == 0) {\n    next = take();\n    if (next < rows) tk = take();\n  }\n";
  if (W > 1)
    src +=
        "  __shared__ unsigned nxt[2];\n  if (t == 0) nxt[1] = next;\n  __syncthreads();\n"
        "  next = nxt[1];\n";
  else
    src += "  next = __shfl_sync(0xffffffffu, next, 0);\n";
  for (int k : per_row) src += load_row(k, "row", "o" + num(k));
  src += "  for (int par = 0; row < rows; par ^= 1) {\n";
  src += "  const unsigned pre = next < rows ? next : row;\n";
  src += "  unsigned tk2 = rows;\n  if (t == 0 && tk < rows) tk2 = take();\n";
  for (int k : per_row) src += decl(k, "p" + num(k)) + load_row(k, "pre", "p" + num(k));
  auto arg = [&](int k) {
    if (alias[k] >= 0) return "red" + num(alias[k]);
    for (size_t j = 0; j < qs.size(); ++j)
      if (qs[j] == k) return "red" + num(static_cast<int64_t>(j));
    return (s.cs[k] == 0 ? "h" : "o") + num(k) + (s.cs[k] == 0 ? "" : "[e]");
  };
  for (size_t ph = 0; ph < s.phases.size(); ++ph) {
    const RowPhase& p = s.phases[ph];
    const std::string K = num(static_cast<int64_t>(ph));
    const std::string kind = num(p.spec.kind);
    src += load_invariants(p.ins, ph > 0);
    if (W > 1 && ph + 1 == s.phases.size()) src += "  if (t == 0) nxt[par] = tk;\n";
    auto reads = [&](const std::vector<int>& ins) {
      for (int k : ins)
        if (k == p.q || alias[k] == static_cast<int>(ph)) return true;
      return false;
    };
    bool used = reads(s.epi_ins);
    for (const RowPhase& later : s.phases) used = used || reads(later.ins);
    if (used) src += "  ACC red" + K + ";\n";
    src += "  {\n    ACC y[" + num(E) + "];\n";
    src += "#pragma unroll\n    for (int e = 0; e < " + num(E) + "; ++e) {\n";
    if (p.prog) {
      src += "      cl_phase" + K + "(0ull, 0ull";
      for (int k : p.ins) src += ", " + arg(k);
      src += ", y[e]);\n";
    } else {
      src += "      y[e] = " + arg(p.ins[0]) + ";\n";
    }
    src += "    }\n";
    // Triton's fold: per position over the tiles (looped) or the value (persistent; the
    // identity past the row), then the positions in register order
    const std::string in_row = full ? "true" : elem("e") + " < n";
    // A float sum starts each position's fold at its first value, not at 0 + that value
    // (Triton's looped fold): the partial sums are the same numbers, and only a zero's
    // sign can differ, where every value added was a zero. Triton's sum is never -0 (an
    // addend 0 + y is not), and a NaN comes out of any addition as the canonical NaN:
    // so one final + 0 gives its bits. One addition a row, not one a value.
    const bool from_first = P0.e && !f64 && p.spec.kind == kRedSum;
    std::string fold = "    v = ACC(0);\n#pragma unroll\n    for (int r = 0; r < " +
                       num(REPS * PER) + "; ++r) {\n      ACC a = cl::red_identity<ACC>(" + kind +
                       ");\n";
    fold += "#pragma unroll\n      for (int it = 0; it < " + num(ITS) + "; ++it) {\n";
    fold += "        const int e = it * " + num(REPS * PER) + " + r;\n";
    fold += "        const bool in = " + in_row + ";\n";
    if (from_first)
      fold += "        if (in) a = it == 0 ? y[e] : cl::red_op(" + kind + ", a, y[e]);\n";
    else if (P0.e)
      fold += "        if (in) a = cl::red_op(" + kind + ", a, y[e]);\n";
    else
      fold += "        if (in) a = y[e];\n";
    fold += "      }\n      v = r == 0 ? a : cl::red_op(" + kind + ", v, a);\n    }\n";
    if (from_first) fold += "    v = v + 0.0f;\n";
    // `var` = op(var, the value `off` lanes away) for off = from, from / 2, .., 1
    auto butterfly = [&](const std::string& var, const std::string& op, int64_t from) {
      return "#pragma unroll\n    for (int off = " + num(from) + "; off > 0; off >>= 1)\n      " +
             var + " = " + op + var + ", __shfl_xor_sync(0xffffffffu, " + var + ", off));\n";
    };
    const std::string red_op = "cl::red_op(" + kind + ", ";
    fold += butterfly("v", red_op, 16) + "    v = __shfl_sync(0xffffffffu, v, 0);\n";
    // the warps' partials by Triton's tree (w += w + off for off = W/2 .. 1), as an xor
    // butterfly over W lanes of every warp: lane 0 folds in the tree's order, and its
    // value is every thread's (a NaN's payload included)
    auto across_warps = [&](const std::string& var, const std::string& op) {
      return "    if ((t & 31) == 0) wpart[par][" + K + "][t >> 5] = " + var +
             ";\n    __syncthreads();\n    " + var + " = wpart[par][" + K + "][t & " + num(W - 1) +
             "];\n" + butterfly(var, op, W / 2);
    };
    if (W > 1) fold += across_warps("v", red_op) + "    v = __shfl_sync(0xffffffffu, v, 0);\n";
    src += "    ACC v;\n";
    if (!f64 && (p.spec.kind == kRedMax || p.spec.kind == kRedMin)) {
      // A maximum or minimum is one value whatever the order, unless it is a NaN (the
      // fold keeps the first NaN's payload) or a zero (-0 < +0 ties): the hardware's
      // NaN-propagating max/min over the row, and Triton's fold only where that gave a
      // NaN or a zero (the same for every thread of the block: all see the row's value)
      const std::string op =
          std::string("cl_max_min_nan<") + (p.spec.kind == kRedMax ? "true" : "false") + ">(";
      // (every position in the row: the fold starts at the first value)
      src += "    {\n      float m = " +
             (full ? std::string("y[0]") : "cl::red_identity<ACC>(" + kind + ")") + ";\n";
      src += "#pragma unroll\n      for (int e = " + std::string(full ? "1" : "0") + "; e < " +
             num(E) + "; ++e) {\n";
      src += "        const bool in = " + in_row + ";\n";
      src += "        if (in) m = " + op + "m, y[e]);\n      }\n";
      src += butterfly("m", op, 16);
      if (W > 1) src += across_warps("m", op);
      src += "      v = m;\n    }\n";
      // (the fold rewrites the warps' buffer that every thread has just read)
      src += "    if (v != v || v == 0.0f) {\n" +
             std::string(W > 1 ? "    __syncthreads();\n" : "") + fold + "    }\n";
    } else {
      src += fold;
    }
    if (used) src += "    red" + K + " = v;\n";
    src += "    if (t == 0) ((ACC*)P.ptr[" + num(p.q) + "])[row] = v;\n  }\n";
  }
  if (s.epilogue) {
    src += load_invariants(s.epi_ins, true);
    for (size_t o = 0; o < s.epi_outs.size(); ++o) {
      const int k = s.epi_outs[o];
      const std::string t = storage_type(ops[k]->dtype()), O = num(static_cast<int64_t>(o));
      src += "  __align__(16) " + t + " yo" + O + "[" + num(E) + "];\n";
      if (epi.paired[o]) src += "  float yf" + O + "[" + num(E) + "];\n";
    }
    std::string row_args;
    for (size_t j = 0; j < s.epi_ins.size(); ++j)
      if (epi_inv[j]) row_args += (row_args.empty() ? "" : ", ") + arg(s.epi_ins[j]);
    std::string handed;
    for (size_t j = 0; j < epi.handed.size(); ++j) {
      const std::string h = "eh" + num(epi.handed[j]);
      src += "  " + epi.types[j] + " " + h + ";\n";
      row_args += (row_args.empty() ? "" : ", ") + h;
      handed += ", " + h;
    }
    src += "  cl_epi_row(" + row_args + ");\n";
    src += "#pragma unroll\n  for (int e = 0; e < " + num(E) + "; ++e) {\n";
    src += "    cl_epi(0ull, 0ull";
    for (int k : s.epi_ins) src += ", " + arg(k);
    src += handed;
    for (size_t o = 0; o < s.epi_outs.size(); ++o)
      src += (epi.paired[o] ? ", yf" : ", yo") + num(static_cast<int64_t>(o)) + "[e]";
    src += ");\n  }\n";
    // outputs the epilogue left in float: rounded two at a time (the same bits)
    for (size_t o = 0; o < s.epi_outs.size(); ++o) {
      if (!epi.paired[o]) continue;
      const std::string O = num(static_cast<int64_t>(o));
      src += "#pragma unroll\n  " +
             paired_rounding(ops[s.epi_outs[o]]->dtype(), "yo" + O, "yf" + O, num(E), E % 2 == 0);
    }
    for (size_t o = 0; o < s.epi_outs.size(); ++o) {
      const int k = s.epi_outs[o];
      const std::string t = storage_type(ops[k]->dtype()), O = num(static_cast<int64_t>(o));
      const std::string w = word(k);
      src += "  {\n    " + t + "* p = (" + t + "*)P.ptr[" + num(k) + "] + row * " + num(s.rs[k]) +
             "LL;\n";
      src += loops(k,
                   "        " + guard + "*(" + w + "*)(p + j) = *(const " + w + "*)(yo" + O +
                       " + g * " + num(PER) + ");\n",
                   "        " + guard + "p[IDX] = yo" + O + "[e];\n") +
             "  }\n";
    }
  }
  for (int k : per_row) {
    const std::string K = num(k);
    src += "#pragma unroll\n  for (int e = 0; e < " + num(E) + "; ++e) o" + K + "[e] = p" + K +
           "[e];\n";
  }
  src += "  row = next;\n  next = " +
         std::string(W > 1 ? "nxt[par]" : "__shfl_sync(0xffffffffu, tk, 0)") +
         ";\n  tk = tk2;\n  }\n}\n";
  src += "extern \"C\" __global__ void __launch_bounds__(" + num(NT) + ", " +
         num(triton_blocks_per_sm(NT)) + ") KERNEL_NAME(const RowParams P) {\n";
  if (W > 1) src += "  __shared__ ACC wpart[2]" + wdims + ";\n";
  const std::string warg = W > 1 ? ", wpart" : "";
  src += "  if (P.vec)\n    cl_trow<true>(P" + warg + ");\n  else\n    cl_trow<false>(P" + warg +
         ");\n}\n";
  const std::string name = "castlab_trow" + sha256_hex(src).substr(0, 20);
  src.replace(src.find("KERNEL_NAME"), 11, name);
  return src;
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

// The epilogue over the row's elements (row_loop: the vector path and the general one),
// writing the outputs; empty without an epilogue.
std::string epilogue_source(const RowStep& s, const Tensor* const* ops) {
  std::string src;
  if (s.epilogue) {
    src += row_loop(s, ops, s.epi_ins, [&](bool vec, const char* where) -> std::string {
      const std::string w(where);
      std::string b;
      if (w == "pre") {  // the outputs of the 8 elements, stored as words after
        for (size_t o = 0; o < s.epi_outs.size(); ++o)
          b += "      __align__(16) " + std::string(storage_type(ops[s.epi_outs[o]]->dtype())) +
               " yv" + num(static_cast<int64_t>(o)) + "[8];\n";
        return b;
      }
      if (w == "post") {
        for (size_t o = 0; o < s.epi_outs.size(); ++o) {
          const int k = s.epi_outs[o];
          const std::string t = storage_type(ops[k]->dtype());
          const size_t es = static_cast<size_t>(itemsize(ops[k]->dtype()));
          const std::string vw = vector_word(es);
          b += "      {\n        " + vw + "* q = (" + vw + "*)((" + t + "*)P.ptr[" + num(k) +
               "] + row * " + num(s.rs[k]) + "LL + 8 * c);\n";
          b += "#pragma unroll\n        for (int v = 0; v < " + num(vector_words(es)) +
               "; ++v) q[v] = ((const " + vw + "*)yv" + num(static_cast<int64_t>(o)) +
               ")[v];\n      }\n";
        }
        return b;
      }
      for (size_t o = 0; o < s.epi_outs.size(); ++o)
        b += "        " + std::string(storage_type(ops[s.epi_outs[o]]->dtype())) + " y" +
             num(static_cast<int64_t>(o)) + ";\n";
      b += "        cl_epi(0ull, 0ull";
      for (size_t a = 0; a < s.epi_ins.size(); ++a)
        b += ", a" + num(static_cast<int64_t>(a)) + "[u]";
      for (size_t o = 0; o < s.epi_outs.size(); ++o) b += ", y" + num(static_cast<int64_t>(o));
      b += ");\n";
      for (size_t o = 0; o < s.epi_outs.size(); ++o) {
        const int k = s.epi_outs[o];
        const std::string Y = num(static_cast<int64_t>(o));
        if (vec) {
          b += "        yv" + Y + "[u] = y" + Y + ";\n";
        } else {
          const std::string idx = s.cs[k] == 1 ? "j" : "(long long)j * " + num(s.cs[k]) + "LL";
          b += "        ((" + std::string(storage_type(ops[k]->dtype())) + "*)P.ptr[" + num(k) +
               "])[row * " + num(s.rs[k]) + "LL + " + idx + "] = y" + Y + ";\n";
        }
      }
      return b;
    });
  }
  return src;
}

// ---- SoftMax.cu's orders: the kernel's own threads, the row read from memory ----
// Where every phase takes SoftMax.cu's warp or block order, a block of the order's threads
// (block: one thread per SoftMax.cu thread, up to 1024) computes each thread's value
// (red_softmax_thread / red_softmax_part) straight from the operands in global memory,
// evaluating the phase's Program element by element as it reads them, as PyTorch's
// kernel does (no row in shared memory: vocabulary-sized rows fit), then the warps'
// values and the block's in the order's trees; the epilogue as the general kernel's.
// Returns the block's thread count, 0 where the phases take other orders.
// The phase's values at elements i .. i + ilp - 1 of the row into out[]: each operand that
// runs along the row read as 16-byte words where its address allows (else one element at
// a time), then the phase's Program on each element, as `value` computes it.
std::string chunk_lambda(const RowStep& s, const Tensor* const* ops, const RowPhase& p,
                         const std::string& K, int64_t ilp) {
  const std::string L = num(ilp);
  std::string src = "    auto chunk = [&](long long i, ACC* out) {\n";
  for (size_t a = 0; a < p.ins.size(); ++a) {
    const int q = p.ins[a];
    const std::string t = storage_type(ops[q]->dtype()), A = "a" + num(static_cast<int64_t>(a));
    const int64_t bytes = ilp * itemsize(ops[q]->dtype());
    if (s.cs[q] == 0) {
      src += "      const " + t + " " + A + " = h" + num(q) + ";\n";
      continue;
    }
    src += "      __align__(16) " + t + " " + A + "[" + L + "];\n";
    const std::string base =
        "((const " + t + "*)P.ptr[" + num(q) + "] + row * " + num(s.rs[q]) + "LL)";
    if (s.cs[q] == 1 && bytes % 16 == 0) {
      src += "      {\n        const " + t + "* p = " + base + " + i;\n";
      src += "        if (((unsigned long long)p & 15ull) == 0ull) {\n#pragma unroll\n";
      src += "          for (int w = 0; w < " + num(bytes / 16) + "; ++w) ((uint4*)" + A +
             ")[w] = ((const uint4*)p)[w];\n";
      src += "        } else {\n#pragma unroll\n          for (int k = 0; k < " + L + "; ++k) " +
             A + "[k] = p[k];\n        }\n      }\n";
    } else {
      const std::string idx = s.cs[q] == 1 ? "(i + k)" : "(i + k) * " + num(s.cs[q]) + "LL";
      src += "#pragma unroll\n      for (int k = 0; k < " + L + "; ++k) " + A + "[k] = " + base +
             "[" + idx + "];\n";
    }
  }
  src += "#pragma unroll\n      for (int k = 0; k < " + L + "; ++k) {\n";
  if (p.prog) {
    src += "        ACC y;\n        cl_phase" + K + "(0ull, 0ull";
    for (size_t a = 0; a < p.ins.size(); ++a) {
      const std::string A = "a" + num(static_cast<int64_t>(a));
      src += ", " + A + (s.cs[p.ins[a]] == 0 ? "" : "[k]");
    }
    src += ", y);\n        out[k] = y;\n";
  } else {
    src += "        out[k] = (ACC)a0" + std::string(s.cs[p.ins[0]] == 0 ? "" : "[k]") + ";\n";
  }
  src += "      }\n    };\n";
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

std::string torch_row_source(const RowStep& s, const Tensor* const* ops, size_t nops) {
  const int64_t NT = torch_threads(s);
  if (NT == 0) return "";
  std::string src = row_preamble(s, ops, "SoftMax.cu's threads");
  src += row_params_struct(s, nops);
  src +=
      "template <typename F>\nstruct CallRow {\n  F f;\n"
      "  __device__ ACC operator[](long long i) const { return f(i); }\n};\n"
      // with G: ILP consecutive values at once (cl::red_chunk), the operands read as vectors
      "template <typename F, typename G>\nstruct CallRowChunk {\n  F f;\n  G g;\n"
      "  __device__ ACC operator[](long long i) const { return f(i); }\n"
      "  template <int ILP>\n  __device__ void chunk(long long i, ACC* out) const { g(i, out); "
      "}\n};\n";
  src += "extern \"C\" __global__ void __launch_bounds__(" + num(NT) +
         ") KERNEL_NAME(const RowParams P) {\n";
  bool block = false;  // (the warp kernel's lanes are its parts)
  for (const RowPhase& p : s.phases) block = block || p.spec.order == kOrdSoftmaxBlock;
  if (block) src += "  __shared__ ACC lanes[" + num(NT) + "];\n";
  src += "  __shared__ ACC parts[32];\n";
  src += "  const long long row = blockIdx.x;\n  const int n = (int)P.n;\n";
  src += "  const int step = (int)blockDim.x * " + num(kUnroll) + ";\n  (void)step;\n";
  for (size_t k = 0; k < s.phases.size(); ++k) {
    const RowPhase& p = s.phases[k];
    const std::string K = num(static_cast<int64_t>(k)), PL = "P.plan[" + K + "]";
    src += "  {\n" + row_invariant_loads(s, ops, p.ins);
    // the phase's value at element i of the row, its operands read as the order reads them
    src += "    auto value = [&](long long i) -> ACC {\n";
    for (size_t a = 0; a < p.ins.size(); ++a) {
      const int q = p.ins[a];
      const std::string t = storage_type(ops[q]->dtype()), A = "a" + num(static_cast<int64_t>(a));
      if (s.cs[q] == 0) {
        src += "      const " + t + " " + A + " = h" + num(q) + ";\n";
      } else {
        const std::string idx = s.cs[q] == 1 ? "i" : "i * " + num(s.cs[q]) + "LL";
        src += "      const " + t + " " + A + " = ((const " + t + "*)P.ptr[" + num(q) +
               "])[row * " + num(s.rs[q]) + "LL + " + idx + "];\n";
      }
    }
    if (p.prog) {
      src += "      ACC y;\n      cl_phase" + K + "(0ull, 0ull";
      for (size_t a = 0; a < p.ins.size(); ++a) src += ", a" + num(static_cast<int64_t>(a));
      src += ", y);\n      return y;\n";
    } else {
      src += "      return (ACC)a0;\n";
    }
    src += "    };\n";
    const std::string kind = num(p.spec.kind);
    // the block kernels that read whole vectors (Smem, ilpReduce): ILP values a call
    const RedPlan plan = make_red_plan(p.spec, s.n, s.rows);
    const int64_t ilp = p.spec.order == kOrdSoftmaxBlock && plan.c != 0 ? plan.b : 0;
    if (ilp > 0 && ilp <= 16) {
      src += chunk_lambda(s, ops, p, K, ilp);
      src += "    const CallRowChunk<decltype(value), decltype(chunk)> v{value, chunk};\n";
    } else {
      src += "    const CallRow<decltype(value)> v{value};\n";
    }
    const std::string targs = ilp > 0 && ilp <= 16 ? "ACC, " + num(ilp) + ", " + kind : "ACC";
    if (p.spec.order == kOrdSoftmaxBlock) {
      src += "    const int t = threadIdx.x;\n";
      src += "    lanes[t] = t < " + PL + ".a ? cl::red_softmax_thread<" + targs + ">(" + PL +
             ", v, n, row, t) : cl::red_identity<ACC>(" + kind + ");\n";
      src += "    __syncthreads();\n";
      src += "    if (t < " + PL + ".nparts) {\n      ACC* L = lanes + 32 * t;\n";
      src += "      ACC r;\n      if (" + PL + ".f) {\n        r = cl::red_identity<ACC>(" + kind +
             ");\n        for (int l = 0; l < 32; ++l) r = cl::red_op(" + kind +
             ", r, L[l]);\n      } else {\n        r = cl::red_warp_down(" + kind +
             ", L);\n      }\n      parts[t] = r;\n    }\n";
    } else {
      src += "    if ((long long)threadIdx.x < " + PL +
             ".nparts) parts[threadIdx.x] = "
             "cl::red_softmax_part<ACC>(" +
             PL + ", v, n, row, threadIdx.x);\n";
    }
    src += "    __syncthreads();\n";
    src += "    if (threadIdx.x == 0) ((ACC*)P.ptr[" + num(p.q) +
           "])[row] = cl::red_softmax_combine(" + PL + ", parts);\n";
    src += "    __syncthreads();\n  }\n";
  }
  src += epilogue_source(s, ops);
  src += "}\n";
  const std::string name = "castlab_srow" + sha256_hex(src).substr(0, 20);
  src.replace(src.find("KERNEL_NAME"), 11, name);
  return src;
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

std::string row_kernel_source(const RowStep& s, const Tensor* const* ops, size_t nops) {
  check_row_step(s, ops, nops);
  const std::string tri = triton_row_source(s, ops, nops);
  if (!tri.empty()) return tri;
  const std::string tor = torch_row_source(s, ops, nops);
  if (!tor.empty()) return tor;
  std::string src = row_preamble(s, ops, "");
  src += row_params_struct(s, nops);
  // the row in shared memory, one pad word per 32 (parts reading chunks of 32 m elements,
  // m odd, or NumPy's leaves of 128, start in different banks)
  src +=
      "struct PadRow {\n  const ACC* p;\n  long long o;\n"
      "  __device__ ACC operator[](long long i) const { const long long j = o + i; "
      "return p[j + (j >> 5)]; }\n"
      "  __device__ PadRow operator+(long long k) const { return PadRow{p, o + k}; }\n"
      "  __device__ PadRow operator-(long long k) const { return PadRow{p, o - k}; }\n};\n";
  src += "extern \"C\" __global__ void __launch_bounds__(" + num(kRowThreads) +
         ", 4) KERNEL_NAME(const RowParams P) {\n";  // 4 blocks per SM: at most 64 registers
  src += "  extern __shared__ __align__(16) unsigned char cl_smem[];\n";
  src += "  ACC* buf = reinterpret_cast<ACC*>(cl_smem);\n";
  src += "  const int n = (int)P.n;\n  ACC* parts = buf + (n + (n >> 5) + 1);\n";
  src += "  const long long row = blockIdx.x;\n";
  src += "  const int step = (int)blockDim.x * " + num(kUnroll) + ";\n";
  for (size_t k = 0; k < s.phases.size(); ++k) {
    const RowPhase& p = s.phases[k];
    const std::string K = num(static_cast<int64_t>(k));
    const std::string PL = "P.plan[" + K + "]";
    // the row's values, into the padded row in shared memory
    src += row_loop(s, ops, p.ins, [&](bool, const char* where) -> std::string {
      if (std::string(where) != "each") return "";
      std::string b;
      if (p.prog) {
        b += "        ACC y;\n        cl_phase" + K + "(0ull, 0ull";
        for (size_t a = 0; a < p.ins.size(); ++a) b += ", a" + num(static_cast<int64_t>(a)) + "[u]";
        b += ", y);\n        buf[j + (j >> 5)] = y;\n";
      } else {
        b += "        buf[j + (j >> 5)] = a0[u];\n";
      }
      return b;
    });
    src += "  __syncthreads();\n";
    const std::string Q = "((ACC*)P.ptr[" + num(p.q) + "])[row]";
    // the order and kind as template arguments: only their code compiles
    const std::string O = num(p.spec.order) + ", " + num(p.spec.kind);
    if (p.spec.order == kOrdPairwise && p.spec.kind == kRedSum) {
      // NumPy's tree from its table (its leaves, then its additions in order). Each leaf
      // (at most 128 elements) is summed by 8 lanes, lane k holding NumPy's accumulator
      // r[k]; the xor shuffles add them as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)) (a + b ==
      // b + a exactly, so every lane's sum is the one NumPy forms), then lane 0 adds the
      // last n % 8 in order. A row of 2^k equal leaves (4096 = 32 x 128, 3584 = 32 x 112)
      // has the complete tree over neighbours: a butterfly; any other tree runs from the
      // table on one thread.
      const std::vector<int32_t> tab = pairwise_table(s.n);
      const int64_t L = tab[0];
      src += "  {\n    const int* T = P.tab[" + K + "];\n    const int L = " + num(L) + ";\n";
      src += "    const PadRow rowv{buf, 0};\n";
      src += "    for (int base = 0; base < L; base += blockDim.x >> 3) {\n";
      src += "      const int t = base + (threadIdx.x >> 3), k = threadIdx.x & 7;\n";
      src +=
          "      int st = 0, len = 0;\n      if (t < L) { st = T[1 + 2 * t]; len = T[2 + 2 * t]; "
          "}\n";
      src += "      const int full = len - len % 8;\n      ACC v = ACC(0);\n";
      src += "      if (len >= 8) {\n        v = rowv[st + k];\n";
      src += "        for (int i = 8; i < full; i += 8) v += rowv[st + i + k];\n      }\n";
      src += "      v += __shfl_xor_sync(0xffffffffu, v, 1);\n";
      src += "      v += __shfl_xor_sync(0xffffffffu, v, 2);\n";
      src += "      v += __shfl_xor_sync(0xffffffffu, v, 4);\n";
      src += "      if (k == 0 && t < L) {\n        ACC r = len >= 8 ? v : ACC(-0.0);\n";
      src += "        for (int i = full; i < len; ++i) r += rowv[st + i];\n";
      src += "        parts[t] = r;\n      }\n    }\n    __syncthreads();\n";
      if (balanced_table(tab)) {
        const int64_t m = L > 32 ? L / 32 : 1, lanes = L > 32 ? 32 : L;
        src += "    if (threadIdx.x < " + num(lanes) + ") {\n";
        if (m > 1) {  // each lane's complete subtree of m neighbouring leaves, level by level
          src += "      ACC* q = parts + threadIdx.x * " + num(m) + ";\n";
          src += "      for (int h = 1; h < " + num(m) + "; h *= 2)\n";
          src +=
              "        for (int i = 0; i < " + num(m) + "; i += 2 * h) q[i] = q[i] + q[i + h];\n";
        }
        src += "      ACC v = parts[threadIdx.x * " + num(m) + "];\n";
        for (int64_t h = 1; h < lanes; h *= 2)
          src += "      v += __shfl_xor_sync(0x" +
                 std::string(lanes == 32 ? "ffffffff" : [&] {
                   char b[16];
                   std::snprintf(b, sizeof b, "%llx",
                                 static_cast<unsigned long long>((1ull << lanes) - 1));
                   return std::string(b);
                 }()) +
                 "u, v, " + num(h) + ");\n";
        src += "      if (threadIdx.x == 0) " + Q + " = v;\n    }\n  }\n";
      } else {
        src += "    if (threadIdx.x == 0) {\n";
        src += "      const int* G = T + 1 + 2 * L;\n";
        src +=
            "      for (int i = 0; i < L - 1; ++i) parts[G[3 * i]] = parts[G[3 * i + 1]] + "
            "parts[G[3 * i + 2]];\n";
        src += "      " + Q + " = parts[L == 1 ? 0 : 2 * L - 2];\n    }\n  }\n";
      }
    } else {
      src += "  for (long long t = threadIdx.x; t < " + PL + ".nparts; t += blockDim.x)\n";
      src +=
          "    parts[t] = cl::red_part<ACC, " + O + ">(" + PL + ", PadRow{buf, 0}, n, row, t);\n";
      src += "  __syncthreads();\n";
      if (p.spec.order == kOrdTorchCuda) {
        // Reduce.cuh's block reduction, each tree level by all threads at once (the levels
        // of red_cuda_block; several CTAs per row: one thread, red_combine)
        src += "  if (" + PL + ".f <= 1) {\n";
        src += "    const long long bw = " + PL + ".a, bh = " + PL + ".b;\n";
        src += "    const long long nr = " + PL + ".e ? bh : 1;\n";
        src += "    for (long long off = bw / 2; off > 0; off >>= 1) {\n";
        src += "      for (long long i = threadIdx.x; i < nr * off; i += blockDim.x) {\n";
        src += "        const long long y = i / off, x = i - y * off;\n";
        src += "        parts[y * bw + x] = cl::red_op(" + PL +
               ".kind, parts[y * bw + x], parts[y * bw + x + off]);\n";
        src += "      }\n      __syncthreads();\n    }\n";
        src += "    if (" + PL + ".e) {\n";
        src += "      for (long long off = bh / 2; off > 0; off >>= 1) {\n";
        src += "        for (long long y = threadIdx.x; y < off; y += blockDim.x)\n";
        src += "          parts[bw * y] = cl::red_op(" + PL +
               ".kind, parts[bw * y], parts[bw * (y + off)]);\n";
        src += "        __syncthreads();\n      }\n    }\n";
        src += "    if (threadIdx.x == 0) " + Q + " = parts[0];\n";
        src += "  } else if (threadIdx.x == 0) {\n    " + Q + " = cl::red_combine<ACC, " + O +
               ">(" + PL + ", parts);\n  }\n";
      } else {
        // max/min chunks: a tree of neighbours (the lower chunk on the left keeps the
        // row's first NaN, as one pass would)
        src += "  if (" + PL + ".chunk > 0) {\n";
        src += "    for (long long s = 1; s < " + PL + ".nparts; s *= 2) {\n";
        src += "      for (long long i = threadIdx.x * 2 * s; i + s < " + PL +
               ".nparts; i += (long long)blockDim.x * 2 * s)\n";
        src += "        parts[i] = cl::red_op(" + PL + ".kind, parts[i], parts[i + s]);\n";
        src += "      __syncthreads();\n    }\n";
        src += "    if (threadIdx.x == 0) " + Q + " = " + PL +
               ".nparts > 0 ? parts[0] : cl::red_identity<ACC>(" + PL + ".kind);\n";
        src += "  } else if (threadIdx.x == 0) {\n    " + Q + " = cl::red_combine<ACC, " + O +
               ">(" + PL + ", parts);\n  }\n";
      }
    }
    src += "  __syncthreads();\n";
  }
  src += epilogue_source(s, ops);
  src += "}\n";
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
  const std::string src = row_kernel_source(s, ops, nops);
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
  const unsigned smem = static_cast<unsigned>(row_kernel_smem(s, f64));
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
    grid = std::min<int64_t>(s.rows,
                             multiprocessor_count(dev.index) * triton_blocks_per_sm(tri_threads));
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
