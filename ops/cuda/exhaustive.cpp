// castlab.numerics.exhaustive on the GPU: one generated kernel enumerates the index range,
// makes every input from its index (no input tensor exists), runs each configuration's
// Program and the fp64 reference's (one line per instruction, the expressions of the
// fused kernels: emit_instr.h) and reduces the statistics of ops/scalar/exhaustive.h on
// the device: counts and histograms in shared memory then global atomics; per thread
// block the worst input and, in index order (ballots), the first K differing inputs of
// each pair of configurations. Each block covers one contiguous index segment, so the
// host merges the blocks' lists in block order into the first K of the whole range.
#include "ops/exhaustive.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/cuda/driver.h"
#include "ops/cuda/emit_instr.h"
#include "ops/cuda/kernel_cache.h"

namespace cl {
namespace cuda {

namespace {

constexpr int kThreads = 256;

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

// One Program as a scoped block that leaves its output in `result` (register types of
// the program; its loads read the kernel's inputs through the step's leaf map).
std::string program_block(const ExChain& ch, const std::string& result_stmt_prefix,
                          bool to_f64_value, int out_dtype) {
  const Program& p = *ch.prog;
  std::string s = "    {\n";
  for (size_t k = 0; k < ch.input_of_leaf.size(); ++k)
    s += "      const auto x" + std::to_string(k) + " = in" + std::to_string(ch.input_of_leaf[k]) +
         ";\n";
  const std::vector<bool> wide(ch.input_of_leaf.size(), false);
  const std::vector<uint8_t> rt = p.reg_types();
  for (const Instr& in : p.code)
    s += std::string("      const ") + reg_type_cxx(in.rtype) + " " + reg_name(in.dst) + " = " +
         instr_expr(in, wide, static_cast<int>(ch.input_of_leaf.size())) + ";\n";
  const OutputSpec& o = p.outputs[0];
  const std::string r = reg_name(o.reg);
  if (rt[o.reg] == kRegI64) throw std::invalid_argument("exhaustive: an integer result");
  if (to_f64_value) {
    s += "      " + result_stmt_prefix + "static_cast<double>(" + r + ");\n";
  } else {
    const std::string sat = o.saturate ? "true" : "false";
    const std::string args =
        std::to_string(out_dtype) + ", " + std::to_string(o.mode) + ", " + sat + ", 0u)";
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
//   max_index[nc], first_n[np], first[np][K]
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
};

std::string exhaustive_kernel_source(const ExhaustiveSpec& spec, const std::vector<ExChain>& cfgs,
                                     const ExChain& ref, const std::string& name) {
  const int nc = static_cast<int>(cfgs.size());
  const int np = nc * (nc - 1) / 2;
  const int K = spec.first_k;
  const ExLayout L{nc, np, K};
  const int nin = static_cast<int>(spec.inputs.size());
  const int oc = spec.out_dtype;
  std::string s;
  s += "// generated by castlab (ops/cuda/exhaustive.cpp)\n";
  s += "#include \"ops/cuda/prelude.cuh\"\n#include \"ops/scalar/exhaustive.h\"\n";
  // adds the number of lanes with `on` that share `key` to a[key], one atomic per key
  s += "__device__ __forceinline__ void cl_wadd(unsigned long long* a, int key, bool on) {\n"
       "  const unsigned act = __ballot_sync(0xffffffffu, on);\n"
       "  if (!on) return;\n"
       "  const unsigned peers = __match_any_sync(act, key);\n"
       "  if (__ffs(peers) - 1 == (int)(threadIdx.x & 31))\n"
       "    atomicAdd(&a[key], (unsigned long long)__popc(peers));\n"
       "}\n";
  s += "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(kThreads) + ") " + name +
       "(unsigned long long* out, const unsigned long long* tables, unsigned long long begin,"
       " unsigned long long end, unsigned long long seg) {\n";
  const int nshared = static_cast<int>(L.differ_ties() + np);  // counts..differ_ties
  s += "  __shared__ unsigned long long s_acc[" + std::to_string(std::max(nshared, 1)) + "];\n";
  s += "  __shared__ unsigned int s_first_n[" + std::to_string(std::max(np, 1)) + "];\n";
  s += "  __shared__ unsigned int s_warp[" + std::to_string(kThreads / 32) + "];\n";
  s += "  __shared__ double s_e[" + std::to_string(kThreads) + "];\n";
  s += "  __shared__ unsigned long long s_i[" + std::to_string(kThreads) + "];\n";
  s += "  for (int t = threadIdx.x; t < " + std::to_string(nshared) +
       "; t += blockDim.x) s_acc[t] = 0ull;\n";
  s += "  for (int t = threadIdx.x; t < " + std::to_string(np) +
       "; t += blockDim.x) s_first_n[t] = 0u;\n";
  s += "  __syncthreads();\n";
  s += "  const cl::ExFormat F = cl::ex_format(" + std::to_string(oc) + ");\n";
  s += "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n";
  s += "  const unsigned long long b0 = begin + blockIdx.x * seg;\n";
  s += "  const unsigned long long b1 = b0 + seg < end ? b0 + seg : end;\n";
  s += "  double best_e[" + std::to_string(nc) + "];\n  unsigned long long best_i[" +
       std::to_string(nc) + "];\n";
  s += "  for (int c = 0; c < " + std::to_string(nc) +
       "; ++c) { best_e[c] = -1.0; best_i[c] = 0ull; }\n";
  if (np > 0) s += "  double tie_dist[" + std::to_string(np) + "];\n";
  for (int q = 0; q < np; ++q) s += "  tie_dist[" + std::to_string(q) + "] = -1.0;\n";
  s += "  for (unsigned long long base = b0; base < b1; base += blockDim.x) {\n";
  s += "    const unsigned long long i0 = base + threadIdx.x;\n";
  s += "    const bool valid = i0 < b1;\n";
  s += "    const unsigned long long idx = valid ? i0 : b0;\n";
  s += "    unsigned long long rest = idx;\n";
  // digits: the last input varies fastest; table inputs read their patterns from `tables`
  const ExTables tabs = exhaustive_tables(spec.inputs);
  std::vector<std::string> in_decl(nin);
  for (int k = nin - 1; k >= 0; --k) {
    const Enumeration& e = spec.inputs[k];
    const std::string d = "d" + std::to_string(k);
    s += "    const unsigned long long " + d + " = rest % " + u64(e.size()) +
         "; rest /= " + u64(e.size()) + ";\n";
    std::string bits;
    if (e.table.empty()) {
      bits = "(" + u64(e.lo) + " + " + d + ")";
    } else {
      bits = "tables[" + u64(tabs.offset[k]) + " + " + d + "]";
    }
    in_decl[k] = std::string("    const ") + raw_type(e.dtype) + " in" + std::to_string(k) + " = " +
                 raw_from_bits(e.dtype, bits) + ";\n";
  }
  for (int k = 0; k < nin; ++k) s += in_decl[k];
  s += "    double r;\n";
  s += program_block(ref, "r = ", true, oc);
  s += "    unsigned int xb[" + std::to_string(nc) + "];\n    double xv[" + std::to_string(nc) +
       "];\n";
  for (int c = 0; c < nc; ++c) {
    s += program_block(cfgs[c], "xb[" + std::to_string(c) + "] = ", false, oc);
    s += "    xv[" + std::to_string(c) + "] = cl::bits_to_f64(xb[" + std::to_string(c) + "], " +
         std::to_string(oc) + ");\n";
  }
  s += "    const unsigned int crbits = cl::round_f64_to_bits(r, " + std::to_string(oc) +
       ", 0, true, 0u);\n";
  s += "    const double tie_d = cl::ex_midpoint_distance(r, F);\n";
  s += "    const bool tie = tie_d == 0.0;\n";
  // warp-aggregated counting: one shared atomic per distinct key in a warp
  s += "    { const unsigned w = __ballot_sync(0xffffffffu, valid && tie);\n";
  s += "      if (lane == 0 && w) atomicAdd(&s_acc[" + std::to_string(L.ties()) +
       "], (unsigned long long)__popc(w)); }\n";
  s += "    { const unsigned w = __ballot_sync(0xffffffffu, valid && cl::ex_near_midpoint(tie_d, "
       "F));\n";
  s += "      if (lane == 0 && w) atomicAdd(&s_acc[" + std::to_string(L.near_ties()) +
       "], (unsigned long long)__popc(w)); }\n";
  s += "#pragma unroll\n";
  s += "    for (int c = 0; c < " + std::to_string(nc) + "; ++c) {\n";
  s += "      const int cat = cl::ex_category(xb[c], xv[c], r, crbits, F);\n";
  s += "      cl_wadd(s_acc + c * " + std::to_string(kExCategories) + ", cat, valid);\n";
  s += "      const bool has_e = valid && cat != cl::kExNanMismatch;\n";
  s += "      const double e = has_e ? cl::ex_ulp_error(xv[c], r, F) : 0.0;\n";
  s += "      cl_wadd(s_acc + " + std::to_string(L.hist()) + " + c * " +
       std::to_string(kExHistBins) + ", cl::ex_hist_bin(e), has_e);\n";
  s += "      if (has_e && e > best_e[c]) { best_e[c] = e; best_i[c] = idx; }\n";
  s += "    }\n";
  int q = 0;
  for (int a = 0; a < nc; ++a)
    for (int b = a + 1; b < nc; ++b, ++q) {
      const std::string Q = std::to_string(q);
      s += "    {\n      const bool d = valid && cl::ex_differ(xv[" + std::to_string(a) + "], xv[" +
           std::to_string(b) + "]);\n";
      s += "      const unsigned wd = __ballot_sync(0xffffffffu, d);\n";
      s += "      if (wd) {\n";
      s += "        const unsigned wt = __ballot_sync(0xffffffffu, d && tie);\n";
      s += "        if (lane == 0) atomicAdd(&s_acc[" + std::to_string(L.differ()) + " + " + Q +
           "], (unsigned long long)__popc(wd));\n";
      s += "        if (lane == 0 && wt) atomicAdd(&s_acc[" + std::to_string(L.differ_ties()) +
           " + " + Q + "], (unsigned long long)__popc(wt));\n";
      s += "        if (d && tie_d > tie_dist[" + Q + "]) tie_dist[" + Q + "] = tie_d;\n      }\n";
      // the first K differing indices of this block's segment, in index order
      s +=
          "      if (s_first_n[" + Q + "] < " + std::to_string(K) + "u && __syncthreads_or(d)) {\n";
      s += "        const unsigned ball = __ballot_sync(0xffffffffu, d);\n";
      s += "        if (lane == 0) s_warp[warp] = __popc(ball);\n";
      s += "        __syncthreads();\n";
      s += "        unsigned before = 0, total = 0;\n";
      s += "        for (int w = 0; w < " + std::to_string(kThreads / 32) +
           "; ++w) { if (w < warp) before += s_warp[w]; total += s_warp[w]; }\n";
      s += "        const unsigned pos = s_first_n[" + Q +
           "] + before + __popc(ball & ((1u << lane) - 1u));\n";
      s += "        if (d && pos < " + std::to_string(K) + "u) out[" + u64(L.global_words()) +
           " + blockIdx.x * " + u64(L.block_words()) + " + " + u64(2 * nc + np) + " + " + Q +
           " * " + std::to_string(K) + " + pos] = idx;\n";
      s += "        __syncthreads();\n";
      s += "        if (threadIdx.x == 0) s_first_n[" + Q + "] = min(" + std::to_string(K) +
           "u, s_first_n[" + Q + "] + total);\n";
      s += "        __syncthreads();\n      }\n    }\n";
    }
  s += "  }\n";
  // block results
  s += "  __syncthreads();\n";
  s += "  for (int t = threadIdx.x; t < " + std::to_string(nshared) +
       "; t += blockDim.x) if (s_acc[t]) atomicAdd(&out[t], s_acc[t]);\n";
  for (int p = 0; p < np; ++p)
    s += "  if (tie_dist[" + std::to_string(p) + "] >= 0.0) atomicMax(&out[" +
         std::to_string(L.tie_dist() + p) + "], (unsigned long long)cl::f64_bits(tie_dist[" +
         std::to_string(p) + "]));\n";
  const std::string blk = u64(L.global_words()) + " + blockIdx.x * " + u64(L.block_words());
  s += "  for (int c = 0; c < " + std::to_string(nc) + "; ++c) {\n";
  s += "    s_e[threadIdx.x] = best_e[c]; s_i[threadIdx.x] = best_i[c];\n";
  s += "    __syncthreads();\n";
  s += "    for (int h = blockDim.x / 2; h > 0; h >>= 1) {\n";
  s += "      if (threadIdx.x < h) {\n";
  s += "        const double e2 = s_e[threadIdx.x + h]; const unsigned long long i2 = "
       "s_i[threadIdx.x + h];\n";
  s += "        if (e2 > s_e[threadIdx.x] || (e2 == s_e[threadIdx.x] && e2 >= 0.0 && i2 < "
       "s_i[threadIdx.x])) { s_e[threadIdx.x] = e2; s_i[threadIdx.x] = i2; }\n";
  s += "      }\n      __syncthreads();\n    }\n";
  s += "    if (threadIdx.x == 0) { out[" + blk + " + c] = cl::f64_bits(s_e[0]); out[" + blk +
       " + " + std::to_string(nc) + " + c] = s_i[0]; }\n";
  s += "    __syncthreads();\n  }\n";
  s += "  for (int t = threadIdx.x; t < " + std::to_string(np) + "; t += blockDim.x) out[" + blk +
       " + " + std::to_string(2 * nc) + " + t] = s_first_n[t];\n";
  s += "}\n";
  return s;
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
  int sms = 0;
  CUdevice dev = 0;
  check(driver().cuDeviceGet(&dev, device), "cuDeviceGet");
  check(driver().cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
        "cuDeviceGetAttribute");
  const uint64_t n = end - spec.begin;
  // enough blocks to fill the GPU (8 per SM), each a contiguous segment of whole rounds
  const uint64_t rounds = (n + kThreads - 1) / kThreads;
  const uint64_t nblocks = std::max<uint64_t>(1, std::min<uint64_t>(rounds, uint64_t(sms) * 8));
  const uint64_t seg = ((rounds + nblocks - 1) / nblocks) * kThreads;
  const uint64_t blocks = (n + seg - 1) / seg;
  const size_t words = L.global_words() + blocks * L.block_words();
  std::vector<uint64_t> host(words, 0);
  const std::vector<uint64_t> tables = exhaustive_tables(spec.inputs).words;
  const CUstream stream = launch_stream(device);
  const Tensor out =
      Tensor::empty({static_cast<int64_t>(words)}, kInt64, Device{DeviceType::CUDA, device});
  const Tensor tab = Tensor::empty({static_cast<int64_t>(tables.size())}, kInt64,
                                   Device{DeviceType::CUDA, device});
  check(driver().cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(out.data_ptr()), host.data(),
                                   words * 8, stream),
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
