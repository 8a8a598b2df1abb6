// A lowered graph, ready to run: the Programs of its regions and how each one's
// operands are bound (as strided views of the inputs, temporaries and outputs).
// Running a cached plan is one call from Python: binding, allocation and launches
// all happen here, so a cached fused call costs a few microseconds of host time.
#include <cstring>

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

  std::vector<Tensor> run(const std::vector<Tensor>& inputs, std::vector<Tensor> outs) const {
    if (outs.empty()) {
      outs.reserve(outputs.size());
      for (const auto& o : outputs) outs.push_back(Tensor::empty(o.first, o.second, device));
    } else if (outs.size() != outputs.size()) {
      throw std::invalid_argument("plan: wrong number of output tensors");
    }
    std::vector<Tensor> tmps;
    tmps.reserve(temps.size());
    for (const auto& t : temps) tmps.push_back(Tensor::empty(t.first, t.second, device));
    auto bind = [&](const Bind& b) -> Tensor {
      const std::vector<Tensor>& src = b.kind == 0 ? inputs : (b.kind == 1 ? tmps : outs);
      if (b.index < 0 || b.index >= static_cast<int>(src.size()))
        throw std::invalid_argument("plan: missing operand");
      const Tensor& base = src[b.index];
      return base.as_strided(b.shape, b.strides, base.offset() + b.offset);
    };
    std::vector<Tensor> in_views, out_views;
    for (const Step& s : steps) {
      in_views.clear();
      out_views.clear();
      for (const Bind& b : s.leaves) in_views.push_back(bind(b));
      for (const Bind& b : s.outs) out_views.push_back(bind(b));
      cl::run_program_any(*s.prog, in_views, out_views);
    }
    return outs;
  }
};

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
        p->device = device == "cpu" ? cl::Device{cl::DeviceType::CPU, 0}
                                    : cl::Device{cl::DeviceType::CUDA,
                                                 device.size() > 5 ? std::stoi(device.substr(5)) : 0};
        return p;
      }))
      .def("run", &Plan::run, py::arg("inputs"), py::arg("outputs") = std::vector<Tensor>{});
  m.def("signature", &signature, "exact key of the tensors' dtypes, shapes, strides, devices");
}
