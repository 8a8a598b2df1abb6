// The runtime: runs Programs on the device of their operands (the CPU executor, or the
// device's registered backend record: ops/backend.h), and runs lowered graphs as Plans.
// Pure C++ (python/src only binds it; the GIL is released there). Device-neutral: it
// includes nothing under ops/cpu or ops/cuda.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "ops/backend.h"
#include "ops/index.h"
#include "ops/loss.h"
#include "ops/program.h"
#include "ops/reduce.h"
#include "ops/row_step.h"

namespace cl {

// How one operand of a Plan step is bound: a strided view of an input, a temporary or an
// output of the plan.
struct PlanBind {
  enum Kind : int { kInput = 0, kTemp = 1, kOutput = 2 };
  int kind = kInput;
  int index = 0;
  Shape shape, strides;
  int64_t offset = 0;  // element offset relative to the bound tensor's own offset
};

// A step runs a Program, or a row step (row set: its operands are leaves then outs), or an
// index step (index set: gather / scatter_add of leaves[0] by leaves[1] into outs[0]), or
// an nll step (nll set: values, weights, targets = leaves[0..2] into outs[0]), or (all
// null) reduces the rows of leaves[0] into outs[0].
struct PlanStep {
  std::shared_ptr<Program> prog;
  std::vector<PlanBind> leaves, outs;
  ReduceSpec reduce;
  std::shared_ptr<RowStep> row;
  std::shared_ptr<IndexSpec> index;
  std::shared_ptr<NllPlan> nll;
};

// A lowered graph, ready to run: the Programs of its regions and how each one's operands
// are bound. Outputs and temporaries are allocated on the device of the inputs (the plan
// is device-independent: a plan cached for one device never allocates on another).
struct Plan {
  std::vector<PlanStep> steps;
  std::vector<std::pair<Shape, DTypeCode>> temps, outputs;
  // The strides each output was planned with (the binds of `steps` are relative to them);
  // empty, or an empty entry: contiguous. Outputs passed to run() must match exactly.
  std::vector<Shape> output_strides;
  Device device;  // where outputs and temporaries go when the plan has no inputs

  // Operands are borrowed (no Tensor copies); a bind that is the whole tensor as it is
  // (the usual case for inputs and outputs) is passed without making a view. `outs` empty:
  // allocated here.
  std::vector<Tensor> run(const Tensor* const* inputs, size_t n_inputs,
                          std::vector<Tensor> outs) const;
  // The device run() allocates on (and launches on) for these inputs.
  Device run_device(const Tensor* const* inputs, size_t n_inputs,
                    const std::vector<Tensor>& outs) const;
};

// An exact key of the tensors' dtypes, shapes, strides and devices (bytes).
std::string tensor_signature(const std::vector<Tensor>& ts);

}  // namespace cl
