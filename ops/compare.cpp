// castlab.numerics.compare on the CPU: the leaves of NumPy's pairwise tree on castlab's thread
// pool, then the tree's levels (ops/compare.h).
#include "ops/compare.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/parallel.h"

namespace cl {

namespace {

struct Builder {
  std::vector<int64_t> leaf_lo;
  std::vector<int64_t> l, r;  // temporary ids: leaves >= 0, internal nodes ~index
  std::vector<int> height;
  // returns the node's temporary id: k >= 0 a leaf, -1 - i the internal node i
  int64_t build(int64_t off, int64_t len, int* h) {
    if (len <= kRedPairwiseBlock) {
      leaf_lo.push_back(off);
      *h = 0;
      return static_cast<int64_t>(leaf_lo.size()) - 1;
    }
    const int64_t n2 = red_pairwise_half(len);
    int hl = 0, hr = 0;
    const int64_t a = build(off, n2, &hl);
    const int64_t b = build(off + n2, len - n2, &hr);
    l.push_back(a);
    r.push_back(b);
    *h = std::max(hl, hr) + 1;
    height.push_back(*h);
    return -static_cast<int64_t>(l.size());
  }
};

}  // namespace

CmpTree cmp_tree(int64_t n) {
  if (n <= 0) throw std::invalid_argument("compare: no elements");
  Builder b;
  int h = 0;
  b.build(0, n, &h);
  CmpTree t;
  t.n = n;
  const int64_t L = static_cast<int64_t>(b.leaf_lo.size());
  const int64_t M = static_cast<int64_t>(b.l.size());
  t.leaf_lo = std::move(b.leaf_lo);
  t.leaf_lo.push_back(n);
  // number the internal nodes by height (a counting sort; stable)
  std::vector<int64_t> count(static_cast<size_t>(h) + 1, 0);
  for (int hh : b.height) ++count[static_cast<size_t>(hh)];
  t.level_end.assign(static_cast<size_t>(h), 0);
  std::vector<int64_t> next(static_cast<size_t>(h) + 1, 0);
  int64_t acc = 0;
  for (int hh = 1; hh <= h; ++hh) {
    next[static_cast<size_t>(hh)] = acc;
    acc += count[static_cast<size_t>(hh)];
    t.level_end[static_cast<size_t>(hh) - 1] = acc;
  }
  std::vector<int64_t> final_id(static_cast<size_t>(M));
  for (int64_t i = 0; i < M; ++i) final_id[i] = next[static_cast<size_t>(b.height[i])]++;
  auto id = [&](int64_t tmp) { return tmp >= 0 ? tmp : L + final_id[-tmp - 1]; };
  t.left.assign(static_cast<size_t>(M), 0);
  t.right.assign(static_cast<size_t>(M), 0);
  for (int64_t i = 0; i < M; ++i) {
    t.left[final_id[i]] = id(b.l[i]);
    t.right[final_id[i]] = id(b.r[i]);
  }
  return t;
}

void cmp_check(const CmpParams& P) {
  if (P.nres < 1 || P.nres > kCmpMaxResults)
    throw std::invalid_argument("compare: 1 to " + std::to_string(kCmpMaxResults) +
                                " results, got " + std::to_string(P.nres));
  if (P.n <= 0) throw std::invalid_argument("compare: no elements");
  auto is_float = [](int c) { return c >= kFloat64 && c <= kFloat8E5M2; };
  for (int j = 0; j < P.nres; ++j)
    if (!is_float(P.code[j]) || P.x[j] == nullptr)
      throw std::invalid_argument("compare: result " + std::to_string(j) +
                                  " is not a float tensor");
    else if (!is_float(P.fmt[j]))
      throw std::invalid_argument("compare: the format of result " + std::to_string(j) +
                                  " is not a float format");
  if (P.ref != nullptr && !is_float(P.ref_code))
    throw std::invalid_argument("compare: the reference is not a float tensor");
}

CmpTotals compare_cpu(const CmpParams& P) {
  cmp_check(P);
  const CmpTree t = cmp_tree(P.n);
  const int nd = cmp_nd(P.nres), ni = cmp_ni(P.nres);
  const int64_t L = t.leaves(), N = t.nodes();
  std::vector<double> D(static_cast<size_t>(N) * nd);
  std::vector<int64_t> I(static_cast<size_t>(N) * ni);
  parallel_for(L, 256, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k)
      cmp_leaf(P, t.leaf_lo[k], t.leaf_lo[k + 1] - t.leaf_lo[k], &D[k * nd], &I[k * ni]);
  });
  int64_t begin = 0;
  for (int64_t end : t.level_end) {
    parallel_for(end - begin, 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = begin + b; i < begin + e; ++i) {
        const int64_t node = L + i, a = t.left[i], c = t.right[i];
        cmp_combine(P.nres, &D[a * nd], &I[a * ni], &D[c * nd], &I[c * ni], &D[node * nd],
                    &I[node * ni]);
      }
    });
    begin = end;
  }
  CmpTotals out;
  out.d.assign(D.end() - nd, D.end());
  out.i.assign(I.end() - ni, I.end());
  return out;
}

int64_t near_ties_cpu(const void* ref, int ref_code, int64_t n, int fmt, double fmax, double within,
                      uint8_t* mask, double* dist) {
  const ExFormat f = ex_format(fmt);
  constexpr int64_t kChunk = 1 << 15;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<int64_t> count(static_cast<size_t>(std::max<int64_t>(chunks, 1)), 0);
  parallel_for(chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      int64_t k = 0;
      for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) {
        bool in = false;
        dist[i] = tie_distance(cmp_load(ref, ref_code, i), f, fmax, within, &in);
        mask[i] = in ? 1 : 0;
        k += in ? 1 : 0;
      }
      count[static_cast<size_t>(c)] = k;
    }
  });
  int64_t total = 0;
  for (int64_t k : count) total += k;
  return total;
}

void tie_split_cpu(const void* a, int acode, const void* b, int bcode, const uint8_t* mask,
                   int64_t n, int64_t* out3) {
  constexpr int64_t kChunk = 1 << 15;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<int64_t> tc(static_cast<size_t>(std::max<int64_t>(chunks, 1)) * 3, 0);
  parallel_for(chunks, 1, [&](int64_t b0, int64_t e0) {
    for (int64_t c = b0; c < e0; ++c)
      tie_split_range(a, acode, b, bcode, mask, c * kChunk, std::min(n, (c + 1) * kChunk),
                      &tc[static_cast<size_t>(c) * 3]);
  });
  out3[0] = out3[1] = out3[2] = 0;
  for (size_t c = 0; c < tc.size(); ++c) out3[c % 3] += tc[c];
}

void ulp_error_cpu(const void* x, int xcode, const void* r, int rcode, int64_t n, int fmt,
                   double* out) {
  const ExFormat f = ex_format(fmt);
  parallel_for(n, 1 << 15, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = ulp_error_at(x, xcode, r, rcode, i, f);
  });
}

void ulp_diff_cpu(const void* a, const void* b, int code, int64_t n, int64_t* out, uint8_t* mask) {
  parallel_for(n, 1 << 15, [&](int64_t b0, int64_t e0) {
    for (int64_t i = b0; i < e0; ++i) {
      bool m = false;
      out[i] = ulp_diff_at(a, b, code, i, &m);
      mask[i] = m ? 1 : 0;
    }
  });
}

}  // namespace cl
