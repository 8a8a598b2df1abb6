// castlab._C._exhaustive_cpu: binds ops/exhaustive.h (castlab.numerics.exhaustive's CPU
// driver). The statistics come back as plain Python lists and dicts.
#include "ops/cuda/kernels.h"
#include "ops/exhaustive.h"
#include "python/src/bindings.h"

namespace {

using InputSpec = std::tuple<std::string, uint64_t, uint64_t, std::vector<uint64_t>>;

py::dict result_dict(const cl::ExhaustiveResult& r) {
  py::dict d;
  d["n"] = r.n;
  d["ties"] = r.ties;
  d["near_ties"] = r.near_ties;
  py::list configs;
  for (const cl::ConfigStats& s : r.configs) {
    py::dict c;
    c["counts"] = std::vector<uint64_t>(s.count, s.count + cl::kExCategories);
    c["hist"] = std::vector<uint64_t>(s.hist, s.hist + cl::kExHistBins);
    c["max_error"] = s.max_error;
    c["max_index"] = s.max_index;
    configs.append(c);
  }
  d["configs"] = configs;
  py::list pairs;
  for (const cl::PairStats& p : r.pairs) {
    py::dict c;
    c["differ"] = p.differ;
    c["differ_at_ties"] = p.differ_at_ties;
    c["max_tie_distance"] = p.max_tie_distance;
    c["first"] = p.first;
    pairs.append(c);
  }
  d["pairs"] = pairs;
  return d;
}

cl::ExhaustiveSpec make_spec(const std::vector<InputSpec>& inputs, const std::string& out_dtype,
                             uint64_t begin, uint64_t end, int first_k, int64_t chunk) {
  cl::ExhaustiveSpec spec;
  for (const auto& in : inputs) {
    cl::Enumeration e;
    e.dtype = cl::dtype_from_name(std::get<0>(in));
    e.lo = std::get<1>(in);
    e.count = std::get<2>(in);
    e.table = std::get<3>(in);
    spec.inputs.push_back(std::move(e));
  }
  spec.out_dtype = cl::dtype_from_name(out_dtype);
  spec.begin = begin;
  spec.end = end;
  spec.first_k = first_k;
  spec.chunk = chunk;
  return spec;
}

std::vector<cl::ExChain> chains(const std::vector<std::shared_ptr<cl::Plan>>& configs, int nin) {
  if (configs.empty()) throw std::invalid_argument("exhaustive: no configuration");
  if (configs.size() > 16) throw std::invalid_argument("exhaustive: at most 16 configurations");
  std::vector<cl::ExChain> out;
  for (const auto& p : configs) out.push_back(cl::exhaustive_chain(*p, nin));
  return out;
}

}  // namespace

void bind_exhaustive(py::module_& m) {
  m.def(
      "_exhaustive_cpu",
      [](const std::vector<InputSpec>& inputs, const std::string& out_dtype, uint64_t begin,
         uint64_t end, int first_k, int64_t chunk,
         const std::vector<std::shared_ptr<cl::Plan>>& configs, const cl::Plan& ref) {
        const cl::ExhaustiveSpec spec = make_spec(inputs, out_dtype, begin, end, first_k, chunk);
        cl::ExhaustiveResult r;
        {
          py::gil_scoped_release nogil;
          r = cl::exhaustive_cpu(spec, configs, ref);
        }
        return result_dict(r);
      },
      "castlab.numerics.exhaustive's CPU driver (ops/exhaustive.h): inputs as (dtype, lo, "
      "count, table) per enumeration; one Plan per configuration and the fp64 reference Plan",
      py::arg("inputs"), py::arg("out_dtype"), py::arg("begin"), py::arg("end"), py::arg("first_k"),
      py::arg("chunk"), py::arg("configs"), py::arg("ref"));
  m.def(
      "_exhaustive_cuda",
      [](const std::vector<InputSpec>& inputs, const std::string& out_dtype, uint64_t begin,
         uint64_t end, int first_k, const std::vector<std::shared_ptr<cl::Plan>>& configs,
         const cl::Plan& ref, int device) {
        const cl::ExhaustiveSpec spec = make_spec(inputs, out_dtype, begin, end, first_k, 1);
        const int nin = static_cast<int>(spec.inputs.size());
        const auto cfgs = chains(configs, nin);
        const cl::ExChain rc = cl::exhaustive_chain(ref, nin);
        cl::ExhaustiveResult r;
        {
          py::gil_scoped_release nogil;
          r = cl::cuda::exhaustive_cuda(spec, cfgs, rc, device);
        }
        return result_dict(r);
      },
      "castlab.numerics.exhaustive's GPU driver (ops/cuda/exhaustive.cpp): one generated "
      "kernel; the Plans' Programs are embedded in it",
      py::arg("inputs"), py::arg("out_dtype"), py::arg("begin"), py::arg("end"), py::arg("first_k"),
      py::arg("configs"), py::arg("ref"), py::arg("device"));
  m.def(
      "_exhaustive_cuda_source",
      [](const std::vector<InputSpec>& inputs, const std::string& out_dtype, int first_k,
         const std::vector<std::shared_ptr<cl::Plan>>& configs, const cl::Plan& ref) {
        const cl::ExhaustiveSpec spec = make_spec(inputs, out_dtype, 0, 0, first_k, 1);
        const int nin = static_cast<int>(spec.inputs.size());
        return cl::cuda::exhaustive_kernel_source(spec, chains(configs, nin),
                                                  cl::exhaustive_chain(ref, nin), "cl_exhaustive");
      },
      "the CUDA source of the exhaustive kernel (no GPU needed; tests compile it with NVRTC)",
      py::arg("inputs"), py::arg("out_dtype"), py::arg("first_k"), py::arg("configs"),
      py::arg("ref"));
  m.def(
      "_exhaustive_cuda_tables",
      [](const std::vector<InputSpec>& inputs) {
        const cl::cuda::ExTables t =
            cl::cuda::exhaustive_tables(make_spec(inputs, "bfloat16", 0, 0, 0, 1).inputs);
        return py::make_tuple(t.words, t.offset);
      },
      "(words, offsets): the table inputs' patterns as the GPU kernel receives them, and where "
      "each input's start",
      py::arg("inputs"));
  m.attr("EX_HIST_LO") = cl::kExHistLo;
  m.attr("EX_HIST_BINS") = cl::kExHistBins;
}
