// nll_loss steps of a Plan: the rows' gathered values reduced to the loss and the total
// weight in one of PyTorch's orders (ops/scalar/loss.h). This file checks the operands
// and runs the order on the CPU; ops/cuda/loss.cpp runs it on the GPU.
#pragma once
#include <string>

#include "core/tensor.h"
#include "ops/scalar/loss.h"

namespace cl {

// x, w: contiguous [n] float32 (float64 for fp64 input) holding the gathered values exactly
// (w ignored unless plan.has_w); t: contiguous [n] int64 targets; out: contiguous [2] of x's
// dtype: the loss and the total weight, each exactly a value of the format plan.fmt.
void run_nll(const NllPlan& plan, const Tensor& x, const Tensor& w, const Tensor& t,
             const Tensor& out);

}  // namespace cl
