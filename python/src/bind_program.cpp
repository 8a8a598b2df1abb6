#include <type_traits>

#include "ops/cpu/cpu_features.h"
#include "ops/cpu/jit.h"
#include "ops/cpu/torch_vml.h"
#include "ops/program.h"
#include "ops/runtime.h"
#include "python/src/bindings.h"

using cl::Instr;
using cl::OutputSpec;
using cl::Program;
using cl::Tensor;

namespace {

// Program.run: the runtime's dispatch, with the GIL released (CPU kernels, CUDA launches
// and NVRTC compiles touch no Python object).
void run_any(const Program& p, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
  py::gil_scoped_release nogil;
  cl::run_program_any(p, in, out);
}

}  // namespace

namespace {

// Sets the named fields of an Instr or OutputSpec from keyword arguments.
template <typename S>
void set_fields_from_kwargs(S* obj, const py::kwargs& kw, const char* what) {
  for (auto item : kw) {
    const std::string k = py::str(item.first);
    bool found = false;
    cl::for_each_field(*obj, [&](const char* name, auto& field) {
      if (k != name) return;
      field = item.second.cast<typename std::decay<decltype(field)>::type>();
      found = true;
    });
    if (!found) throw py::type_error(std::string(what) + ": unknown field '" + k + "'");
  }
}

const char* category_name(cl::OpCategory c) {
  switch (c) {
    case cl::kCatInternal: return "internal";
    case cl::kCatUnaryFloat: return "unary_float";
    case cl::kCatUnarySigned: return "unary_signed";
    case cl::kCatBinary: return "binary";
    case cl::kCatCompare: return "compare";
    case cl::kCatTernary: return "ternary";
    case cl::kCatSelect: return "conditional";
  }
  return "?";
}

// The op table, the variant bits and the math/rounding constants, for Python's tables.
void bind_tables(py::module_& m) {
  // The op table, for Python's op lists (castlab._graph).
  py::list table;
  for (int i = 0; i < cl::kOpCount; ++i) {
    const cl::OpInfo& o = cl::op_info(i);
    py::dict d;
    d["name"] = o.name;
    d["aten"] = o.aten ? py::object(py::str(o.aten)) : py::object(py::none());
    d["opcode"] = i;
    d["arity"] = o.arity;
    d["category"] = category_name(o.category);
    d["factors"] = o.factors;
    d["cost"] = o.cost;
    d["public"] = o.py;
    d["formula"] = o.formula;
    d["grad"] = o.grad;
    table.append(d);
  }
  m.attr("OP_TABLE") = table;

  // The variant bits (ops/scalar/ops.h CL_VARIANT_BITS), in bit order: Python's
  // constants (castlab._optable) are built from this list; VARIANT_BITS: name -> bit.
  py::list bit_table;
  py::dict bits;
#define CL_VARIANT_DICT(E, name, bit, field, doc, trace) \
  {                                                      \
    py::dict d;                                          \
    d["name"] = name;                                    \
    d["bit"] = static_cast<uint32_t>(cl::kVar##E);       \
    d["math_field"] = field;                             \
    d["doc"] = doc;                                      \
    d["trace"] = trace;                                  \
    bit_table.append(d);                                 \
    bits[name] = static_cast<uint32_t>(cl::kVar##E);     \
  }
  CL_VARIANT_BITS(CL_VARIANT_DICT)
#undef CL_VARIANT_DICT
  m.attr("VARIANT_BIT_TABLE") = bit_table;
  m.attr("VARIANT_BITS") = bits;
  py::dict impls;
  impls["portable"] = static_cast<int>(cl::kPortable);
  impls["libm"] = static_cast<int>(cl::kLibm);
  impls["fast"] = static_cast<int>(cl::kFast);
  impls["torch_cpu"] = static_cast<int>(cl::kTorchCpu);
  m.attr("MATH_IMPLS") = impls;
  py::dict modes;
  modes["nearest"] = static_cast<int>(cl::kNearestEven);
  modes["toward_zero"] = static_cast<int>(cl::kTowardZero);
  modes["stochastic"] = static_cast<int>(cl::kStochastic);
  m.attr("ROUND_MODES") = modes;
}

// The CPU side: functions borrowed from the loaded torch, CPU features, generated sources.
void bind_cpu(py::module_& m) {
  m.def("torch_vml_load", &cl::torch_vml_load, py::arg("path"),
        "Borrow MKL VML's vms*/vmd* functions from the already-loaded library at path "
        "(libtorch_cpu.so); returns '' on success, else why not. Never loads the library.");
  m.def("torch_vml_loaded", &cl::torch_vml_loaded, "Are MKL VML's functions borrowed?");
  m.def("cpu_has", &cl::cpu_has, py::arg("feature"),
        "Does this CPU have the x86 feature (GCC's __builtin_cpu_supports name)?");
  m.def(
      "_cpu_codegen",
      [](int mode, int64_t min_elements) {
        const cl::CpuJitStatus st = cl::cpu_jit_configure(mode, min_elements);
        static const char* names[] = {"off", "async", "sync"};
        py::dict d;
        d["mode"] = names[static_cast<int>(st.mode)];
        d["min_elements"] = st.min_elements;
        d["compiler"] = st.compiler;
        d["why_not"] = st.why_not;
        d["last_error"] = st.last_error;
        d["compiled"] = st.compiled;
        d["disk_hits"] = st.disk_hits;
        d["failures"] = st.failures;
        d["pending"] = st.pending;
        d["runs"] = st.runs;
        d["compile_seconds"] = st.compile_seconds;
        return d;
      },
      py::arg("mode") = -1, py::arg("min_elements") = -1,
      "Configure the CPU code generator (mode 0 off, 1 async, 2 sync; -1 unchanged) and "
      "return its status (castlab.cpu_codegen)");
  m.def(
      "_cpu_codegen_wait",
      [] {
        py::gil_scoped_release nogil;
        cl::cpu_jit_wait();
      },
      "Wait until no CPU kernel is queued or compiling");
  m.def(
      "_cpu_codegen_source",
      [](const Program& p, const std::vector<int>& dtypes, const std::vector<int64_t>& strides) {
        std::vector<uint8_t> d(dtypes.begin(), dtypes.end());
        if (d.size() != strides.size() || d.size() < p.outputs.size())
          throw py::value_error("one dtype and one inner stride per operand, outputs first");
        if (!cl::cpu_jit_supports(p, d)) return std::string();
        return cl::cpu_jit_source(p, d, strides);
      },
      py::arg("program"), py::arg("dtypes"), py::arg("inner_strides"),
      "The generated CPU kernel's source for these operands ('' when the program cannot be "
      "generated)");
  m.def("torch_num_threads", &cl::torch_num_threads,
        "at::get_num_threads() of the loaded torch (0 when not borrowed)");
}

}  // namespace

void bind_program(py::module_& m) {
  py::class_<Instr> instr(m, "Instr", "One instruction of a Program (fields as in ops/program.h).");
  instr
      .def(py::init([](const py::kwargs& kw) {
        Instr in;
        set_fields_from_kwargs(&in, kw, "Instr");
        return in;
      }))
      .def("__repr__", [](const Instr& in) {
        std::string r;
        cl::for_each_field(in, [&r](const char* name, const auto& v) {
          r += std::string(r.empty() ? "Instr(" : ", ") + name + "=";
          if (std::is_floating_point<typename std::decay<decltype(v)>::type>::value)
            r += std::string(py::str(py::float_(static_cast<double>(v))));
          else
            r += std::to_string(static_cast<long long>(v));
        });
        return r + ")";
      });
#define CL_BIND_FIELD(f, doc) instr.def_readwrite(#f, &Instr::f, doc);
  CL_INSTR_FIELDS(CL_BIND_FIELD)
#undef CL_BIND_FIELD

  py::class_<OutputSpec> outspec(m, "OutputSpec", "How a Program stores one output.");
  outspec.def(py::init([](const py::kwargs& kw) {
    OutputSpec o;
    set_fields_from_kwargs(&o, kw, "OutputSpec");
    return o;
  }));
#define CL_BIND_FIELD(f, doc) outspec.def_readwrite(#f, &OutputSpec::f, doc);
  CL_OUTPUT_FIELDS(CL_BIND_FIELD)
#undef CL_BIND_FIELD

  py::class_<Program, std::shared_ptr<Program>>(m, "Program")
      .def(py::init([](const std::vector<Instr>& code, int n_regs,
                       const std::vector<OutputSpec>& outputs, uint64_t seed) {
             auto p = std::make_shared<Program>();
             p->code = code;
             p->n_regs = n_regs;
             p->outputs = outputs;
             p->seed = seed;
             p->validate();
             return p;
           }),
           py::arg("code"), py::arg("n_regs"), py::arg("outputs"), py::arg("seed") = 0)
      .def_property_readonly("code", [](const Program& p) { return p.code; })
      .def_property_readonly("outputs", [](const Program& p) { return p.outputs; })
      .def_property_readonly("n_regs", [](const Program& p) { return p.n_regs; })
      .def_property_readonly("seed", [](const Program& p) { return p.seed; })
      .def("__str__", &Program::str)
      .def("run", &run_any, py::arg("inputs"), py::arg("outputs"));

  bind_tables(m);
  bind_cpu(m);
}
