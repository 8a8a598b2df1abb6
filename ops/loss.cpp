#include "ops/loss.h"

#include <stdexcept>
#include <vector>

#include "ops/backend.h"

namespace cl {

namespace {

void check(const NllPlan& P, const Tensor& x, const Tensor& w, const Tensor& t, const Tensor& out) {
  if (P.order != kNllTorchCpu && P.order != kNllTorchCuda)
    throw std::invalid_argument("nll step: unknown order " + std::to_string(P.order));
  if (P.reduction != kNllSum && P.reduction != kNllMean)
    throw std::invalid_argument("nll step: reduction must be sum or mean");
  const DTypeCode acc = x.dtype();
  if (acc != kFloat32 && acc != kFloat64)
    throw std::invalid_argument("nll step: the values must be float32 or float64");
  if ((acc == kFloat64) != (P.fmt == kFloat64))
    throw std::invalid_argument("nll step: float64 values go with a float64 format only");
  if (t.dtype() != kInt64) throw std::invalid_argument("nll step: int64 targets");
  if (out.dtype() != acc || out.numel() != 2 || !out.is_contiguous())
    throw std::invalid_argument("nll step: the result is 2 contiguous values of the values' dtype");
  const int64_t n = t.numel();
  if (x.numel() != n || !x.is_contiguous() || !t.is_contiguous() ||
      (P.has_w && (w.numel() != n || w.dtype() != acc || !w.is_contiguous())))
    throw std::invalid_argument("nll step: values, weights and targets of one length, contiguous");
  if (x.device() != t.device() || out.device() != t.device() ||
      (P.has_w && w.device() != t.device()))
    throw std::invalid_argument("nll step: operands on different devices");
}

template <typename A>
void nll_cpu_run(const NllPlan& P, const Tensor& x, const Tensor& w, const Tensor& t,
                 const Tensor& out) {
  const A* xp = static_cast<const A*>(x.data_ptr());
  const A* wp = P.has_w ? static_cast<const A*>(w.data_ptr()) : xp;
  const int64_t* tp = static_cast<const int64_t*>(t.data_ptr());
  A* op = static_cast<A*>(out.data_ptr());
  if (P.order == kNllTorchCpu) {
    nll_cpu<A>(P, xp, wp, tp, op);
    return;
  }
  std::vector<A> sh(static_cast<size_t>(P.threads)), aw(static_cast<size_t>(P.threads));
  for (int64_t k = 0; k < P.threads; ++k) nll_cuda_thread<A>(P, xp, wp, tp, k, &sh[k], &aw[k]);
  nll_cuda_combine<A>(P, sh.data(), aw.data(), op);
}

}  // namespace

void run_nll(const NllPlan& plan, const Tensor& x, const Tensor& w, const Tensor& t,
             const Tensor& out) {
  NllPlan P = plan;
  P.n = t.numel();
  P.threads = nll_cuda_threads(P.n);
  check(P, x, w, t, out);
  if (t.device().type != DeviceType::CPU) {
    device_backend(t.device().type).nll(P, x, w, t, out);
    return;
  }
  if (x.dtype() == kFloat64)
    nll_cpu_run<double>(P, x, w, t, out);
  else
    nll_cpu_run<float>(P, x, w, t, out);
}

}  // namespace cl
