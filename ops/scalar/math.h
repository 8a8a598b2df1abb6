// Transcendental functions, by implementation variant.
//   kPortable: castlab's own functions (ops/scalar/math_portable.h), built only from IEEE
//              add/mul/div/sqrt and explicit fma: the same bits on every device.
//   kLibm:     the platform's precise functions: the C library on the CPU, CUDA's precise
//              expf/logf/... on the GPU (what PyTorch eager's CUDA kernels call).
//   kFast:     CUDA's intrinsics (__expf, ...), GPU only; on the CPU it means kLibm.
//   kTorchCpu: the functions PyTorch's CPU vector kernels call (SLEEF's, and ATen's own erf
//              polynomial; ops/scalar/math_torch_cpu.h), CPU only. Where PyTorch calls MKL
//              instead (fp64 sin/cos), the portable functions stand in.
#pragma once
#include "core/cl_defs.h"
#include "ops/scalar/math_portable.h"
#if !defined(__CUDACC__)
#include "ops/scalar/math_onednn.h"
#include "ops/scalar/math_torch_cpu.h"
#define CL_TORCH_CPU(call) \
  if (impl == kTorchCpu) return torch_cpu::call
#else
#define CL_TORCH_CPU(call)
#endif

namespace cl {

enum MathImpl : uint8_t { kPortable = 0, kLibm = 1, kFast = 2, kTorchCpu = 3 };

#if defined(__CUDA_ARCH__)
#define CL_LIBM_F(name, fast) (impl == kFast ? fast(x) : name##f(x))
#define CL_LIBM_D(name) name(x)
#else
#define CL_LIBM_F(name, fast) std::name(x)
#define CL_LIBM_D(name) std::name(x)
#endif

CL_HD float m_exp(float x, int impl) {
  CL_TORCH_CPU(expf_u10(x));
  if (impl == kPortable) return portable::expf_(x);
  return CL_LIBM_F(exp, __expf);
}
CL_HD double m_exp(double x, int impl) {
  CL_TORCH_CPU(exp_u10(x));
  if (impl == kPortable) return portable::exp_(x);
  return CL_LIBM_D(exp);
}
CL_HD float m_log(float x, int impl) {
  CL_TORCH_CPU(logf_u10(x));
  if (impl == kPortable) return portable::logf_(x);
  return CL_LIBM_F(log, __logf);
}
CL_HD double m_log(double x, int impl) {
  CL_TORCH_CPU(log_u10(x));
  if (impl == kPortable) return portable::log_(x);
  return CL_LIBM_D(log);
}
CL_HD float m_sin(float x, int impl) {
  CL_TORCH_CPU(sinf_u35(x));
  if (impl == kPortable) return portable::sinf_(x);
  return CL_LIBM_F(sin, __sinf);
}
CL_HD double m_sin(double x, int impl) {
  if (impl == kPortable || impl == kTorchCpu) return portable::sin_(x);
  return CL_LIBM_D(sin);
}
CL_HD float m_cos(float x, int impl) {
  CL_TORCH_CPU(cosf_u35(x));
  if (impl == kPortable) return portable::cosf_(x);
  return CL_LIBM_F(cos, __cosf);
}
CL_HD double m_cos(double x, int impl) {
  if (impl == kPortable || impl == kTorchCpu) return portable::cos_(x);
  return CL_LIBM_D(cos);
}
CL_HD float m_tanh(float x, int impl) {
  CL_TORCH_CPU(tanhf_u10(x));
  if (impl == kPortable) return portable::tanhf_(x);
  return CL_LIBM_F(tanh, tanhf);
}
CL_HD double m_tanh(double x, int impl) {
  CL_TORCH_CPU(tanh_u10(x));
  if (impl == kPortable) return portable::tanh_(x);
  return CL_LIBM_D(tanh);
}
CL_HD float m_erf(float x, int impl) {
  CL_TORCH_CPU(erff_as(x));
  if (impl == kPortable) return portable::erff_(x);
  return CL_LIBM_F(erf, erff);
}
CL_HD double m_erf(double x, int impl) {
  CL_TORCH_CPU(erf_u10(x));
  if (impl == kPortable) return portable::erf_(x);
  return CL_LIBM_D(erf);
}

#undef CL_LIBM_F
#undef CL_LIBM_D
#undef CL_TORCH_CPU

}  // namespace cl
