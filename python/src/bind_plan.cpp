// A lowered graph, ready to run: the Programs of its regions and how each one's
// operands are bound (as strided views of the inputs, temporaries and outputs).
// Running a cached plan is one call from Python: binding, allocation and launches
// all happen here, so a cached fused call costs a few microseconds of host time.
#include <algorithm>
#include <cstring>

#include "ops/cuda/executor.h"
#include "ops/program.h"
#include "python/src/bindings.h"

using cl::Program;
using cl::Shape;
using cl::Tensor;

namespace {

struct Bind {
  int kind = 0;  // 0: input, 1: temporary, 2: output
  int index = 0;
  Shape shape, strides;
  int64_t offset = 0;  // element offset relative to the bound tensor's own offset
};

struct Step {
  std::shared_ptr<Program> prog;
  std::vector<Bind> leaves, outs;
};

struct Plan {
  std::vector<Step> steps;
  std::vector<std::pair<Shape, cl::DTypeCode>> temps, outputs;
  cl::Device device;

  // Operands are borrowed (no Tensor copies); a bind that is the whole tensor as it is
  // (the usual case for inputs and outputs) is passed without making a view.
  std::vector<Tensor> run(const Tensor* const* inputs, size_t n_inputs,
                          std::vector<Tensor> outs) const {
    if (outs.empty()) {
      outs.reserve(outputs.size());
      for (const auto& o : outputs) outs.push_back(Tensor::empty(o.first, o.second, device));
    } else if (outs.size() != outputs.size()) {
      throw std::invalid_argument("plan: wrong number of output tensors");
    }
    std::vector<Tensor> tmps;
    if (!temps.empty()) {
      tmps.reserve(temps.size());
      for (const auto& t : temps) tmps.push_back(Tensor::empty(t.first, t.second, device));
    }
    constexpr size_t kSmall = 16;
    const Tensor* in_small[kSmall];
    const Tensor* out_small[kSmall];
    std::vector<const Tensor*> in_big, out_big;
    std::vector<Tensor> views;  // views made for a step (reserved: pointers stay valid)
    size_t max_binds = 0;
    for (const Step& s : steps) max_binds = std::max(max_binds, s.leaves.size() + s.outs.size());
    auto base_of = [&](const Bind& b) -> const Tensor& {
      const size_t n = b.kind == 0 ? n_inputs : (b.kind == 1 ? tmps.size() : outs.size());
      if (b.index < 0 || static_cast<size_t>(b.index) >= n)
        throw std::invalid_argument("plan: missing operand");
      return b.kind == 0 ? *inputs[b.index] : (b.kind == 1 ? tmps[b.index] : outs[b.index]);
    };
    auto bind = [&](const Bind& b) -> const Tensor* {
      const Tensor& base = base_of(b);
      if (b.offset == 0 && b.shape == base.shape() && b.strides == base.strides()) return &base;
      if (views.capacity() == 0) views.reserve(max_binds);  // before the first view only
      views.push_back(base.as_strided(b.shape, b.strides, base.offset() + b.offset));
      return &views.back();
    };
    for (const Step& s : steps) {
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
      if (no > 0 && out_p[0]->device().type == cl::DeviceType::CUDA) {
        cl::cuda::launch_program_cuda(*s.prog, in_p, static_cast<int>(ni), out_p,
                                      static_cast<int>(no));
      } else {
        std::vector<Tensor> in_views, out_views;
        in_views.reserve(ni);
        out_views.reserve(no);
        for (size_t k = 0; k < ni; ++k) in_views.push_back(*in_p[k]);
        for (size_t k = 0; k < no; ++k) out_views.push_back(*out_p[k]);
        cl::run_program_any(*s.prog, in_views, out_views);
      }
    }
    return outs;
  }
};

// The tensors of a Python sequence, borrowed (a list of Tensors: no copies).
struct TensorRefs {
  static constexpr size_t kSmall = 16;
  const Tensor* small[kSmall];
  std::vector<const Tensor*> big;
  std::vector<Tensor> owned;  // only for sequences that are not lists
  const Tensor* const* data = small;
  size_t size = 0;
};

void tensor_refs(const py::handle& seq, TensorRefs* out) {
  if (PyList_Check(seq.ptr())) {
    const size_t n = static_cast<size_t>(PyList_GET_SIZE(seq.ptr()));
    const Tensor** p = out->small;
    if (n > TensorRefs::kSmall) {
      out->big.resize(n);
      p = out->big.data();
    }
    for (size_t i = 0; i < n; ++i) {
      py::detail::make_caster<Tensor> c;
      if (!c.load(PyList_GET_ITEM(seq.ptr(), static_cast<Py_ssize_t>(i)), false))
        throw py::type_error("Plan.run: expected a list of Tensors");
      p[i] = &py::detail::cast_op<const Tensor&>(c);
    }
    out->data = p;
    out->size = n;
    return;
  }
  out->owned = seq.cast<std::vector<Tensor>>();
  for (const Tensor& t : out->owned) out->big.push_back(&t);
  out->data = out->big.data();
  out->size = out->big.size();
}

Bind to_bind(const py::tuple& t) {
  // (kind, index, shape, strides, offset)
  Bind b;
  b.kind = t[0].cast<int>();
  b.index = t[1].cast<int>();
  b.shape = t[2].cast<Shape>();
  b.strides = t[3].cast<Shape>();
  b.offset = t[4].cast<int64_t>();
  return b;
}

// An exact, hashable key for a list of tensors' dtypes, shapes, strides and devices.
py::bytes signature(const std::vector<Tensor>& ts) {
  std::string key;
  for (const Tensor& t : ts) {
    const int64_t head[4] = {static_cast<int64_t>(t.dtype()), t.ndim(),
                             static_cast<int64_t>(t.device().type), t.device().index};
    key.append(reinterpret_cast<const char*>(head), sizeof(head));
    key.append(reinterpret_cast<const char*>(t.shape().data()), t.shape().size() * 8);
    key.append(reinterpret_cast<const char*>(t.strides().data()), t.strides().size() * 8);
  }
  return py::bytes(key);
}

}  // namespace

void bind_plan(py::module_& m) {
  py::class_<Plan, std::shared_ptr<Plan>>(m, "Plan")
      .def(py::init([](const std::vector<py::tuple>& steps,
                       const std::vector<std::pair<Shape, std::string>>& temps,
                       const std::vector<std::pair<Shape, std::string>>& outputs,
                       const std::string& device) {
        auto p = std::make_shared<Plan>();
        for (const auto& st : steps) {
          Step s;
          s.prog = st[0].cast<std::shared_ptr<Program>>();
          for (auto h : st[1].cast<py::list>()) s.leaves.push_back(to_bind(h.cast<py::tuple>()));
          for (auto h : st[2].cast<py::list>()) s.outs.push_back(to_bind(h.cast<py::tuple>()));
          p->steps.push_back(std::move(s));
        }
        for (const auto& t : temps) p->temps.emplace_back(t.first, cl::dtype_from_name(t.second));
        for (const auto& t : outputs)
          p->outputs.emplace_back(t.first, cl::dtype_from_name(t.second));
        p->device = device == "cpu"
                        ? cl::Device{cl::DeviceType::CPU, 0}
                        : cl::Device{cl::DeviceType::CUDA,
                                     device.size() > 5 ? std::stoi(device.substr(5)) : 0};
        return p;
      }))
      .def(
          "run",
          [](const Plan& p, const py::object& inputs, std::vector<Tensor> outs) {
            TensorRefs refs;
            tensor_refs(inputs, &refs);
            return p.run(refs.data, refs.size, std::move(outs));
          },
          py::arg("inputs"), py::arg("outputs") = std::vector<Tensor>{});
  m.def("signature", &signature, "exact key of the tensors' dtypes, shapes, strides, devices");
}
