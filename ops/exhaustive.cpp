#include "ops/exhaustive.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/parallel.h"

namespace cl {

uint64_t enumeration_size(const std::vector<Enumeration>& inputs) {
  if (inputs.empty()) throw std::invalid_argument("exhaustive: no input to enumerate");
  uint64_t n = 1;
  for (const Enumeration& e : inputs) {
    const uint64_t s = e.size();
    if (s == 0) throw std::invalid_argument("exhaustive: an enumeration is empty");
    if (n > UINT64_MAX / s)
      throw std::overflow_error("exhaustive: the cross product has more than 2**64 - 1 inputs");
    n *= s;
  }
  return n;
}

std::vector<uint64_t> enumeration_bits(const std::vector<Enumeration>& inputs, uint64_t idx) {
  std::vector<uint64_t> out(inputs.size());
  for (size_t k = inputs.size(); k-- > 0;) {
    const uint64_t s = inputs[k].size();
    out[k] = inputs[k].bits(idx % s);
    idx /= s;
  }
  return out;
}

ExChain exhaustive_chain(const Plan& plan, int n_inputs) {
  auto bad = [](const std::string& m) { throw std::invalid_argument("exhaustive: " + m); };
  if (plan.steps.size() != 1 || !plan.steps[0].prog)
    bad("the chain must lower to one fused elementwise Program (it has " +
        std::to_string(plan.steps.size()) + " steps)");
  const PlanStep& st = plan.steps[0];
  if (st.outs.size() != 1 || st.prog->outputs.size() != 1) bad("the chain must have one output");
  if (st.prog->uses_random()) bad("stochastic rounding and random ops are not supported");
  ExChain ch;
  ch.prog = st.prog.get();
  for (const PlanBind& b : st.leaves) {
    if (b.kind != PlanBind::kInput || b.index < 0 || b.index >= n_inputs || b.offset != 0 ||
        b.shape.size() != 1 || b.strides.size() != 1 || b.strides[0] != 1)
      bad("every operand of the chain must be a whole input");
    ch.input_of_leaf.push_back(b.index);
  }
  return ch;
}

namespace {

constexpr int64_t kStatBlock = 4096;  // indices per partial of the statistics

// Writes the bit patterns of indices [start, start + n) of `inputs` into the chunk
// tensors (their first n elements); the rest of each chunk repeats the last index, so
// every Plan runs on valid inputs of its traced length.
void fill_inputs(const std::vector<Enumeration>& inputs, uint64_t start, int64_t n, int64_t chunk,
                 const std::vector<Tensor>& bufs) {
  const size_t nin = inputs.size();
  parallel_for(chunk, 1 << 14, [&](int64_t b, int64_t e) {
    std::vector<uint64_t> digit(nin);
    // digits of the first index of this range, then counted up like an odometer
    uint64_t idx = start + static_cast<uint64_t>(std::min(b, n - 1));
    for (size_t k = nin; k-- > 0;) {
      digit[k] = idx % inputs[k].size();
      idx /= inputs[k].size();
    }
    for (int64_t i = b; i < e; ++i) {
      for (size_t k = 0; k < nin; ++k) {
        const uint64_t v = inputs[k].bits(digit[k]);
        char* p = static_cast<char*>(bufs[k].data_ptr());
        const int64_t sz = itemsize(inputs[k].dtype);
        switch (sz) {
          case 1: p[i] = static_cast<char>(v); break;
          case 2: {
            const uint16_t w = static_cast<uint16_t>(v);
            std::memcpy(p + 2 * i, &w, 2);
            break;
          }
          case 4: {
            const uint32_t w = static_cast<uint32_t>(v);
            std::memcpy(p + 4 * i, &w, 4);
            break;
          }
          default: std::memcpy(p + 8 * i, &v, 8);
        }
      }
      if (i + 1 >= n) continue;  // the tail repeats the last index
      for (size_t k = nin; k-- > 0;) {
        if (++digit[k] < inputs[k].size()) break;
        digit[k] = 0;
      }
    }
  });
}

uint32_t load_bits(const void* base, int64_t i, int nbits) {
  switch (nbits) {
    case 8: return static_cast<const uint8_t*>(base)[i];
    case 16: {
      uint16_t w;
      std::memcpy(&w, static_cast<const char*>(base) + 2 * i, 2);
      return w;
    }
    default: {
      uint32_t w;
      std::memcpy(&w, static_cast<const char*>(base) + 4 * i, 4);
      return w;
    }
  }
}

struct Partial {
  std::vector<ConfigStats> configs;
  std::vector<PairStats> pairs;
  uint64_t ties = 0, near_ties = 0;
};

void merge(ExhaustiveResult* r, const Partial& p, int first_k) {
  r->ties += p.ties;
  r->near_ties += p.near_ties;
  for (size_t c = 0; c < p.configs.size(); ++c) {
    ConfigStats& d = r->configs[c];
    const ConfigStats& s = p.configs[c];
    for (int k = 0; k < kExCategories; ++k) d.count[k] += s.count[k];
    for (int k = 0; k < kExHistBins; ++k) d.hist[k] += s.hist[k];
    // partials arrive in index order: a later one wins only with a larger error
    if (s.max_error > d.max_error) {
      d.max_error = s.max_error;
      d.max_index = s.max_index;
    }
  }
  for (size_t q = 0; q < p.pairs.size(); ++q) {
    PairStats& d = r->pairs[q];
    const PairStats& s = p.pairs[q];
    d.differ += s.differ;
    d.differ_at_ties += s.differ_at_ties;
    d.max_tie_distance = std::max(d.max_tie_distance, s.max_tie_distance);
    for (uint64_t i : s.first)
      if (d.first.size() < static_cast<size_t>(first_k)) d.first.push_back(i);
  }
}

}  // namespace

ExhaustiveResult exhaustive_cpu(const ExhaustiveSpec& spec,
                                const std::vector<std::shared_ptr<Plan>>& configs,
                                const Plan& ref) {
  const uint64_t total = enumeration_size(spec.inputs);
  const uint64_t end = spec.end == 0 ? total : spec.end;
  if (spec.begin > end || end > total)
    throw std::invalid_argument("exhaustive: index range [" + std::to_string(spec.begin) + ", " +
                                std::to_string(end) + ") is outside [0, " + std::to_string(total) +
                                ")");
  if (configs.empty()) throw std::invalid_argument("exhaustive: no configuration");
  if (spec.chunk <= 0) throw std::invalid_argument("exhaustive: chunk must be positive");
  if (spec.first_k < 0) throw std::invalid_argument("exhaustive: first_k must be >= 0");
  const int oc = spec.out_dtype;
  if (oc != kFloat32 && oc != kFloat16 && oc != kBFloat16 && oc != kFloat8E4M3FN &&
      oc != kFloat8E5M2)
    throw std::invalid_argument(
        "exhaustive: results must be float32, float16, bfloat16 or float8 (compared against "
        "float64)");
  const ExFormat f = ex_format(oc);
  for (const auto& p : configs)
    for (const PlanStep& st : p->steps)
      if (st.prog && st.prog->uses_random())
        throw std::invalid_argument(
            "exhaustive: stochastic rounding and random ops are not supported");
  const int nc = static_cast<int>(configs.size());
  const Shape shape{spec.chunk};
  std::vector<Tensor> in_bufs;
  for (const Enumeration& e : spec.inputs) {
    if (!is_floating(e.dtype) && e.dtype != kInt32 && e.dtype != kInt64 && e.dtype != kBool)
      throw std::invalid_argument("exhaustive: unsupported input dtype");
    in_bufs.push_back(Tensor::empty(shape, e.dtype, Device{}));
  }
  std::vector<const Tensor*> in_ptrs;
  for (const Tensor& t : in_bufs) in_ptrs.push_back(&t);
  std::vector<Tensor> outs;
  for (int c = 0; c < nc; ++c) outs.push_back(Tensor::empty(shape, spec.out_dtype, Device{}));
  const Tensor ref_out = Tensor::empty(shape, kFloat64, Device{});

  ExhaustiveResult res;
  res.configs.resize(nc);
  res.pairs.resize(static_cast<size_t>(nc * (nc - 1) / 2));
  std::vector<Partial> parts;
  for (uint64_t start = spec.begin; start < end;) {
    const int64_t n = static_cast<int64_t>(std::min<uint64_t>(end - start, spec.chunk));
    fill_inputs(spec.inputs, start, n, spec.chunk, in_bufs);
    for (int c = 0; c < nc; ++c)
      configs[c]->run(in_ptrs.data(), in_ptrs.size(), std::vector<Tensor>{outs[c]});
    ref.run(in_ptrs.data(), in_ptrs.size(), std::vector<Tensor>{ref_out});

    const int64_t nblocks = (n + kStatBlock - 1) / kStatBlock;
    parts.assign(static_cast<size_t>(nblocks), Partial{});
    const double* rv = static_cast<const double*>(ref_out.data_ptr());
    parallel_for(nblocks, 1, [&](int64_t b0, int64_t b1) {
      std::vector<uint32_t> xbits(static_cast<size_t>(nc));
      std::vector<char> xnan(static_cast<size_t>(nc));
      for (int64_t blk = b0; blk < b1; ++blk) {
        Partial& p = parts[blk];
        p.configs.assign(nc, ConfigStats{});
        p.pairs.assign(res.pairs.size(), PairStats{});
        const int64_t lo = blk * kStatBlock, hi = std::min(n, lo + kStatBlock);
        for (int64_t i = lo; i < hi; ++i) {
          const uint64_t idx = start + static_cast<uint64_t>(i);
          const ExRef R = ex_ref(rv[i], f);
          const double tie_d = ex_midpoint_distance(R, f);
          const bool tie = tie_d == 0.0;
          p.ties += tie;
          p.near_ties += ex_near_midpoint(tie_d, f);
          for (int c = 0; c < nc; ++c) {
            const uint32_t xb = load_bits(outs[c].data_ptr(), i, f.bits);
            const double x = ex_value(xb, oc);
            xbits[c] = xb;
            xnan[c] = isnan_d(x);
            ConfigStats& s = p.configs[c];
            double e;
            const int cat = ex_classify(xb, x, R, f, &e);
            ++s.count[cat];
            if (cat == kExNanMismatch) continue;
            ++s.hist[ex_hist_bin(e)];
            if (e > s.max_error) {
              s.max_error = e;
              s.max_index = idx;
            }
          }
          size_t q = 0;
          for (int a = 0; a < nc; ++a)
            for (int b = a + 1; b < nc; ++b, ++q) {
              if (!ex_differ_bits(xbits[a], xbits[b], xnan[a], xnan[b], f)) continue;
              PairStats& ps = p.pairs[q];
              ++ps.differ;
              ps.differ_at_ties += tie;
              if (tie_d > ps.max_tie_distance) ps.max_tie_distance = tie_d;
              if (ps.first.size() < static_cast<size_t>(spec.first_k)) ps.first.push_back(idx);
            }
        }
      }
    });
    for (const Partial& p : parts) merge(&res, p, spec.first_k);
    res.n += static_cast<uint64_t>(n);
    start += static_cast<uint64_t>(n);
  }
  return res;
}

}  // namespace cl
