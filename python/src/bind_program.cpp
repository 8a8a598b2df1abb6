#include "ops/program.h"
#include "python/src/bindings.h"

using cl::Instr;
using cl::OutputSpec;
using cl::Program;
using cl::Tensor;

namespace {

// Runs a program on the device of its operands (GIL released on the CPU). The CUDA executor
// registers itself here when castlab's CUDA support is loaded.
std::function<void(const Program&, const std::vector<Tensor>&, const std::vector<Tensor>&)>
    g_cuda_runner;

void run_any(const Program& p, const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
  if (out.empty()) return;
  const cl::Device dev = out[0].device();
  for (const auto& t : out)
    if (t.device() != dev) throw std::invalid_argument("outputs on different devices");
  for (const auto& t : in)
    if (t.device() != dev)
      throw std::invalid_argument("expected all tensors on " + dev.str() + ", but one is on " +
                                  t.device().str());
  if (dev.type == cl::DeviceType::CPU) {
    py::gil_scoped_release nogil;
    cl::run_program_cpu(p, in, out);
    return;
  }
  if (!g_cuda_runner) throw std::runtime_error("CUDA support is not loaded");
  g_cuda_runner(p, in, out);
}

}  // namespace

namespace cl {
void run_program_any(const Program& p, const std::vector<Tensor>& in,
                     const std::vector<Tensor>& out) {
  run_any(p, in, out);
}

void set_cuda_runner(
    std::function<void(const Program&, const std::vector<Tensor>&, const std::vector<Tensor>&)> f) {
  g_cuda_runner = std::move(f);
}
}  // namespace cl

void bind_program(py::module_& m) {
  py::class_<Program, std::shared_ptr<Program>>(m, "Program")
      .def(py::init([](const std::vector<py::tuple>& code, int n_regs,
                       const std::vector<py::tuple>& outputs, uint64_t seed) {
             auto p = std::make_shared<Program>();
             for (const auto& t : code) {
               // (op, f64, var, dtype, mode, saturate, dst, a, b, c, aux, imm)
               if (t.size() != 12) throw std::invalid_argument("instruction tuple needs 12 fields");
               Instr in;
               in.op = t[0].cast<uint8_t>();
               if (in.op >= cl::kOpCount) throw std::invalid_argument("bad opcode");
               in.f64 = t[1].cast<uint8_t>();
               in.var = t[2].cast<uint8_t>();
               in.dtype = t[3].cast<uint8_t>();
               in.mode = t[4].cast<uint8_t>();
               in.saturate = t[5].cast<uint8_t>();
               in.dst = t[6].cast<int32_t>();
               in.a = t[7].cast<int32_t>();
               in.b = t[8].cast<int32_t>();
               in.c = t[9].cast<int32_t>();
               in.aux = t[10].cast<int32_t>();
               in.imm = t[11].cast<double>();
               for (int32_t r : {in.dst, in.a, in.b, in.c})
                 if (r >= n_regs) throw std::invalid_argument("register out of range");
               if (in.dst < 0) throw std::invalid_argument("negative destination register");
               p->code.push_back(in);
             }
             for (const auto& t : outputs) {
               OutputSpec o;
               o.reg = t[0].cast<int32_t>();
               o.mode = t[1].cast<uint8_t>();
               o.saturate = t[2].cast<uint8_t>();
               o.salt = t[3].cast<int32_t>();
               if (o.reg < 0 || o.reg >= n_regs)
                 throw std::invalid_argument("output register out of range");
               p->outputs.push_back(o);
             }
             p->n_regs = n_regs;
             p->seed = seed;
             return p;
           }),
           py::arg("code"), py::arg("n_regs"), py::arg("outputs"), py::arg("seed") = 0)
      .def("__str__", &Program::str)
      .def("run", &run_any, py::arg("inputs"), py::arg("outputs"));

  py::dict codes;
  for (int i = 0; i < cl::kOpCount; ++i) codes[cl::op_name(i)] = i;
  m.attr("OPCODES") = codes;
}
