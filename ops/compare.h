// castlab.numerics.compare's metrics by castlab's own code (ops/scalar/compare.h), on the CPU
// (threads) and on the GPU (ops/cuda/compare.cpp): the leaves of NumPy's pairwise tree in
// parallel, then the tree combined level by level, so the sums are NumPy's on the whole array.
#pragma once
#include <cstdint>
#include <vector>

#include "ops/scalar/compare.h"

namespace cl {

// NumPy's halving tree over [0, n): leaves 0..L-1 in index order (leaf k is
// [leaf_lo[k], leaf_lo[k + 1])), internal nodes L..L+M-1 numbered by height (children before
// parents; the root is the last node). Internal node L + i joins left[i] and right[i];
// level_end[h] is the end (in i) of the nodes of height h + 1.
struct CmpTree {
  int64_t n = 0;
  std::vector<int64_t> leaf_lo;
  std::vector<int64_t> left, right;
  std::vector<int64_t> level_end;
  int64_t leaves() const { return static_cast<int64_t>(leaf_lo.size()) - 1; }
  int64_t nodes() const { return leaves() + static_cast<int64_t>(left.size()); }
};
CmpTree cmp_tree(int64_t n);

// The root's statistics: cmp_nd(nres) doubles, cmp_ni(nres) int64s (layout in compare.h).
struct CmpTotals {
  std::vector<double> d;
  std::vector<int64_t> i;
};
// Checks the parameters (1..kCmpMaxResults results, n > 0, float dtype codes).
void cmp_check(const CmpParams& P);
CmpTotals compare_cpu(const CmpParams& P);
// near_ties over n elements of `ref` (dtype ref_code) for format `fmt` (largest finite
// value fmax): mask (1 byte each) and signed distances (fp64) written, the mask's count
// returned (ops/scalar/compare.h, tie_distance).
int64_t near_ties_cpu(const void* ref, int ref_code, int64_t n, int fmt, double fmax, double within,
                      uint8_t* mask, double* dist);
// NearTies.mismatch_rate's counts (mismatches inside, inside, all mismatches) of n elements.
void tie_split_cpu(const void* a, int acode, const void* b, int bcode, const uint8_t* mask,
                   int64_t n, int64_t* out3);
// numerics.ulp_error / ulp_diff over n elements of contiguous operands (compare.h's
// ulp_error_at / ulp_diff_at): fp64 errors; int64 distances and a 1-byte NaN-mismatch mask.
void ulp_error_cpu(const void* x, int xcode, const void* r, int rcode, int64_t n, int fmt,
                   double* out);
void ulp_diff_cpu(const void* a, const void* b, int code, int64_t n, int64_t* out, uint8_t* mask);

}  // namespace cl
