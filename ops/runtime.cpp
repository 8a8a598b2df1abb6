#include "ops/runtime.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/checked.h"

namespace cl {

Device Plan::run_device(const Tensor* const* inputs, size_t n_inputs,
                        const std::vector<Tensor>& outs) const {
  if (!outs.empty()) return outs[0].device();
  if (n_inputs > 0) return inputs[0]->device();
  return device;
}

std::vector<Tensor> Plan::run(const Tensor* const* inputs, size_t n_inputs,
                              std::vector<Tensor> outs) const {
  const Device dev = run_device(inputs, n_inputs, outs);
  if (outs.empty()) {
    outs.reserve(outputs.size());
    for (const auto& o : outputs) outs.push_back(Tensor::empty(o.first, o.second, dev));
  } else if (outs.size() != outputs.size()) {
    throw std::invalid_argument("plan: wrong number of output tensors");
  } else {
    // The binds were computed against outputs of one layout: another layout would be
    // written at the wrong addresses.
    for (size_t k = 0; k < outs.size(); ++k) {
      const Shape want = k < output_strides.size() && !output_strides[k].empty()
                             ? output_strides[k]
                             : contiguous_strides(outputs[k].first);
      if (outs[k].shape() != outputs[k].first || outs[k].dtype() != outputs[k].second ||
          (outs[k].strides() != want && outs[k].numel() > 1))
        throw std::invalid_argument(
            "plan: output " + std::to_string(k) + " has shape " + shape_str(outs[k].shape()) +
            " and strides " + shape_str(outs[k].strides()) + ", the plan was made for " +
            shape_str(outputs[k].first) + " with strides " + shape_str(want));
    }
  }
  std::vector<Tensor> tmps;
  if (!temps.empty()) {
    tmps.reserve(temps.size());
    for (const auto& t : temps) tmps.push_back(Tensor::empty(t.first, t.second, dev));
  }
  constexpr size_t kSmall = 16;
  const Tensor* in_small[kSmall];
  const Tensor* out_small[kSmall];
  std::vector<const Tensor*> in_big, out_big;
  std::vector<Tensor> views;  // views made for a step (reserved: pointers stay valid)
  size_t max_binds = 0;
  for (const PlanStep& s : steps) max_binds = std::max(max_binds, s.leaves.size() + s.outs.size());
  auto base_of = [&](const PlanBind& b) -> const Tensor& {
    const size_t n = b.kind == PlanBind::kInput
                         ? n_inputs
                         : (b.kind == PlanBind::kTemp ? tmps.size() : outs.size());
    if (b.index < 0 || static_cast<size_t>(b.index) >= n)
      throw std::invalid_argument("plan: missing operand");
    return b.kind == PlanBind::kInput ? *inputs[b.index]
                                      : (b.kind == PlanBind::kTemp ? tmps[b.index] : outs[b.index]);
  };
  auto bind = [&](const PlanBind& b) -> const Tensor* {
    const Tensor& base = base_of(b);
    if (b.offset == 0 && b.shape == base.shape() && b.strides == base.strides()) return &base;
    if (views.capacity() == 0) views.reserve(max_binds);  // before the first view only
    views.push_back(
        base.as_strided(b.shape, b.strides, checked_add(base.offset(), b.offset, "plan: offset")));
    return &views.back();
  };
  for (const PlanStep& s : steps) {
    const size_t ni = s.leaves.size(), no = s.outs.size();
    const Tensor** in_p = in_small;
    const Tensor** out_p = out_small;
    if (ni > kSmall) {
      in_big.resize(ni);
      in_p = in_big.data();
    }
    if (no > kSmall) {
      out_big.resize(no);
      out_p = out_big.data();
    }
    views.clear();
    for (size_t k = 0; k < ni; ++k) in_p[k] = bind(s.leaves[k]);
    for (size_t k = 0; k < no; ++k) out_p[k] = bind(s.outs[k]);
    if (s.row) {
      std::vector<const Tensor*> ops(in_p, in_p + ni);
      ops.insert(ops.end(), out_p, out_p + no);
      if (dev.type == DeviceType::CPU)
        run_row_cpu(*s.row, ops.data(), ops.size());
      else
        device_backend(dev.type).run_rows(*s.row, ops.data(), ops.size());
      continue;
    }
    if (s.nll) {
      if (ni != 3 || no != 1)
        throw std::invalid_argument("plan: an nll step has three operands and one result");
      run_nll(*s.nll, *in_p[0], *in_p[1], *in_p[2], *out_p[0]);
      continue;
    }
    if (s.index) {
      if (ni != 2 || no != 1)
        throw std::invalid_argument("plan: an index step has two operands and one result");
      run_index(*s.index, *in_p[0], *in_p[1], *out_p[0]);
      continue;
    }
    if (!s.prog) {
      if (ni != 1 || no != 1) throw std::invalid_argument("plan: a reduce step has one operand");
      run_reduce(s.reduce, *in_p[0], *out_p[0]);
      continue;
    }
    if (no > 0 && out_p[0]->device().type != DeviceType::CPU) {
      device_backend(out_p[0]->device().type)
          .launch_program(*s.prog, in_p, static_cast<int>(ni), out_p, static_cast<int>(no));
    } else {
      std::vector<Tensor> in_views, out_views;
      in_views.reserve(ni);
      out_views.reserve(no);
      for (size_t k = 0; k < ni; ++k) in_views.push_back(*in_p[k]);
      for (size_t k = 0; k < no; ++k) out_views.push_back(*out_p[k]);
      run_program_any(*s.prog, in_views, out_views);
    }
  }
  return outs;
}

std::string tensor_signature(const std::vector<Tensor>& ts) {
  std::string key;
  for (const Tensor& t : ts) {
    // where the data starts within a 16-byte word: PyTorch's CUDA kernels choose their
    // order by it (SoftMax.cu's ilpReduce, layer_norm's vectorized kernel)
    const int64_t head[5] = {static_cast<int64_t>(t.dtype()), t.ndim(),
                             static_cast<int64_t>(t.device().type), t.device().index,
                             static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16)};
    key.append(reinterpret_cast<const char*>(head), sizeof(head));
    key.append(reinterpret_cast<const char*>(t.shape().data()), t.shape().size() * 8);
    key.append(reinterpret_cast<const char*>(t.strides().data()), t.strides().size() * 8);
  }
  return key;
}

}  // namespace cl
