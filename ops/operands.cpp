// Operand checks and the collapsed iteration space, shared by the CPU and CUDA executors.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/checked.h"
#include "ops/program.h"

namespace cl {

void gather_operands(const Program& prog, const Tensor* const* inputs, int n_in,
                     const Tensor* const* outputs, int n_out, std::vector<const Tensor*>* ops) {
  if (n_out != static_cast<int>(prog.outputs.size()))
    throw std::invalid_argument("program expects " + std::to_string(prog.outputs.size()) +
                                " outputs");
  const Shape& shape = outputs[0]->shape();
  ops->clear();
  for (int k = 0; k < n_out; ++k) {
    const Tensor& t = *outputs[k];
    if (t.shape() != shape) throw std::invalid_argument("program outputs differ in shape");
    if (t.readonly()) throw std::invalid_argument("cannot write to a read-only tensor");
    ops->push_back(&t);
  }
  for (int k = 0; k < n_in; ++k) {
    const Tensor& t = *inputs[k];
    if (t.shape() != shape)
      throw std::invalid_argument("program input of shape " + shape_str(t.shape()) +
                                  " does not match output shape " + shape_str(shape));
    ops->push_back(&t);
  }
}

void check_loads(const Program& prog, const Tensor* const* inputs, int n_in) {
  for (const Instr& in : prog.code) {
    if (in.op != kOpLoad) continue;
    if (in.aux < 0 || in.aux >= n_in) throw std::invalid_argument("program loads a missing input");
    if (in.dtype != inputs[in.aux]->dtype())
      throw std::invalid_argument("program input dtype mismatch");
  }
}

void collapse_dims(const Shape& shape, const Tensor* const* ops, int nops, Iter* it,
                   std::vector<int64_t>* scratch) {
  // kept dims first (into scratch: [sh(D) | st(nops * D)])
  const int D0 = static_cast<int>(shape.size());
  const int D = std::max(D0, 1);
  scratch->assign(static_cast<size_t>(D) * (nops + 1), 0);
  int64_t* sh = scratch->data();
  int64_t* st = sh + D;
  int n = 0;
  for (int d = 0; d < D0; ++d) {
    if (shape[d] == 1) continue;
    sh[n] = shape[d];
    for (int k = 0; k < nops; ++k) st[k * D + n] = ops[k]->strides()[d];
    ++n;
  }
  if (n == 0) {
    sh[0] = 1;
    for (int k = 0; k < nops; ++k) st[k * D] = 0;
    n = 1;
  }
  // merge (at most n output dims)
  it->shape.assign(n, 0);
  it->st.assign(static_cast<size_t>(n) * nops, 0);
  int m = 0;
  it->shape[0] = sh[0];
  for (int k = 0; k < nops; ++k) it->st[static_cast<size_t>(k) * n] = st[k * D];
  for (int d = 1; d < n; ++d) {
    bool merge = true;
    for (int k = 0; k < nops; ++k) {
      int64_t outer = 0;  // the stride dimension d would have merged into m
      if (!mul_ok(st[k * D + d], sh[d], &outer) ||
          it->st[static_cast<size_t>(k) * n + m] != outer) {
        merge = false;
        break;
      }
    }
    if (merge) {
      it->shape[m] *= sh[d];  // a product of dims of the shape: <= numel, no overflow
      for (int k = 0; k < nops; ++k) it->st[static_cast<size_t>(k) * n + m] = st[k * D + d];
    } else {
      ++m;
      it->shape[m] = sh[d];
      for (int k = 0; k < nops; ++k) it->st[static_cast<size_t>(k) * n + m] = st[k * D + d];
    }
  }
  const int nd = m + 1;
  if (nd != n) {  // compact the strides to row length nd
    for (int k = 0; k < nops; ++k)
      for (int d = 0; d < nd; ++d)
        it->st[static_cast<size_t>(k) * nd + d] = it->st[static_cast<size_t>(k) * n + d];
    it->shape.resize(nd);
    it->st.resize(static_cast<size_t>(nd) * nops);
  }
  it->nd = nd;
}

}  // namespace cl
