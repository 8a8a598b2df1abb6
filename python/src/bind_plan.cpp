// castlab._C.Plan: binds cl::Plan (ops/runtime.h), a lowered graph ready to run.
// Running a cached plan is one call from Python: binding, allocation and launches
// all happen in C++, so a cached fused call costs a few microseconds of host time.
#include "ops/cuda/row_kernel.h"
#include "ops/program.h"
#include "ops/runtime.h"
#include "python/src/bindings.h"

using cl::Plan;
using cl::PlanBind;
using cl::PlanStep;
using cl::Program;
using cl::Shape;
using cl::Tensor;

namespace {

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

PlanBind to_bind(const py::tuple& t) {
  // (kind, index, shape, strides, offset)
  PlanBind b;
  b.kind = t[0].cast<int>();
  b.index = t[1].cast<int>();
  b.shape = t[2].cast<Shape>();
  b.strides = t[3].cast<Shape>();
  b.offset = t[4].cast<int64_t>();
  return b;
}

// An exact, hashable key for a list of tensors' dtypes, shapes, strides and devices.
py::bytes signature(const std::vector<Tensor>& ts) { return py::bytes(cl::tensor_signature(ts)); }

// (kind, order, p0, p1, p2, p3[, p4, p5]), validated.
cl::ReduceSpec to_spec(const py::handle& h) {
  const auto sp = h.cast<std::vector<int64_t>>();
  if (sp.size() != 6 && sp.size() != 8)
    throw std::invalid_argument("plan: reduce spec has 6 or 8 fields");
  cl::ReduceSpec r;
  r.kind = static_cast<int>(sp[0]);
  r.order = static_cast<int>(sp[1]);
  r.p0 = sp[2];
  r.p1 = sp[3];
  r.p2 = sp[4];
  r.p3 = sp[5];
  if (sp.size() == 8) {
    r.p4 = sp[6];
    r.p5 = sp[7];
  }
  (void)cl::make_red_plan(r, 2, 1);  // validates kind, order, parameters (a dot row: 2m)
  return r;
}

// (rows, n, [(Program | None, [ins], spec, q)], epilogue | None, [epi ins], [epi outs],
//  [rs], [cs]): ops/row_step.h.
std::shared_ptr<cl::RowStep> to_row_step(const py::tuple& t) {
  if (t.size() != 8) throw std::invalid_argument("plan: a row step spec has 8 fields");
  auto r = std::make_shared<cl::RowStep>();
  r->rows = t[0].cast<int64_t>();
  r->n = t[1].cast<int64_t>();
  for (auto h : t[2].cast<py::list>()) {
    const auto ph = h.cast<py::tuple>();
    if (ph.size() != 4) throw std::invalid_argument("plan: a row phase has 4 fields");
    cl::RowPhase p;
    if (!ph[0].is_none()) p.prog = ph[0].cast<std::shared_ptr<Program>>();
    p.ins = ph[1].cast<std::vector<int>>();
    p.spec = to_spec(ph[2]);
    p.q = ph[3].cast<int>();
    r->phases.push_back(std::move(p));
  }
  if (!t[3].is_none()) r->epilogue = t[3].cast<std::shared_ptr<Program>>();
  r->epi_ins = t[4].cast<std::vector<int>>();
  r->epi_outs = t[5].cast<std::vector<int>>();
  r->rs = t[6].cast<std::vector<int64_t>>();
  r->cs = t[7].cast<std::vector<int64_t>>();
  return r;
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
          PlanStep s;
          if (st[0].is_none()) {  // a reduce step: (None, [src], [dst], (kind, order, p0..p3))
            if (st.size() != 4) throw std::invalid_argument("plan: a reduce step needs its spec");
            s.reduce = to_spec(st[3]);
          } else if (py::isinstance<py::str>(st[0])) {
            // ("row", [leaves], [outs], row spec) or
            // ("index", [src, index], [out], (mode, dim, size, wrap, target)): ops/index.h
            // ("nll", [values, weights, targets], [out], (order, reduction, fmt, has_w,
            // ignore_index)): ops/loss.h
            const std::string kind = st[0].cast<std::string>();
            if (st.size() != 4 || (kind != "row" && kind != "index" && kind != "nll"))
              throw std::invalid_argument("plan: unknown step kind");
            if (kind == "nll") {
              const auto q = st[3].cast<std::tuple<int, int, int, int, int64_t>>();
              auto np = std::make_shared<cl::NllPlan>();
              np->order = std::get<0>(q);
              np->reduction = std::get<1>(q);
              np->fmt = std::get<2>(q);
              np->has_w = std::get<3>(q);
              np->ignore_index = std::get<4>(q);
              s.nll = np;
            } else if (kind == "row") {
              s.row = to_row_step(st[3].cast<py::tuple>());
            } else {
              const auto md = st[3].cast<std::tuple<int, int, int64_t, bool, bool>>();
              s.index = std::make_shared<cl::IndexSpec>(
                  cl::IndexSpec{std::get<0>(md), std::get<1>(md), std::get<2>(md), std::get<3>(md),
                                std::get<4>(md)});
            }
          } else {
            s.prog = st[0].cast<std::shared_ptr<Program>>();
          }
          for (auto h : st[1].cast<py::list>()) s.leaves.push_back(to_bind(h.cast<py::tuple>()));
          for (auto h : st[2].cast<py::list>()) s.outs.push_back(to_bind(h.cast<py::tuple>()));
          p->steps.push_back(std::move(s));
        }
        for (const auto& t : temps) p->temps.emplace_back(t.first, cl::dtype_from_name(t.second));
        for (const auto& t : outputs)
          p->outputs.emplace_back(t.first, cl::dtype_from_name(t.second));
        p->device = cl::Device::parse(device);
        return p;
      }))
      .def_readwrite("output_strides", &Plan::output_strides)
      .def(
          "run",
          [](const Plan& p, const py::object& inputs, std::vector<Tensor> outs) {
            TensorRefs refs;
            tensor_refs(inputs, &refs);
            // The GIL is released for every device: CPU kernels, CUDA launches and the
            // NVRTC compiles of a first run touch no Python object (the tensors are held
            // by `inputs` and `outs` for the whole call).
            py::gil_scoped_release nogil;
            return p.run(refs.data, refs.size, std::move(outs));
          },
          py::arg("inputs"), py::arg("outputs") = std::vector<Tensor>{});
  m.def(
      "reduce_rows",
      [](const Tensor& src, const Tensor& dst, int kind, int order, int64_t p0, int64_t p1,
         int64_t p2, int64_t p3, int64_t p4, int64_t p5) {
        cl::ReduceSpec sp{kind, order, p0, p1, p2, p3, p4, p5};
        py::gil_scoped_release nogil;
        cl::run_reduce(sp, src, dst);
      },
      "reduce the rows of a contiguous f32/f64 [rows, n] tensor into dst [rows] in an order "
      "(ops/scalar/reduce.h)",
      py::arg("src"), py::arg("dst"), py::arg("kind"), py::arg("order"), py::arg("p0") = 0,
      py::arg("p1") = 0, py::arg("p2") = 0, py::arg("p3") = 0, py::arg("p4") = 0,
      py::arg("p5") = 0);
  m.def(
      "describe_reduce",
      [](const py::tuple& spec, int64_t n, int64_t rows) {
        return cl::describe_red_plan(cl::make_red_plan(to_spec(spec), n, rows));
      },
      "the launch configuration of a reduction order (a spec as Plan takes it), in words",
      py::arg("spec"), py::arg("n"), py::arg("rows"));
  m.def(
      "row_kernel_fits",
      [](const py::tuple& spec, bool f64, int dev) {
        return cl::cuda::row_kernel_fits(*to_row_step(spec), f64, dev);
      },
      "whether a row step (its spec as Plan takes it) fits the shared memory of CUDA device dev",
      py::arg("spec"), py::arg("f64"), py::arg("dev"));
  m.def(
      "_row_kernel_source",
      [](const py::tuple& spec, const std::vector<Tensor>& ops) {
        std::vector<const Tensor*> p;
        for (const Tensor& t : ops) p.push_back(&t);
        return cl::cuda::row_kernel_source(*to_row_step(spec), p.data(), p.size());
      },
      "the CUDA source of a row step's kernel for operands of these dtypes (no GPU needed)",
      py::arg("spec"), py::arg("operands"));
  m.def("signature", &signature, "exact key of the tensors' dtypes, shapes, strides, devices");
}
