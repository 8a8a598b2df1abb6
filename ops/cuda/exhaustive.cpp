// castlab.numerics.exhaustive on the GPU: one generated kernel enumerates the index range,
// makes every input from its index (no input tensor exists), runs each configuration's
// Program and the fp64 reference's (one line per instruction, the expressions of the
// fused kernels: ops/codegen/emit_instr.h) and reduces the statistics of ops/scalar/exhaustive.h on
// the device. What makes it fast (all 2**32 bf16 SwiGLU pairs: 277 -> 48 ms on the H200):
//   - values that do not depend on the fastest-varying input are computed once per value
//     of the outer inputs (SwiGLU's silu(a) and its fp64 reference, not once per pair);
//   - the class of the correctly rounded value (category, error, bin, midpoint distance)
//     is worked out once per input, from one scaling of the reference (ex_ref_class); in a
//     round where every configuration returns it in every lane (85% of SwiGLU's), that is
//     all: one warp vote, the counters of a row shared by the configurations, no pair work;
//   - counts and the common histogram bins live in packed 8-bit fields of per-thread
//     registers, summed per warp (REDUX) every 255 rounds into the warp's shared row;
//   - a configuration whose results equal the previous one's in the whole warp takes its
//     classification, and a pair's differences follow from an earlier pair's ballot;
//   - every warp visits one contiguous index range, so its first K differing inputs of
//     each pair come from ballots alone (no block barrier in the loop); the block merges
//     its warps' lists in warp order, the host the blocks' in block order;
//   - 1/ulp products instead of divisions, the reference rounded by one instruction.
#include "ops/exhaustive.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/cuda/driver.h"
#include "ops/codegen/emit_instr.h"
#include "ops/codegen/template.h"
#include "ops/cuda/kernel_cache.h"
#include "ops/cuda/kernels.h"

namespace cl {
namespace cuda {

namespace {

using codegen::instr_expr;
using codegen::reg_name;

// Threads per block: 256, or 128 with more than 8 configurations (the per-warp rows of
// shared memory grow with the number of pairs; 16 configurations must fit in 48 KB).
int ex_threads(int nc) { return nc <= 8 ? 256 : 128; }
constexpr int kBlocksPerSm = 3;
// Rounds (of 32 inputs per warp) between two flushes of the packed per-thread counters:
// an 8-bit field gains at most one per round, and a warp's sum of one field (32 x 255)
// fits the 16 bits it is summed in.
constexpr int kFlushRounds = 255;
// Histogram bins counted in packed per-thread registers: bins 1..12 (ulp errors in
// (0, 8)), where every correctly rounded and 1-ulp result falls; bin 0 (errors of 0) is
// the exact count, and larger errors go through shared memory (cl_wadd).
constexpr int kWinBins = 12;

const char* raw_type(int dt) {
  switch (dt) {
    case kFloat64: return "double";
    case kFloat32: return "float";
    case kBFloat16:
    case kFloat16: return "unsigned short";
    case kFloat8E4M3FN:
    case kFloat8E5M2: return "unsigned char";
  }
  throw std::invalid_argument("exhaustive: unsupported input dtype on the GPU");
}

std::string raw_from_bits(int dt, const std::string& b) {
  switch (dt) {
    case kFloat64: return "cl::f64_from_bits(" + b + ")";
    case kFloat32: return "cl::f32_from_bits((unsigned)" + b + ")";
    default: return std::string("(") + raw_type(dt) + ")" + b;
  }
}

std::string u64(uint64_t v) { return std::to_string(v) + "ull"; }
std::string I(int v) { return std::to_string(v); }

// Which instructions of a chain's Program do not depend on the last input: they are the
// same for every value of the fastest-varying input, so the kernel computes them once per
// value of the outer inputs (loop-invariant code motion over the enumeration: SwiGLU's
// silu(a), fp32 and fp64, once per a instead of once per pair).
struct Hoist {
  std::vector<bool> outer;  // per instruction: independent of the last input
  std::vector<bool> keep;   // ... and read by an inner instruction or the output: a variable
};

Hoist hoist_of(const ExChain& ch, int nin, bool enabled) {
  const Program& p = *ch.prog;
  Hoist h;
  const size_t n = p.code.size();
  h.outer.assign(n, false);
  h.keep.assign(n, false);
  if (!enabled) return h;
  int nreg = 0;
  for (const Instr& in : p.code) nreg = std::max(nreg, in.dst + 1);
  std::vector<bool> inner(nreg, false);  // register depends on the last input
  std::vector<int> def(nreg, -1);
  for (size_t k = 0; k < n; ++k) {
    const Instr& in = p.code[k];
    bool dep = in.op == kOpLoad && ch.input_of_leaf.at(in.aux) == nin - 1;
    for (int r : {in.a, in.b, in.c})
      if (r >= 0 && inner[r]) dep = true;
    inner[in.dst] = dep;
    def[in.dst] = static_cast<int>(k);
    h.outer[k] = !dep;
  }
  auto mark = [&](int r) {
    if (r >= 0 && def[r] >= 0 && h.outer[def[r]] && p.code[def[r]].op != kOpConst)
      h.keep[def[r]] = true;
  };
  for (size_t k = 0; k < n; ++k)
    if (!h.outer[k])
      for (int r : {p.code[k].a, p.code[k].b, p.code[k].c}) mark(r);
  mark(p.outputs[0].reg);
  return h;
}

std::string hoisted_name(const std::string& tag, int reg) {
  return "h" + tag + "_" + reg_name(reg);
}

// The leaves the emitted instructions (emit[k]) load, bound to the kernel's inputs.
std::string leaf_decls(const ExChain& ch, const std::vector<bool>& emit) {
  std::vector<bool> used(ch.input_of_leaf.size(), false);
  for (size_t k = 0; k < emit.size(); ++k)
    if (emit[k] && ch.prog->code[k].op == kOpLoad) used.at(ch.prog->code[k].aux) = true;
  std::string s;
  for (size_t k = 0; k < used.size(); ++k)
    if (used[k])
      s += "      const auto x" + I(static_cast<int>(k)) + " = in" + I(ch.input_of_leaf[k]) + ";\n";
  return s;
}

// The variables that carry a chain's hoisted values across iterations (declared before
// the loop) and the block that computes them (run when the outer inputs change).
std::string hoist_decls(const ExChain& ch, const Hoist& h, const std::string& tag) {
  std::string s;
  for (size_t k = 0; k < h.keep.size(); ++k)
    if (h.keep[k]) {
      const Instr& in = ch.prog->code[k];
      s += std::string("  ") + reg_type_cxx(in.rtype) + " " + hoisted_name(tag, in.dst) + " = 0;\n";
    }
  return s;
}

std::string hoist_block(const ExChain& ch, const Hoist& h, const std::string& tag) {
  bool any = false;
  for (bool b : h.keep) any = any || b;
  if (!any) return "";
  const std::vector<bool> wide(ch.input_of_leaf.size(), false);
  std::string s = "    {\n" + leaf_decls(ch, h.outer);
  for (size_t k = 0; k < h.outer.size(); ++k)
    if (h.outer[k]) {
      const Instr& in = ch.prog->code[k];
      s += std::string("      const ") + reg_type_cxx(in.rtype) + " " + reg_name(in.dst) + " = " +
           instr_expr(in, wide, static_cast<int>(ch.input_of_leaf.size())) + ";\n";
      if (h.keep[k]) s += "      " + hoisted_name(tag, in.dst) + " = " + reg_name(in.dst) + ";\n";
    }
  return s + "    }\n";
}

// One Program as a scoped block that leaves its output in `result` (register types of
// the program; its loads read the kernel's inputs through the step's leaf map). Hoisted
// values are read from their variables; constants are recomputed (they fold away).
std::string program_block(const ExChain& ch, const Hoist& h, const std::string& tag,
                          const std::string& result_stmt_prefix, bool to_f64_value, int out_dtype) {
  const Program& p = *ch.prog;
  std::vector<bool> emit(p.code.size());
  for (size_t k = 0; k < p.code.size(); ++k)
    emit[k] = !h.keep[k] && (!h.outer[k] || p.code[k].op == kOpConst);
  std::string s = "    {\n" + leaf_decls(ch, emit);
  const std::vector<bool> wide(ch.input_of_leaf.size(), false);
  const std::vector<uint8_t> rt = p.reg_types();
  for (size_t k = 0; k < p.code.size(); ++k) {
    const Instr& in = p.code[k];
    const std::string decl =
        std::string("      const ") + reg_type_cxx(in.rtype) + " " + reg_name(in.dst) + " = ";
    if (h.keep[k])
      s += decl + hoisted_name(tag, in.dst) + ";\n";
    else if (emit[k])
      s += decl + instr_expr(in, wide, static_cast<int>(ch.input_of_leaf.size())) + ";\n";
  }
  const OutputSpec& o = p.outputs[0];
  const std::string r = reg_name(o.reg);
  if (rt[o.reg] == kRegI64) throw std::invalid_argument("exhaustive: an integer result");
  if (to_f64_value) {
    s += "      " + result_stmt_prefix + "static_cast<double>(" + r + ");\n";
  } else {
    const std::string sat = o.saturate ? "true" : "false";
    const std::string args = I(out_dtype) + ", " + I(o.mode) + ", " + sat + ", 0u)";
    s += "      " + result_stmt_prefix +
         (rt[o.reg] == kRegF64 ? "cl::round_f64_to_bits(" + r + ", " + args
                               : "cl::narrow_f32(" + r + ", " + args) +
         ";\n";
  }
  return s + "    }\n";
}

}  // namespace

// The table inputs' patterns as one array, input 0's first; offset[k]: where input k's
// patterns start (0 for a range input, which reads none). The kernel's source and the
// upload both take the layout from here: the decoding walks the inputs last first, so an
// offset counted along that walk would pair each input with another input's table.
ExTables exhaustive_tables(const std::vector<Enumeration>& inputs) {
  ExTables t;
  for (const Enumeration& e : inputs) {
    t.offset.push_back(e.table.empty() ? 0 : t.words.size());
    t.words.insert(t.words.end(), e.table.begin(), e.table.end());
  }
  if (t.words.empty()) t.words.push_back(0);  // the kernel's pointer is never null
  return t;
}

// Layout of the result words (unsigned long long) the kernel writes:
//   counts[nc][kExCategories] | hist[nc][kExHistBins] | ties | near_ties | differ[np] |
//   differ_ties[np] | tie_distance_bits[np] | then per block: max_error_bits[nc],
//   max_index[nc], first_n[np], first[np][K] | then, not copied back, per warp of every
//   block: first[np][K] (the warp's own first K, merged per block at the block's end).
// The kernel leaves counts[c][kExNanMismatch] and hist[c][0] at 0: the host derives them
// (n minus the other categories; the exact count).
struct ExLayout {
  int nc, np, k;
  size_t counts() const { return 0; }
  size_t hist() const { return static_cast<size_t>(nc) * kExCategories; }
  size_t ties() const { return hist() + static_cast<size_t>(nc) * kExHistBins; }
  size_t near_ties() const { return ties() + 1; }
  size_t differ() const { return ties() + 2; }
  size_t differ_ties() const { return differ() + np; }
  size_t tie_dist() const { return differ_ties() + np; }
  size_t global_words() const { return tie_dist() + np; }
  size_t block_words() const {
    return 2 * static_cast<size_t>(nc) + np + static_cast<size_t>(np) * k;
  }
  size_t warp_words() const { return static_cast<size_t>(np) * k; }
};

// Per-warp accumulators in shared memory (one row per warp, written by its lane 0 alone):
//   cats[nc][4] | window bins[nc][kWinBins] | ties | near_ties | differ[np] | differ_ties[np] |
//   ref cats[4] | ref window bins[kWinBins]
// The ref row counts the rounds where every configuration returned the correctly rounded
// value in every lane, once for all of them: the block adds it to each configuration's.
struct ExSlots {
  int nc, np;
  int cats() const { return 0; }
  int win() const { return 4 * nc; }
  int ties() const { return win() + kWinBins * nc; }
  int differ() const { return ties() + 2; }
  int differ_ties() const { return differ() + np; }
  int rcats() const { return differ_ties() + np; }
  int rwin() const { return rcats() + 4; }
  int size() const { return rwin() + kWinBins; }
};

namespace {

// The kernel's device helpers (cl_wadd adds the number of lanes with `on` that share `key`
// to a[key], one atomic per key; cl_wsum: the warp's sum of a register's two 16-bit
// halves, fields of at most 32 x 255; cl_inc: a result's counter increments from its
// class, the category's 8-bit field, the window bin's field in one of three words, the
// histogram bin and whether the bin is rare; cl_least: the least of the configurations'
// worst errors, a round whose errors are all below it changes none of them; cl_flush4
// adds the warp's totals of the four 8-bit fields of v to d[0..3], lane 0 writing).
constexpr const char* kExHelpers = R"(
// generated by castlab (ops/cuda/exhaustive.cpp)
#include "ops/cuda/prelude.cuh"
#include "ops/scalar/exhaustive.h"
__device__ __forceinline__ void cl_wadd(unsigned long long* a, int key, bool on) {
  const unsigned act = __ballot_sync(0xffffffffu, on);
  if (!on) return;
  const unsigned peers = __match_any_sync(act, key);
  if (__ffs(peers) - 1 == (int)(threadIdx.x & 31))
    atomicAdd(&a[key], (unsigned long long)__popc(peers));
}
__device__ __forceinline__ unsigned cl_wsum(unsigned v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_add_sync(0xffffffffu, v);
#else
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
#endif
}
__device__ __forceinline__ unsigned cl_wmax(unsigned v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_max_sync(0xffffffffu, v);
#else
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
#endif
}
struct ClInc { unsigned cat, win[3]; int bin; bool rare; };
__device__ __forceinline__ ClInc cl_inc(bool has_e, int cat, double err) {
  ClInc r;
  r.bin = cl::ex_hist_bin(err);
  const unsigned w = (unsigned)(r.bin - 1);
  const unsigned inc = has_e && w < ${win_bins}u ? 1u << (8 * (w & 3u)) : 0u;
  r.cat = has_e ? 1u << (8 * cat) : 0u;
  r.win[0] = w < 4u ? inc : 0u;
  r.win[1] = (w >> 2) == 1u ? inc : 0u;
  r.win[2] = (w >> 2) == 2u ? inc : 0u;
  r.rare = has_e && r.bin > ${win_bins};
  return r;
}
__device__ __forceinline__ double cl_least(const double* b) {
  double m = b[0];
#pragma unroll
  for (int c = 1; c < ${nc}; ++c) m = b[c] < m ? b[c] : m;
  return m;
}
__device__ __forceinline__ void cl_flush4(unsigned long long* d, unsigned v) {
  const unsigned lo = cl_wsum(v & 0x00FF00FFu), hi = cl_wsum((v >> 8) & 0x00FF00FFu);
  if ((threadIdx.x & 31) == 0) {
    d[0] += lo & 0xFFFFu; d[1] += hi & 0xFFFFu; d[2] += lo >> 16; d[3] += hi >> 16;
  }
}
)";

// The kernel up to its round loop: shared memory (s_td: per warp and pair, the largest
// tie distance of its differing inputs, f64 bits + 1, 0: none), each warp's contiguous
// part of its block's segment (32 inputs per round), the worst errors in registers and
// their indices, written only when they change, in shared memory; then the hoisted
// values (the host test declares the same lines) and the chunk of kFlushRounds rounds
// whose counters are packed in registers (offsets in the chunk in 32 bits). 3 blocks per
// SM: ~80 registers (a few spilled) instead of 102, 24 warps per SM instead of 16; all
// 2**32 SwiGLU pairs went from 73 to 64 ms on the H200 (benchmarks/RESULTS.md).
constexpr const char* kExKernelHead = R"(
extern "C" __global__ void __launch_bounds__(${threads}, ${blocks_per_sm}) ${name}(unsigned long long* out, const unsigned long long* tables, unsigned long long begin, unsigned long long end, unsigned long long seg) {
  __shared__ unsigned long long s_w[${warps}][${row_words}];
  __shared__ unsigned long long s_rare[${nrare}];
  __shared__ unsigned int s_wfn[${warps}][${np1}];
  __shared__ unsigned long long s_td[${warps}][${np1}];
  for (int t = threadIdx.x; t < ${td_words}; t += blockDim.x) (&s_td[0][0])[t] = 0ull;
  __shared__ double s_e[${threads}];
  __shared__ unsigned long long s_i[${threads}];
  for (int t = threadIdx.x; t < ${w_words}; t += blockDim.x) (&s_w[0][0])[t] = 0ull;
  for (int t = threadIdx.x; t < ${nrare}; t += blockDim.x) s_rare[t] = 0ull;
  __syncthreads();
  const cl::ExFormat F = cl::ex_format(${out_dtype});
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned lanes_below = (1u << lane) - 1u;
  unsigned long long* const sw = s_w[warp];
  const unsigned long long b0 = begin + blockIdx.x * seg;
  const unsigned long long b1 = b0 + seg < end ? b0 + seg : end;
  const unsigned long long wseg = seg / ${warps};
  const unsigned long long w0 = b0 + warp * wseg < b1 ? b0 + warp * wseg : b1;
  const unsigned long long w1 = w0 + wseg < b1 ? w0 + wseg : b1;
  unsigned long long* const wfirst = ${warp_first};
  double best_e[${nc}];
  __shared__ ${bi_t} s_bi[${nc}][${threads}];
#pragma unroll
  for (int c = 0; c < ${nc}; ++c) { best_e[c] = -1.0; s_bi[c][threadIdx.x] = 0; }
  double best_lo = -1.0;  // the least of best_e
${wfn_decl}
  // hoisted: begin
  unsigned long long hkey = ~0ull;
${hoist_decls}
  // hoisted: end
  for (unsigned long long cb = w0; cb < w1; cb += ${flush_span}) {
  const unsigned long long ce = cb + ${flush_span} < w1 ? cb + ${flush_span} : w1;
  unsigned pk_cat[${nc}], pk_win[${nc}][3], pk_tie = 0u, pk_rcat = 0u;
  unsigned pk_rwin[3] = {0u, 0u, 0u};
#pragma unroll
  for (int c = 0; c < ${nc}; ++c) { pk_cat[c] = 0u; pk_win[c][0] = pk_win[c][1] = pk_win[c][2] = 0u; }
  const unsigned cn = (unsigned)(ce - cb);
  for (unsigned off = lane; off - lane < cn; off += 32) {
    const bool valid = off < cn;
    const unsigned long long idx = cb + (valid ? off : cn - 1u);
    unsigned long long rest = idx;
${inputs}
    if (okey != hkey) {
      hkey = okey;
${hoist_blocks}
    }
    double r;
${ref_block}
    unsigned int xb[${nc}];
${cfg_blocks}
)";

// One round's classification: the class of the correctly rounded value (that of every
// result equal to it, most results of most configurations: all of a warp's, in most
// rounds). In the common round (no result differs from it, none rare) the reference's
// class is counted once for every configuration (its own row, added to each
// configuration's at the block's end) and no pair differs. Otherwise a configuration
// whose results equal the previous one's in every lane of the warp (fused ones mostly
// do) takes its category, error and counter increments instead of working them out
// again; one that returns the correctly rounded value in every lane takes the
// reference's class. `keep_worst`: configuration c's worst error and its index (an
// offset from `begin` in 32 bits where the range allows).
constexpr const char* kExRound = R"(
    const cl::ExRef R = cl::ex_ref(r, F);
    const cl::ExRefClass RC = cl::ex_ref_class(R, F);
    const double tie_d = RC.tie_d, e_cr = RC.err;
    const int cat_cr = RC.cat;
    const bool tie = tie_d == 0.0;
    pk_tie += valid ? (tie ? 1u : 0u) + (cl::ex_near_midpoint(tie_d, F) ? 0x100u : 0u) : 0u;
    const bool he_cr = valid && cat_cr != cl::kExNanMismatch;
    const ClInc inc_cr = cl_inc(he_cr, cat_cr, e_cr);
    bool mism[${nc}];
#pragma unroll
    for (int c = 0; c < ${nc}; ++c) mism[c] = valid && xb[c] != R.crbits;
    if (!__any_sync(0xffffffffu, ${any_mism})) {
      pk_rcat += inc_cr.cat;
      pk_rwin[0] += inc_cr.win[0]; pk_rwin[1] += inc_cr.win[1]; pk_rwin[2] += inc_cr.win[2];
      if (he_cr && e_cr > best_lo) {
#pragma unroll
        for (int c = 0; c < ${nc}; ++c)
          if (he_cr && e_cr > best_e[c]) { best_e[c] = e_cr; s_bi[c][threadIdx.x] = (${bi_t})(idx${idx_off}); }
        best_lo = cl_least(best_e);
      }
      continue;
    }
    bool xn[${nc}], has_e[${nc}], eqp[${nc}], rany[${nc}];
    unsigned mm[${nc}];
    double errs[${nc}];
    ClInc inc[${nc}];
#pragma unroll
    for (int c = 0; c < ${nc}; ++c) {
      mm[c] = __ballot_sync(0xffffffffu, mism[c]);
      eqp[c] = c > 0 && ((mm[c] | mm[c - 1]) == 0u || !__any_sync(0xffffffffu, xb[c] != xb[c - 1]));
      if (eqp[c]) {
        errs[c] = errs[c - 1]; xn[c] = xn[c - 1]; has_e[c] = has_e[c - 1];
        inc[c] = inc[c - 1];
      } else if (mm[c] == 0u) {
        errs[c] = e_cr; xn[c] = R.nan; has_e[c] = he_cr; inc[c] = inc_cr;
      } else {
        const double xv = cl::ex_value(xb[c], ${out_dtype});
        const int cat = cl::ex_classify(xb[c], xv, R, F, &errs[c]);
        xn[c] = cl::isnan_d(xv);
        has_e[c] = valid && cat != cl::kExNanMismatch;
        inc[c] = cl_inc(has_e[c], cat, errs[c]);
      }
      pk_cat[c] += inc[c].cat;
      pk_win[c][0] += inc[c].win[0]; pk_win[c][1] += inc[c].win[1]; pk_win[c][2] += inc[c].win[2];
      rany[c] = eqp[c] ? rany[c - 1] : __any_sync(0xffffffffu, inc[c].rare);
      if (rany[c]) cl_wadd(s_rare + c * ${hist_bins}, inc[c].bin, inc[c].rare);
      if (has_e[c] && errs[c] > best_e[c]) { best_e[c] = errs[c]; s_bi[c][threadIdx.x] = (${bi_t})(idx${idx_off}); }
    }
    best_lo = cl_least(best_e);
${pairs}
)";

// Pair (a, b) of a round: they differ only where one of them is not the correctly
// rounded value; where b's results equal b-1's in the whole warp, (a, b) differ where
// (a, b-1) do. `first_k`: the warp's first K differing inputs, in index order (its
// inputs are in order).
constexpr const char* kExPair = R"(
    const unsigned wd${a}_${b} = (mm[${a}] | mm[${b}]) == 0u ? 0u : eqp[${b}] ? ${prev} : __ballot_sync(0xffffffffu, valid && cl::ex_differ_bits(xb[${a}], xb[${b}], xn[${a}], xn[${b}], F));
    {
      const unsigned wd = wd${a}_${b};
      const bool d = (wd >> lane) & 1u;
      if (wd) {
        const unsigned wt = __ballot_sync(0xffffffffu, d && tie);
        if (lane == 0) { sw[${differ}] += __popc(wd); sw[${differ_ties}] += __popc(wt); }
        { const unsigned long long tb = d ? cl::f64_bits(tie_d) + 1ull : 0ull;
          const unsigned hi = cl_wmax((unsigned)(tb >> 32));
          const unsigned lo = cl_wmax((unsigned)(tb >> 32) == hi ? (unsigned)tb : 0u);
          const unsigned long long m = ((unsigned long long)hi << 32) | lo;
          if (lane == 0 && m > s_td[warp][${q}]) s_td[warp][${q}] = m; }
${first_k}
      }
    }
)";

constexpr const char* kExPairFirstK = R"(
        if (wfn[${q}] < ${k}u) {
          const unsigned pos = wfn[${q}] + __popc(wd & lanes_below);
          if (d && pos < ${k}u) wfirst[${qk} + pos] = idx;
          wfn[${q}] = min(${k}u, wfn[${q}] + __popc(wd));
        }
)";

// The end of a chunk (its packed counters flushed into the warp's row) and the block's
// results: the warps' rows summed, each into its word of the global layout; the largest
// tie distance of each pair's differing inputs (-1: none); each configuration's worst
// error and its smallest index; the block's first K of each pair, its warps' lists in
// warp order (= index order).
constexpr const char* kExKernelTail = R"(
  }
#pragma unroll
  for (int c = 0; c < ${nc}; ++c) {
    cl_flush4(sw + ${s_cats} + 4 * c, pk_cat[c]);
    cl_flush4(sw + ${s_win} + ${win_bins} * c, pk_win[c][0]);
    cl_flush4(sw + ${s_win} + ${win_bins} * c + 4, pk_win[c][1]);
    cl_flush4(sw + ${s_win} + ${win_bins} * c + 8, pk_win[c][2]);
  }
  cl_flush4(sw + ${s_rcats}, pk_rcat);
  cl_flush4(sw + ${s_rwin}, pk_rwin[0]);
  cl_flush4(sw + ${s_rwin4}, pk_rwin[1]);
  cl_flush4(sw + ${s_rwin8}, pk_rwin[2]);
  { const unsigned t = cl_wsum(pk_tie & 0xFFu), m = cl_wsum(pk_tie >> 8);
    if (lane == 0) { sw[${s_ties}] += t; sw[${s_ties1}] += m; } }
  }
${wfn_store}
  __syncthreads();
  for (int t = threadIdx.x; t < ${s_rcats}; t += blockDim.x) {
    unsigned long long v = 0ull;
    const int rt = t < ${s_win} ? ${s_rcats} + (t & 3) : t < ${s_ties} ? ${s_rwin} + (t - ${s_win}) % ${win_bins} : -1;
    for (int w = 0; w < ${warps}; ++w) v += s_w[w][t] + (rt >= 0 ? s_w[w][rt] : 0ull);
    if (!v) continue;
    int g;
    if (t < ${s_win}) g = (t >> 2) * ${categories} + (t & 3);
    else if (t < ${s_ties}) g = ${l_hist} + (t - ${s_win}) / ${win_bins} * ${hist_bins} + 1 + (t - ${s_win}) % ${win_bins};
    else g = ${l_ties} + (t - ${s_ties});
    atomicAdd(&out[g], v);
  }
  for (int t = threadIdx.x; t < ${nrare}; t += blockDim.x)
    if (s_rare[t]) atomicAdd(&out[${l_hist} + t], s_rare[t]);
  for (int q = threadIdx.x; q < ${np}; q += blockDim.x) {
    unsigned long long m = 0ull;
    for (int w = 0; w < ${warps}; ++w) m = s_td[w][q] > m ? s_td[w][q] : m;
    if (m) atomicMax(&out[${l_tie_dist} + q], m - 1ull);
  }
  for (int c = 0; c < ${nc}; ++c) {
    s_e[threadIdx.x] = best_e[c]; s_i[threadIdx.x] = ${bi_base}s_bi[c][threadIdx.x];
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h >>= 1) {
      if (threadIdx.x < h) {
        const double e2 = s_e[threadIdx.x + h]; const unsigned long long i2 = s_i[threadIdx.x + h];
        if (e2 > s_e[threadIdx.x] || (e2 == s_e[threadIdx.x] && e2 >= 0.0 && i2 < s_i[threadIdx.x])) { s_e[threadIdx.x] = e2; s_i[threadIdx.x] = i2; }
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) { out[${blk} + c] = cl::f64_bits(s_e[0]); out[${blk} + ${nc} + c] = s_i[0]; }
    __syncthreads();
  }
  for (int q = threadIdx.x; q < ${np}; q += blockDim.x) {
    unsigned n = 0;
${first_merge}
    out[${blk} + ${first_n_at} + q] = n;
  }
}
)";

constexpr const char* kExFirstMerge = R"(
    for (int w = 0; w < ${warps} && n < ${k}u; ++w) {
      const unsigned long long* src = ${warp_first_w} + q * ${k};
      for (unsigned j = 0; j < s_wfn[w][q] && n < ${k}u; ++j) out[${blk} + ${first_at} + q * ${k} + n++] = src[j];
    }
)";

// `out` plus the offset of warp `w`'s own first K of every pair (past the global words
// and every block's).
std::string warp_first(const ExLayout& L, int warps, const std::string& w) {
  return "out + " + u64(L.global_words()) + " + gridDim.x * " + u64(L.block_words()) +
         " + (blockIdx.x * " + I(warps) + "ull + " + w + ") * " + u64(L.warp_words());
}

// The inputs of index `idx` (in `rest`): its digits, the last input varying fastest
// (`okey`: the index of the outer inputs), and each input's value, table inputs reading
// their patterns from `tables`.
std::string input_decls(const std::vector<Enumeration>& inputs) {
  const int nin = static_cast<int>(inputs.size());
  const ExTables tabs = exhaustive_tables(inputs);
  std::string digits, decls;
  for (int k = nin - 1; k >= 0; --k) {
    const Enumeration& e = inputs[k];
    const std::string d = "d" + I(k);
    digits += "    const unsigned long long " + d + " = rest % " + u64(e.size()) +
              "; rest /= " + u64(e.size()) + ";\n";
    if (k == nin - 1) digits += "    const unsigned long long okey = rest;\n";
    const std::string bits = e.table.empty() ? "(" + u64(e.lo) + " + " + d + ")"
                                             : "tables[" + u64(tabs.offset[k]) + " + " + d + "]";
    decls = std::string("    const ") + raw_type(e.dtype) + " in" + I(k) + " = " +
            raw_from_bits(e.dtype, bits) + ";\n" + decls;
  }
  return digits + decls;
}

// Every pair's differences of a round (kExPair).
std::string pairs_source(int nc, int K, const ExSlots& S) {
  std::string s;
  int q = 0;
  for (int a = 0; a < nc; ++a)
    for (int b = a + 1; b < nc; ++b, ++q) {
      const std::string first_k =
          K > 0 ? codegen::fill(kExPairFirstK, {{"q", I(q)}, {"k", I(K)}, {"qk", I(q * K)}}) : "";
      s += codegen::fill(kExPair, {{"a", I(a)},
                                   {"b", I(b)},
                                   {"q", I(q)},
                                   {"prev", b > a + 1 ? "wd" + I(a) + "_" + I(b - 1) : "0u"},
                                   {"differ", I(S.differ() + q)},
                                   {"differ_ties", I(S.differ_ties() + q)},
                                   {"first_k", first_k}});
    }
  return s;
}

// The Programs of the kernel: the hoisted variables' declarations, the blocks that
// compute them when the outer inputs change, and the blocks of one round (the
// reference's into `r`, configuration c's into xb[c]).
void program_slots(const ExhaustiveSpec& spec, const std::vector<ExChain>& cfgs, const ExChain& ref,
                   codegen::Slots* slots) {
  const int nc = static_cast<int>(cfgs.size());
  const int nin = static_cast<int>(spec.inputs.size());
  // hoisting pays when the outer inputs stay the same across a warp's consecutive rounds
  const bool hoist = nin >= 2 && spec.inputs.back().size() >= 64;
  const Hoist href = hoist_of(ref, nin, hoist);
  std::string decls = hoist_decls(ref, href, "ref"), blocks = hoist_block(ref, href, "ref");
  std::string cfg_blocks;
  for (int c = 0; c < nc; ++c) {
    const Hoist h = hoist_of(cfgs[c], nin, hoist);
    decls += hoist_decls(cfgs[c], h, I(c));
    blocks += hoist_block(cfgs[c], h, I(c));
    cfg_blocks += program_block(cfgs[c], h, I(c), "xb[" + I(c) + "] = ", false, spec.out_dtype);
  }
  (*slots)["hoist_decls"] = decls;
  (*slots)["hoist_blocks"] = blocks;
  (*slots)["ref_block"] = program_block(ref, href, "ref", "r = ", true, spec.out_dtype);
  (*slots)["cfg_blocks"] = cfg_blocks;
}

}  // namespace

std::string exhaustive_kernel_source(const ExhaustiveSpec& spec, const std::vector<ExChain>& cfgs,
                                     const ExChain& ref, const std::string& name) {
  const int nc = static_cast<int>(cfgs.size());
  const int np = nc * (nc - 1) / 2;
  const int K = spec.first_k;
  const ExLayout L{nc, np, K};
  const ExSlots S{nc, np};
  const int kThreads = ex_threads(nc), kWarps = kThreads / 32;
  // best indices as offsets from `begin` in 32 bits where the range allows (registers)
  const uint64_t span = (spec.end == 0 ? enumeration_size(spec.inputs) : spec.end) - spec.begin;
  const bool narrow_idx = span <= (uint64_t(1) << 32);
  const std::string blk = u64(L.global_words()) + " + blockIdx.x * " + u64(L.block_words());
  std::string any_mism = "inc_cr.rare";
  for (int c = 0; c < nc; ++c) any_mism += " || mism[" + I(c) + "]";
  codegen::Slots slots = {
      {"name", name},
      {"nc", I(nc)},
      {"np", I(np)},
      {"np1", I(std::max(np, 1))},
      {"threads", I(kThreads)},
      {"warps", I(kWarps)},
      {"blocks_per_sm", I(kBlocksPerSm)},
      {"win_bins", I(kWinBins)},
      {"hist_bins", I(kExHistBins)},
      {"categories", I(kExCategories)},
      {"out_dtype", I(spec.out_dtype)},
      {"row_words", I(S.size())},
      {"nrare", I(nc * kExHistBins)},
      {"td_words", I(kWarps * std::max(np, 1))},
      {"w_words", I(kWarps * S.size())},
      {"warp_first", warp_first(L, kWarps, "warp")},
      {"bi_t", narrow_idx ? "unsigned" : "unsigned long long"},
      {"idx_off", narrow_idx ? " - begin" : ""},
      {"bi_base", narrow_idx ? "begin + " : ""},
      {"wfn_decl", np > 0
                       ? "  unsigned wfn[" + I(np) + "];\n#pragma unroll\n  for (int q = 0; q < " +
                             I(np) + "; ++q) wfn[q] = 0u;\n"
                       : ""},
      {"wfn_store", np > 0 ? "  if (lane == 0) {\n    for (int q = 0; q < " + I(np) +
                                 "; ++q) s_wfn[warp][q] = " + (K > 0 ? "wfn[q]" : "0u") + ";\n  }\n"
                           : ""},
      {"flush_span", u64(32ull * kFlushRounds)},
      {"inputs", input_decls(spec.inputs)},
      {"any_mism", any_mism},
      {"pairs", pairs_source(nc, K, S)},
      {"s_cats", I(S.cats())},
      {"s_win", I(S.win())},
      {"s_rcats", I(S.rcats())},
      {"s_rwin", I(S.rwin())},
      {"s_rwin4", I(S.rwin() + 4)},
      {"s_rwin8", I(S.rwin() + 8)},
      {"s_ties", I(S.ties())},
      {"s_ties1", I(S.ties() + 1)},
      {"l_hist", I(static_cast<int>(L.hist()))},
      {"l_ties", I(static_cast<int>(L.ties()))},
      {"l_tie_dist", I(static_cast<int>(L.tie_dist()))},
      {"blk", blk},
      {"first_n_at", I(2 * nc)},
      {"first_merge",
       K > 0 ? codegen::fill(kExFirstMerge, {{"warps", I(kWarps)},
                                             {"k", I(K)},
                                             {"warp_first_w", warp_first(L, kWarps, "w")},
                                             {"blk", blk},
                                             {"first_at", I(2 * nc + np)}})
             : ""},
  };
  program_slots(spec, cfgs, ref, &slots);
  return codegen::fill_joined({kExHelpers, kExKernelHead, kExRound, kExKernelTail}, slots);
}

ExhaustiveResult exhaustive_cuda(const ExhaustiveSpec& spec, const std::vector<ExChain>& cfgs,
                                 const ExChain& ref, int device) {
  const uint64_t total = enumeration_size(spec.inputs);
  const uint64_t end = spec.end == 0 ? total : spec.end;
  if (spec.begin >= end || end > total)
    throw std::invalid_argument("exhaustive: empty or out-of-range index range");
  const int nc = static_cast<int>(cfgs.size());
  const int np = nc * (nc - 1) / 2;
  const ExLayout L{nc, np, spec.first_k};
  const std::string source = exhaustive_kernel_source(spec, cfgs, ref, "cl_exhaustive");
  const CompiledKernel k = get_kernel(device, "cl_exhaustive", source);
  set_device(device);
  const int sms = multiprocessor_count(device);
  const uint64_t n = end - spec.begin;
  const int kThreads = ex_threads(nc), kWarps = kThreads / 32;
  // enough blocks to fill the GPU in whole waves (12 per SM: 4 waves of kBlocksPerSm), each
  // a contiguous segment of whole rounds; fewer where the warps' first-K lists would pass
  // 64M words (a large first_k)
  const uint64_t rounds = (n + kThreads - 1) / kThreads;
  const uint64_t per_block_scratch = std::max<uint64_t>(1, kWarps * L.warp_words());
  const uint64_t cap = std::max<uint64_t>(1, (uint64_t(1) << 26) / per_block_scratch);
  const uint64_t nblocks =
      std::max<uint64_t>(1, std::min<uint64_t>({rounds, uint64_t(sms) * 4 * kBlocksPerSm, cap}));
  const uint64_t seg = ((rounds + nblocks - 1) / nblocks) * kThreads;
  const uint64_t blocks = (n + seg - 1) / seg;
  const size_t words = L.global_words() + blocks * L.block_words();
  std::vector<uint64_t> host(words, 0);
  const std::vector<uint64_t> tables = exhaustive_tables(spec.inputs).words;
  const CUstream stream = launch_stream(device);
  const Tensor out = Tensor::empty({static_cast<int64_t>(words + blocks * kWarps * L.warp_words())},
                                   kInt64, Device{DeviceType::CUDA, device});
  const Tensor tab = Tensor::empty({static_cast<int64_t>(tables.size())}, kInt64,
                                   Device{DeviceType::CUDA, device});
  // only the global words start at 0: the kernel writes every block word the host reads
  check(driver().cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(out.data_ptr()), host.data(),
                                   L.global_words() * 8, stream),
        "cuMemcpyHtoDAsync");
  check(driver().cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(tab.data_ptr()), tables.data(),
                                   tables.size() * 8, stream),
        "cuMemcpyHtoDAsync");
  void* op = out.data_ptr();
  const void* tp = tab.data_ptr();
  unsigned long long b = spec.begin, e = end, sg = seg;
  void* args[] = {&op, &tp, &b, &e, &sg};
  CUresult r = driver().cuLaunchKernel(k.fn, static_cast<unsigned>(blocks), 1, 1, kThreads, 1, 1, 0,
                                       stream, args, nullptr);
  note_launch(device, k.name.c_str());
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("CUDA error launching " + k.name + ": " + error_string(r));
  check(driver().cuMemcpyDtoHAsync(host.data(), reinterpret_cast<CUdeviceptr>(out.data_ptr()),
                                   words * 8, stream),
        "cuMemcpyDtoHAsync");
  synchronize(device);

  ExhaustiveResult res;
  res.n = n;
  res.ties = host[L.ties()];
  res.near_ties = host[L.near_ties()];
  res.configs.resize(nc);
  for (int c = 0; c < nc; ++c) {
    ConfigStats& s = res.configs[c];
    for (int j = 0; j < kExCategories; ++j) s.count[j] = host[L.counts() + c * kExCategories + j];
    for (int j = 0; j < kExHistBins; ++j) s.hist[j] = host[L.hist() + c * kExHistBins + j];
    // what the kernel leaves to the host: NaN mismatches are the inputs in no other
    // category, and errors of 0 are the exact results
    uint64_t rest = n;
    for (int j = 0; j < kExCategories; ++j)
      if (j != kExNanMismatch) rest -= s.count[j];
    s.count[kExNanMismatch] = rest;
    s.hist[0] = s.count[kExExact];
  }
  res.pairs.resize(np);
  for (int q = 0; q < np; ++q) {
    PairStats& p = res.pairs[q];
    p.differ = host[L.differ() + q];
    p.differ_at_ties = host[L.differ_ties() + q];
    double d;
    std::memcpy(&d, &host[L.tie_dist() + q], 8);
    p.max_tie_distance = p.differ ? d : -1.0;
  }
  for (uint64_t blk = 0; blk < blocks; ++blk) {
    const uint64_t* w = &host[L.global_words() + blk * L.block_words()];
    for (int c = 0; c < nc; ++c) {
      double em;
      std::memcpy(&em, &w[c], 8);
      ConfigStats& s = res.configs[c];
      if (em > s.max_error) {  // blocks in index order: the first keeps a tie
        s.max_error = em;
        s.max_index = w[nc + c];
      }
    }
    for (int q = 0; q < np; ++q) {
      const uint64_t fn = w[2 * nc + q];
      PairStats& p = res.pairs[q];
      for (uint64_t j = 0; j < fn && p.first.size() < static_cast<size_t>(spec.first_k); ++j)
        p.first.push_back(w[2 * nc + np + static_cast<size_t>(q) * spec.first_k + j]);
    }
  }
  return res;
}

}  // namespace cuda
}  // namespace cl
