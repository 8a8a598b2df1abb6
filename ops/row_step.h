// A row step of a Plan: reductions over the rows of a [rows, n] index space together with
// the elementwise Programs that compute what they reduce (prologues) and what uses their
// results (the epilogue), run as one GPU kernel with a thread block per row
// (ops/cuda/row_kernel.h): RMSNorm and softmax read x and write y once from global memory.
// The values are those of the separate steps it replaces (Program -> temporary -> reduce
// -> Program): the same per-element functions and the same order of accumulation
// (ops/scalar/reduce.h), so fusing changes no bit.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "ops/program.h"
#include "ops/reduce.h"

namespace cl {

uint64_t next_row_step_id();

struct RowPhase {
  // The value reduced, per element: a Program with one float32/float64 output, or null
  // when operand ins[0] (float32/float64) is reduced as it is.
  std::shared_ptr<Program> prog;
  std::vector<int> ins;  // the Program's inputs (operand indices)
  ReduceSpec spec;
  int q = 0;  // the operand receiving the row results: [rows], contiguous, accumulator type
};

// Operands are numbered as the step binds them (its leaves, then its outs); operand k's
// element (r, j) lies at r * rs[k] + j * cs[k] from its data pointer. A later phase or the
// epilogue reads an earlier q with rs = 1, cs = 0 (its own row's result).
struct RowStep {
  uint64_t id = next_row_step_id();  // the compiled kernels' cache key
  int64_t rows = 0, n = 0;
  std::vector<RowPhase> phases;
  std::shared_ptr<Program> epilogue;  // may be null
  std::vector<int> epi_ins, epi_outs;
  std::vector<int64_t> rs, cs;
};

// Throws std::invalid_argument unless the step is well formed for these operands (counts,
// dtypes: each phase's q and Program output in one accumulator type, float32 or float64).
void check_row_step(const RowStep& s, const Tensor* const* ops, size_t nops);
// check_row_step, and every operand's [rows, n] view (rs, cs) inside its storage; before
// each run (a generated kernel indexes with these strides unchecked).
void check_row_bounds(const RowStep& s, const Tensor* const* ops, size_t nops);

// Runs the step on the CPU: rows in chunks small enough to stay in cache (each phase's
// values of a chunk in a buffer, reduced, then the chunk's epilogue).
void run_row_cpu(const RowStep& s, const Tensor* const* ops, size_t nops);

}  // namespace cl
