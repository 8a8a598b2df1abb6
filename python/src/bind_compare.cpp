// castlab._C._compare: castlab.numerics.compare's metrics by castlab's own code
// (ops/compare.h), on the tensors' device.
#include <optional>
#include <string>

#include "ops/compare.h"
#include "ops/cuda/kernels.h"
#include "python/src/bindings.h"

namespace {

py::tuple run_compare(const std::vector<cl::Tensor>& results, const cl::Tensor* ref, double tol,
                      const std::vector<std::string>& fmts) {
  cl::CmpParams P{};
  if (results.empty() || results.size() > static_cast<size_t>(cl::kCmpMaxResults))
    throw std::invalid_argument("compare: 1 to " + std::to_string(cl::kCmpMaxResults) +
                                " results, got " + std::to_string(results.size()));
  const cl::Device dev = results[0].device();
  const int64_t n = results[0].numel();
  auto check = [&](const cl::Tensor& t, const std::string& what) {
    if (!(t.device() == dev))
      throw std::invalid_argument("compare: " + what + " is on another device");
    if (t.numel() != n) throw std::invalid_argument("compare: " + what + " has another size");
    if (!t.is_contiguous()) throw std::invalid_argument("compare: " + what + " is not contiguous");
  };
  P.nres = static_cast<int>(results.size());
  if (!fmts.empty() && fmts.size() != results.size())
    throw std::invalid_argument("compare: one format per result");
  for (int j = 0; j < P.nres; ++j) {
    check(results[j], "result " + std::to_string(j));
    P.x[j] = results[j].data_ptr();
    P.code[j] = results[j].dtype();
    P.fmt[j] = fmts.empty() ? P.code[j] : cl::dtype_from_name(fmts[j]);
  }
  P.drift = fmts.empty() ? 0 : 1;  // drift's definitions (ops/scalar/compare.h)
  if (ref) {
    check(*ref, "the reference");
    P.ref = ref->data_ptr();
    P.ref_code = ref->dtype();
  }
  P.tol = tol;
  P.n = n;
  cl::CmpTotals t;
  {
    py::gil_scoped_release nogil;
    t = dev.type == cl::DeviceType::CUDA ? cl::cuda::compare_cuda(P, dev.index)
                                         : cl::compare_cpu(P);
  }
  // named as castlab.numerics._metrics.assemble reads them (ops/scalar/compare.h layout)
  py::dict totals;
  totals["r_sq"] = t.d[cl::kCdRefSq];
  totals["r_absmax"] = t.d[cl::kCdRefAbsMax];
  if (P.drift) totals["union_mism"] = t.i[cl::cmp_union(P.nres)];
  py::list res;
  for (int j = 0; j < P.nres; ++j) {
    const double* d = &t.d[cl::kCdRef + cl::kCdPer * j];
    const int64_t* c = &t.i[cl::kCiPer * j];
    py::dict r;
    r["abs_max"] = d[cl::kCdAbsMax];
    r["abs_sum"] = d[cl::kCdAbsSum];
    r["rel_max"] = d[cl::kCdRelMax];
    r["sq_sum"] = d[cl::kCdSqSum];
    r["ue_max"] = d[cl::kCdUeMax];
    r["ue_sum"] = d[cl::kCdUeSum];
    r["apart_f"] = d[cl::kCdApart];
    r["ue_arg"] = c[cl::kCiUeArg];
    r["ok"] = c[cl::kCiOk];
    r["mism"] = c[cl::kCiMism];
    r["nan_mism"] = c[cl::kCiNanMism];
    r["apart_i"] = c[cl::kCiApart];
    r["has_nan"] = c[cl::kCiNan] != 0;
    r["not_close"] = c[cl::kCiNotClose];
    res.append(r);
  }
  return py::make_tuple(totals, res);
}

// castlab.numerics.near_ties on the reference's device: (mask, signed distances, count)
py::tuple run_near_ties(const cl::Tensor& ref, const std::string& fmt_name, double within) {
  const int fmt = cl::dtype_from_name(fmt_name);
  const int rc = ref.dtype();
  if (!cl::is_floating(static_cast<cl::DTypeCode>(rc)) ||
      !cl::is_floating(static_cast<cl::DTypeCode>(fmt)) || fmt == cl::kFloat64)
    throw std::invalid_argument("near_ties: a float reference and a format below float64");
  if (!ref.is_contiguous()) throw std::invalid_argument("near_ties: the reference is strided");
  const cl::FloatFormat ff = cl::format_of(fmt);
  const double fmax = cl::decode_magnitude(ff.max_bits, ff);
  const cl::Device dev = ref.device();
  cl::Tensor mask = cl::Tensor::empty(ref.shape(), cl::kBool, dev);
  cl::Tensor dist = cl::Tensor::empty(ref.shape(), cl::kFloat64, dev);
  const int64_t n = ref.numel();
  int64_t count = 0;
  {
    py::gil_scoped_release nogil;
    auto* mp = static_cast<uint8_t*>(mask.data_ptr());
    auto* dp = static_cast<double*>(dist.data_ptr());
    count =
        dev.type == cl::DeviceType::CUDA
            ? cl::cuda::near_ties_cuda(ref.data_ptr(), rc, n, fmt, fmax, within, mp, dp, dev.index)
            : cl::near_ties_cpu(ref.data_ptr(), rc, n, fmt, fmax, within, mp, dp);
  }
  return py::make_tuple(mask, dist, count);
}

// NearTies.mismatch_rate's counts: (mismatches inside, inside, all mismatches)
py::tuple run_tie_split(const cl::Tensor& a, const cl::Tensor& b, const cl::Tensor& mask) {
  const cl::Device dev = mask.device();
  for (const cl::Tensor* t : {&a, &b, &mask}) {
    if (!(t->device() == dev)) throw std::invalid_argument("mismatch_rate: devices differ");
    if (t->numel() != mask.numel() || !t->is_contiguous())
      throw std::invalid_argument("mismatch_rate: contiguous tensors of the mask's size");
  }
  if (mask.dtype() != cl::kBool) throw std::invalid_argument("mismatch_rate: a bool mask");
  int64_t c[3] = {0, 0, 0};
  {
    py::gil_scoped_release nogil;
    const auto* mp = static_cast<const uint8_t*>(mask.data_ptr());
    if (dev.type == cl::DeviceType::CUDA)
      cl::cuda::tie_split_cuda(a.data_ptr(), a.dtype(), b.data_ptr(), b.dtype(), mp, mask.numel(),
                               c, dev.index);
    else
      cl::tie_split_cpu(a.data_ptr(), a.dtype(), b.data_ptr(), b.dtype(), mp, mask.numel(), c);
  }
  return py::make_tuple(c[0], c[1], c[2]);
}

// contiguous operands of one size on one device (numerics.ulp_error / ulp_diff)
cl::Device same_device(const cl::Tensor& a, const cl::Tensor& b, const char* what) {
  if (!(a.device() == b.device()) || a.numel() != b.numel() || !a.is_contiguous() ||
      !b.is_contiguous())
    throw std::invalid_argument(std::string(what) +
                                ": contiguous operands of one size on one device");
  return a.device();
}

cl::Tensor run_ulp_error(const cl::Tensor& x, const cl::Tensor& r, const std::string& fmt_name) {
  const cl::Device dev = same_device(x, r, "ulp_error");
  const int fmt = cl::dtype_from_name(fmt_name);
  cl::Tensor out = cl::Tensor::empty(x.shape(), cl::kFloat64, dev);
  py::gil_scoped_release nogil;
  auto* op = static_cast<double*>(out.data_ptr());
  if (dev.type == cl::DeviceType::CUDA)
    cl::cuda::ulp_error_cuda(x.data_ptr(), x.dtype(), r.data_ptr(), r.dtype(), x.numel(), fmt, op,
                             dev.index);
  else
    cl::ulp_error_cpu(x.data_ptr(), x.dtype(), r.data_ptr(), r.dtype(), x.numel(), fmt, op);
  return out;
}

py::tuple run_ulp_diff(const cl::Tensor& a, const cl::Tensor& b) {
  const cl::Device dev = same_device(a, b, "ulp_diff");
  if (a.dtype() != b.dtype()) throw std::invalid_argument("ulp_diff: one dtype");
  cl::Tensor d = cl::Tensor::empty(a.shape(), cl::kInt64, dev);
  cl::Tensor m = cl::Tensor::empty(a.shape(), cl::kBool, dev);
  {
    py::gil_scoped_release nogil;
    auto* dp = static_cast<int64_t*>(d.data_ptr());
    auto* mp = static_cast<uint8_t*>(m.data_ptr());
    if (dev.type == cl::DeviceType::CUDA)
      cl::cuda::ulp_diff_cuda(a.data_ptr(), b.data_ptr(), a.dtype(), a.numel(), dp, mp, dev.index);
    else
      cl::ulp_diff_cpu(a.data_ptr(), b.data_ptr(), a.dtype(), a.numel(), dp, mp);
  }
  return py::make_tuple(d, m);
}

}  // namespace

void bind_compare(py::module_& m) {
  m.def("_ulp_error", &run_ulp_error,
        "numerics.ulp_error by castlab's code on the operands' device: a float64 tensor",
        py::arg("x"), py::arg("ref"), py::arg("fmt"));
  m.def("_ulp_diff", &run_ulp_diff,
        "numerics.ulp_diff by castlab's code on the operands' device: (int64 distances, bool "
        "NaN-mismatch mask)",
        py::arg("a"), py::arg("b"));
  m.def("_near_ties", &run_near_ties,
        "castlab.numerics.near_ties by castlab's code on the reference's device: (bool mask, "
        "float64 signed distances, count)",
        py::arg("ref"), py::arg("fmt"), py::arg("within"));
  m.def("_tie_split", &run_tie_split,
        "NearTies.mismatch_rate's counts (mismatches inside, inside, all mismatches) of "
        "contiguous a, b and mask of one size on one device",
        py::arg("a"), py::arg("b"), py::arg("mask"));
  m.def(
      "_compare",
      [](const std::vector<cl::Tensor>& results, std::optional<cl::Tensor> ref, double tol,
         const std::vector<std::string>& fmts) {
        return run_compare(results, ref ? &*ref : nullptr, tol, fmts);
      },
      "castlab.numerics.compare's metrics (ops/compare.h) of contiguous results of one size "
      "on one device, against the first and the reference: (reference totals, [per-result "
      "totals]) as dicts. fmts: the dtype names each result's ulps and rounding are measured "
      "in (default: its own); given, drift's definitions: results are rounded to them too, "
      "and union_mism counts the elements where some result differs from the first",
      py::arg("results"), py::arg("ref"), py::arg("tol"),
      py::arg("fmts") = std::vector<std::string>{});
  m.def(
      "_compare_cuda_source", [] { return std::string(cl::cuda::kCompareSource); },
      "the CUDA source of compare's kernels (tests compile it with NVRTC)");
  m.def(
      "_compare_tree",
      [](int64_t n) {
        const cl::CmpTree t = cl::cmp_tree(n);
        return py::make_tuple(t.leaf_lo, t.left, t.right, t.level_end);
      },
      "NumPy's pairwise tree over n elements as compare walks it: (leaf bounds, left, right, "
      "level ends)",
      py::arg("n"));
  m.attr("CMP_MAX_RESULTS") = cl::kCmpMaxResults;
}
