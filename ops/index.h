// Index steps of a Plan: PyTorch's gather and scatter_add along one dim, on strided views.
//   gather:      out[p] = src[p with p[dim] replaced by index[p]]  (out has index's shape;
//                elements copied bit for bit, any dtype; with wrap, the index modulo the
//                size, as take_along_dim's `indices % dim_size`)
//   scatter_add: out (float32/float64) is zeroed, then for each row of index along dim
//                (every other coordinate fixed), in order along dim:
//                out[p with p[dim] replaced by index[p]] += src[p]
//                (ATen's CPU scatter_add order; castlab's GPU kernel keeps it: one thread a
//                row, so no atomics and the same bits on both devices)
//   check:       every index in [0, size) (a gather whose values need no step: its input
//                is broadcast along dim); src and out are the index itself, unwritten
// An index outside [0, size) raises std::out_of_range with PyTorch's message.
#pragma once
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace cl {

enum IndexMode : int { kIndexGather = 0, kIndexScatterAdd = 1, kIndexCheck = 2 };

struct IndexSpec {
  int mode = kIndexGather;
  int dim = 0;
  int64_t size = 0;     // check: the extent the indices must lie in
  bool wrap = false;    // gather and check: the index modulo the size (floor)
  bool target = false;  // the error names a class target (nll_loss): "Target 5 is out of bounds."
};

// Checks shapes, dtypes and devices (std::invalid_argument) and runs the step.
void run_index(const IndexSpec& s, const Tensor& src, const Tensor& index, const Tensor& out);

// The dims an index step handles (a view of more is refused with a clear error).
constexpr int kIndexMaxDims = 16;

}  // namespace cl
