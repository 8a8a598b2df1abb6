#include "ops/row_step.h"

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "ops/backend.h"

namespace cl {

uint64_t next_row_step_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

void check_row_step(const RowStep& s, const Tensor* const* ops, size_t nops) {
  auto bad = [](const std::string& why) { throw std::invalid_argument("row step: " + why); };
  if (s.phases.empty()) bad("no reduction");
  if (s.rows < 0 || s.n < 0) bad("negative size");
  if (s.rs.size() != nops || s.cs.size() != nops) bad("one row stride per operand expected");
  auto operand = [&](int k) {
    if (k < 0 || static_cast<size_t>(k) >= nops) bad("operand " + std::to_string(k) + " missing");
    return ops[k];
  };
  const DTypeCode acc = operand(s.phases[0].q)->dtype();
  if (acc != kFloat32 && acc != kFloat64) bad("the row results must be float32 or float64");
  for (const RowPhase& p : s.phases) {
    if (operand(p.q)->dtype() != acc) bad("phases accumulate in different dtypes");
    for (int k : p.ins) operand(k);
    if (p.prog) {
      if (p.prog->outputs.size() != 1) bad("a phase's Program has one output");
    } else if (p.ins.size() != 1 || operand(p.ins[0])->dtype() != acc) {
      bad("a phase without a Program reduces one operand of the accumulator's dtype");
    }
  }
  for (const RowPhase& p : s.phases)
    if (s.rs[p.q] != 1 || s.cs[p.q] != 0 || !operand(p.q)->is_contiguous())
      bad("a row result must be a contiguous [rows] tensor");
  for (int k : s.epi_ins) operand(k);
  for (int k : s.epi_outs) operand(k);
  if (s.epilogue && s.epilogue->outputs.size() != s.epi_outs.size())
    bad("the epilogue's outputs and operands differ in number");
}

void check_row_bounds(const RowStep& s, const Tensor* const* ops, size_t nops) {
  check_row_step(s, ops, nops);
  // every operand's [rows, n] view lies inside its storage (as_strided throws otherwise):
  // a planner's mistake becomes an exception here, not a read or write out of bounds in a
  // kernel
  if (s.rows > 0 && s.n > 0)
    for (size_t k = 0; k < nops; ++k)
      (void)ops[k]->as_strided({s.rows, s.n}, {s.rs[k], s.cs[k]}, ops[k]->offset());
}

namespace {

// Operand k's rows [r0, r0 + cr) as a [cr, n] view.
Tensor rows_view(const RowStep& s, const Tensor* const* ops, int k, int64_t r0, int64_t cr) {
  const Tensor& t = *ops[k];
  return t.as_strided({cr, s.n}, {s.rs[k], s.cs[k]}, t.offset() + r0 * s.rs[k]);
}

template <typename T>
void reduce_chunk(const RedPlan& P, const T* v, T* q, int64_t cr, int64_t n, int64_t r0) {
  parallel_for(cr, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, n)), [&](int64_t a, int64_t b) {
    std::vector<T> parts(static_cast<size_t>(std::max<int64_t>(P.nparts, 1)));
    for (int64_t r = a; r < b; ++r) {
      for (int64_t t = 0; t < P.nparts; ++t) parts[t] = red_part<T>(P, v + r * n, n, r0 + r, t);
      q[r] = red_combine<T>(P, parts.data());
      if (P.zmode > 0 && q[r] == T(0)) q[r] = red_cpu_extreme_zero<T>(P, v + r * n, n, r0 + r);
    }
  });
}

// Operand k's rows [r0, r0 + c) (accumulator type) copied into the contiguous buffer.
template <typename T>
void gather_rows(const RowStep& s, const Tensor& t, int k, int64_t r0, int64_t c, T* dst) {
  const T* src = static_cast<const T*>(t.data_ptr());
  for (int64_t r = 0; r < c; ++r)
    for (int64_t j = 0; j < s.n; ++j) dst[r * s.n + j] = src[(r0 + r) * s.rs[k] + j * s.cs[k]];
}

}  // namespace

void run_row_cpu(const RowStep& s, const Tensor* const* ops, size_t nops) {
  check_row_bounds(s, ops, nops);
  const DTypeCode acc = ops[s.phases[0].q]->dtype();
  std::vector<RedPlan> plans;
  for (const RowPhase& p : s.phases) plans.push_back(make_red_plan(p.spec, s.n, s.rows));
  const int64_t cr = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, s.n));
  Tensor buf = Tensor::empty({std::min(cr, std::max<int64_t>(s.rows, 1)), s.n}, acc, Device{});
  auto views = [&](const std::vector<int>& ks, int64_t r0, int64_t c) {
    std::vector<Tensor> v;
    for (int k : ks) v.push_back(rows_view(s, ops, k, r0, c));
    return v;
  };
  for (int64_t r0 = 0; r0 < s.rows; r0 += cr) {
    const int64_t c = std::min(cr, s.rows - r0);
    for (size_t i = 0; i < s.phases.size(); ++i) {
      const RowPhase& p = s.phases[i];
      const Tensor vals = buf.as_strided({c, s.n}, {s.n, 1}, buf.offset());
      if (p.prog) {
        run_program_any(*p.prog, views(p.ins, r0, c), {vals});
      } else if (acc == kFloat32) {
        gather_rows(s, *ops[p.ins[0]], p.ins[0], r0, c, static_cast<float*>(vals.data_ptr()));
      } else {
        gather_rows(s, *ops[p.ins[0]], p.ins[0], r0, c, static_cast<double*>(vals.data_ptr()));
      }
      const Tensor& q = *ops[p.q];
      if (acc == kFloat32)
        reduce_chunk(plans[i], static_cast<const float*>(vals.data_ptr()),
                     static_cast<float*>(q.data_ptr()) + r0, c, s.n, r0);
      else
        reduce_chunk(plans[i], static_cast<const double*>(vals.data_ptr()),
                     static_cast<double*>(q.data_ptr()) + r0, c, s.n, r0);
    }
    if (s.epilogue) run_program_any(*s.epilogue, views(s.epi_ins, r0, c), views(s.epi_outs, r0, c));
  }
}

}  // namespace cl
