// Accuracy test for ops/scalar/math_portable.h (castlab's portable transcendental functions).
// Build/run: see tests/cpp/README.md.  Exits nonzero if a bound is violated.
//   * expf_: exhaustive over every float whose e^x is a finite normal float (2 threads),
//     bound 1 ulp; subnormal results checked too (bound 1 ulp of 2^-149).
//   * other float functions: all 65,536 bfloat16 bit patterns (as float) + 10M random
//     floats (half uniform in the interesting range, half random bit patterns), bound 2 ulp
//     (sinf_/cosf_: 1 ulp, over every finite float, i.e. including the Payne-Hanek range
//     |x| >= 2^50, which the random bit patterns hit ~30% of the time).
//   * double functions: 1M random inputs each against the long double (x87) libm, bound 2 ulp
//     (sin_/cos_ also: 1M inputs with 2^31 <= |x| <= DBL_MAX (Payne-Hanek range, exponent
//     uniform) and 200k next to multiples of pi/2 up to k = 2^62).
//   * special values (NaN/Inf/zeros/saturation/subnormals) and |sin|,|cos| <= 1 everywhere.
// References: float functions against the double-precision std:: function of the same
// argument (its error, ~2^-53 relative, is negligible next to a float ulp), double functions
// against long double.  Errors are |got - ref| in ulps of the result's binade (subnormal
// range: ulps of the smallest subnormal).  "CR" = equal to the reference rounded to the
// format, i.e. correctly rounded (up to reference ties, which are far rarer than 1e-6).
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "ops/scalar/math_portable.h"

namespace {

int g_fail = 0;

double ulp_f(double ref) {  // ulp of float at |ref| (binade of the exact value)
  double a = std::fabs(ref);
  if (a < 0x1p-126) return 0x1p-149;
  int e;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  return std::ldexp(1.0, e - 24);
}
long double ulp_d(long double ref) {
  long double a = std::fabs(ref);
  if (a < 0x1p-1022L) return 0x1p-1074L;
  int e;
  std::frexp(a, &e);
  return std::ldexp(1.0L, e - 53);
}

struct Stats {
  const char* name;
  double bound;
  uint64_t n = 0, cr = 0, le1 = 0, le2 = 0, worse = 0;
  double max_err = 0;
  double worst_x = 0;
  uint64_t bad_bounded = 0;  // sin/cos outside [-1,1] or non-finite for finite x
  void add(double err, bool is_cr, double x) {
    ++n;
    if (is_cr)
      ++cr;
    else if (err <= 1.0)
      ++le1;
    else if (err <= 2.0)
      ++le2;
    else
      ++worse;
    if (err > max_err || std::isnan(err)) {
      max_err = std::isnan(err) ? INFINITY : err;
      worst_x = x;
    }
  }
  void merge(const Stats& o) {
    n += o.n;
    cr += o.cr;
    le1 += o.le1;
    le2 += o.le2;
    worse += o.worse;
    bad_bounded += o.bad_bounded;
    if (o.max_err > max_err) {
      max_err = o.max_err;
      worst_x = o.worst_x;
    }
  }
  void report() {
    bool ok = max_err <= bound && bad_bounded == 0;
    std::printf("%-28s n=%11" PRIu64 "  CR %9.5f%%  (0.5,1] %9.5f%%  (1,2] %8.5f%%  >2 %" PRIu64
                "  max %.4f ulp (x=%.9g)%s  %s\n",
                name, n, 100.0 * cr / n, 100.0 * le1 / n, 100.0 * le2 / n, worse, max_err, worst_x,
                bad_bounded ? "  OUT-OF-RANGE VALUES" : "", ok ? "ok" : "FAIL");
    if (!ok) g_fail = 1;
  }
};

float f_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t f_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
uint64_t d_bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}
double d_from_bits(uint64_t u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}

// ---- exhaustive expf_ ---------------------------------------------------------------
void exp_range(uint32_t lo, uint32_t hi, Stats* normal, Stats* subn) {
  for (uint64_t b = lo; b <= hi; ++b) {
    float x = f_from_bits((uint32_t)b);
    double ref = std::exp((double)x);
    if (ref > 0x1.fffffep127) continue;
    float got = cl::portable::expf_(x);
    double err = std::fabs((double)got - ref) / ulp_f(ref);
    bool cr = got == (float)ref;
    if (ref >= 0x1p-126)
      normal->add(err, cr, x);
    else
      subn->add(err, cr, x);
  }
}

void check_expf_exhaustive() {
  // Positive x: bits 0x00000000 .. 0x42b17218 (88.72...), negative x: -0 .. -104.
  Stats n1{"expf_ exhaustive (normal)", 1.0}, s1{"expf_ exhaustive (subnormal)", 1.0};
  Stats n2 = n1, s2 = s1;
  const uint32_t pos_hi = 0x42b17218u, neg_hi = f_bits(-104.0f);
  std::thread t([&] { exp_range(0x00000000u, pos_hi, &n1, &s1); });
  exp_range(0x80000000u, neg_hi, &n2, &s2);
  t.join();
  n1.merge(n2);
  s1.merge(s2);
  n1.report();
  s1.report();
}

// ---- sampled float checks ---------------------------------------------------------
template <typename FP, typename FR>
void check_float(const char* name, FP fp, FR fr, double lo, double hi, double bound,
                 double bits_abs_max, bool bounded_check) {
  Stats st{name, bound};
  auto one = [&](float x) {
    if (!(std::fabs(x) < bits_abs_max)) {  // outside the accurate domain: only boundedness
      if (bounded_check && std::isfinite(x)) {
        float g = fp(x);
        if (!(std::fabs(g) <= 1.0f)) ++st.bad_bounded;
      }
      return;
    }
    float got = fp(x);
    double ref = fr((double)x);
    if (std::isnan(ref)) {
      if (!std::isnan(got)) st.add(INFINITY, false, x);
      return;
    }
    if (std::isinf(ref)) {
      st.add(got == (float)ref ? 0.0 : INFINITY, got == (float)ref, x);
      return;
    }
    float rr = (float)ref;
    double err = std::isinf(rr) ? (std::isinf(got) && (got > 0) == (ref > 0) ? 0.0 : INFINITY)
                                : std::fabs((double)got - ref) / ulp_f(ref);
    st.add(err, got == rr, x);
    if (bounded_check && !(std::fabs(got) <= 1.0f)) ++st.bad_bounded;
  };
  for (uint32_t b = 0; b < 65536; ++b) one(f_from_bits(b << 16));
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> U(lo, hi);
  for (int i = 0; i < 5000000; ++i) one((float)U(rng));
  for (int i = 0; i < 5000000; ++i) one(f_from_bits((uint32_t)rng()));
  st.report();
}

// ---- sampled double checks --------------------------------------------------------
template <typename FP, typename FR, typename GEN>
void check_double(const char* name, FP fp, FR fr, GEN gen, int n, double bound) {
  Stats st{name, bound};
  std::mt19937_64 rng(777);
  for (int i = 0; i < n; ++i) {
    double x = gen(rng);
    double got = fp(x);
    long double ref = fr((long double)x);
    if (std::isnan(ref)) {
      if (!std::isnan(got)) st.add(INFINITY, false, x);
      continue;
    }
    double rr = (double)ref;
    double err;
    if (std::isinf(rr))
      err = (got == rr) ? 0.0 : INFINITY;
    else
      err = (double)(std::fabs((long double)got - ref) / ulp_d(ref));
    st.add(err, got == rr, x);
  }
  st.report();
}

// ---- special values ---------------------------------------------------------------
void expect_bits_f(const char* what, float got, float want) {
  if (f_bits(got) != f_bits(want)) {
    std::printf("SPECIAL FAIL %s: got %a (0x%08x) want %a (0x%08x)\n", what, got, f_bits(got), want,
                f_bits(want));
    g_fail = 1;
  }
}
void expect_bits_d(const char* what, double got, double want) {
  if (d_bits(got) != d_bits(want)) {
    std::printf("SPECIAL FAIL %s: got %a want %a\n", what, got, want);
    g_fail = 1;
  }
}

void check_specials() {
  using namespace cl::portable;
  const float inf = INFINITY, nanf = f_from_bits(0x7fc00000u), mnan = f_from_bits(0xffc12345u);
  const double dinf = INFINITY, nand = d_from_bits(0x7ff8000000000000ull),
               mnand = d_from_bits(0xfff8000000012345ull);
  const float dmin = f_from_bits(1);
  for (float n : {nanf, mnan}) {
    expect_bits_f("expf(nan)", expf_(n), nanf);
    expect_bits_f("logf(nan)", logf_(n), nanf);
    expect_bits_f("sinf(nan)", sinf_(n), nanf);
    expect_bits_f("cosf(nan)", cosf_(n), nanf);
    expect_bits_f("tanhf(nan)", tanhf_(n), nanf);
    expect_bits_f("erff(nan)", erff_(n), nanf);
  }
  for (double n : {nand, mnand}) {
    expect_bits_d("exp(nan)", exp_(n), nand);
    expect_bits_d("log(nan)", log_(n), nand);
    expect_bits_d("sin(nan)", sin_(n), nand);
    expect_bits_d("cos(nan)", cos_(n), nand);
    expect_bits_d("tanh(nan)", tanh_(n), nand);
    expect_bits_d("erf(nan)", erf_(n), nand);
  }
  expect_bits_f("expf(inf)", expf_(inf), inf);
  expect_bits_f("expf(-inf)", expf_(-inf), 0.0f);
  expect_bits_f("expf(89)", expf_(89.0f), inf);
  expect_bits_f("expf(1e30)", expf_(1e30f), inf);
  expect_bits_f("expf(-1e30)", expf_(-1e30f), 0.0f);
  expect_bits_f("expf(-103.5)", expf_(-103.5f), dmin);
  expect_bits_f("expf(-103.9)", expf_(-103.9f), dmin);  // > 2^-150
  expect_bits_f("expf(-104)", expf_(-104.0f), 0.0f);    // < 2^-150
  expect_bits_f("expf(-103.2)", expf_(-103.2f), dmin);  // e^-103.2 ~ 1.6e-45 -> 2^-149
  expect_bits_f("expf(0)", expf_(0.0f), 1.0f);
  expect_bits_f("expf(-0)", expf_(-0.0f), 1.0f);
  expect_bits_f("expf(dmin)", expf_(dmin), 1.0f);
  expect_bits_d("exp(inf)", exp_(dinf), dinf);
  expect_bits_d("exp(-inf)", exp_(-dinf), 0.0);
  expect_bits_d("exp(710)", exp_(710.0), dinf);
  expect_bits_d("exp(1e300)", exp_(1e300), dinf);
  expect_bits_d("exp(-1e300)", exp_(-1e300), 0.0);
  expect_bits_d("exp(-745.2)", exp_(-745.2), 0.0);
  expect_bits_d("exp(-745.1)", exp_(-745.1), d_from_bits(1));
  expect_bits_d("exp(0)", exp_(0.0), 1.0);
  expect_bits_d("exp(709.78)", exp_(709.78), (double)std::exp((long double)709.78));
  expect_bits_f("logf(0)", logf_(0.0f), -inf);
  expect_bits_f("logf(-0)", logf_(-0.0f), -inf);
  expect_bits_f("logf(-1)", logf_(-1.0f), nanf);
  expect_bits_f("logf(-inf)", logf_(-inf), nanf);
  expect_bits_f("logf(inf)", logf_(inf), inf);
  expect_bits_f("logf(1)", logf_(1.0f), 0.0f);
  expect_bits_f("logf(dmin)", logf_(dmin), (float)std::log((double)dmin));
  expect_bits_d("log(0)", log_(0.0), -dinf);
  expect_bits_d("log(-0)", log_(-0.0), -dinf);
  expect_bits_d("log(-1)", log_(-1.0), nand);
  expect_bits_d("log(-dmin)", log_(-d_from_bits(1)), nand);
  expect_bits_d("log(inf)", log_(dinf), dinf);
  expect_bits_d("log(1)", log_(1.0), 0.0);
  expect_bits_d("log(dmin)", log_(d_from_bits(1)), (double)std::log((long double)d_from_bits(1)));
  expect_bits_f("sinf(inf)", sinf_(inf), nanf);
  expect_bits_f("sinf(-inf)", sinf_(-inf), nanf);
  expect_bits_f("cosf(inf)", cosf_(inf), nanf);
  expect_bits_f("sinf(-0)", sinf_(-0.0f), -0.0f);
  expect_bits_f("sinf(0)", sinf_(0.0f), 0.0f);
  expect_bits_f("sinf(-dmin)", sinf_(-dmin), -dmin);
  expect_bits_f("cosf(-0)", cosf_(-0.0f), 1.0f);
  expect_bits_d("sin(inf)", sin_(dinf), nand);
  expect_bits_d("cos(-inf)", cos_(-dinf), nand);
  expect_bits_d("sin(-0)", sin_(-0.0), -0.0);
  expect_bits_d("sin(-dmin)", sin_(-d_from_bits(1)), -d_from_bits(1));
  expect_bits_d("cos(0)", cos_(0.0), 1.0);
  expect_bits_f("tanhf(-0)", tanhf_(-0.0f), -0.0f);
  expect_bits_f("tanhf(0)", tanhf_(0.0f), 0.0f);
  expect_bits_f("tanhf(-dmin)", tanhf_(-dmin), -dmin);
  expect_bits_f("tanhf(inf)", tanhf_(inf), 1.0f);
  expect_bits_f("tanhf(-inf)", tanhf_(-inf), -1.0f);
  expect_bits_f("tanhf(-20)", tanhf_(-20.0f), -1.0f);
  expect_bits_d("tanh(-0)", tanh_(-0.0), -0.0);
  expect_bits_d("tanh(-dmin)", tanh_(-d_from_bits(1)), -d_from_bits(1));
  expect_bits_d("tanh(inf)", tanh_(dinf), 1.0);
  expect_bits_d("tanh(-inf)", tanh_(-dinf), -1.0);
  expect_bits_d("tanh(-30)", tanh_(-30.0), -1.0);
  expect_bits_f("erff(-0)", erff_(-0.0f), -0.0f);
  expect_bits_f("erff(-dmin)", erff_(-dmin), (float)std::erf(-(double)dmin));
  expect_bits_f("erff(inf)", erff_(inf), 1.0f);
  expect_bits_f("erff(-inf)", erff_(-inf), -1.0f);
  expect_bits_f("erff(-5)", erff_(-5.0f), -1.0f);
  expect_bits_d("erf(-0)", erf_(-0.0), -0.0);
  expect_bits_d("erf(inf)", erf_(dinf), 1.0);
  expect_bits_d("erf(-inf)", erf_(-dinf), -1.0);
  expect_bits_d("erf(-7)", erf_(-7.0), -1.0);
  // Payne-Hanek range: worst cases of the reduction (x closest to a multiple of pi/2) of
  // float (16367173*2^72) and double (6381956970095103*2^797), and sin(1e22); expected
  // values from mpmath (1400 bits).
  expect_bits_f("sinf(16367173*2^72)", sinf_(16367173.0f * 0x1p72f), 1.0f);
  expect_bits_f("cosf(16367173*2^72)", cosf_(16367173.0f * 0x1p72f), -0x1.bbdd52p-30f);
  expect_bits_f("cosf(-16367173*2^72)", cosf_(-16367173.0f * 0x1p72f), -0x1.bbdd52p-30f);
  expect_bits_d("sin(6381956970095103*2^797)", sin_(6381956970095103.0 * 0x1p797), 1.0);
  expect_bits_d("cos(6381956970095103*2^797)", cos_(6381956970095103.0 * 0x1p797),
                -0x1.14ae72e6ba22fp-61);
  expect_bits_d("sin(-1e22)", sin_(-1e22), 0x1.b453ab76bf397p-1);
  // sin/cos must stay finite and in [-1, 1] for every finite argument.
  for (float x : {0x1p50f, 1e20f, -3.4e38f, 3.4028235e38f, 16367173.0f * 0x1p72f}) {
    float s = sinf_(x), c = cosf_(x);
    if (!(std::fabs(s) <= 1.0f && std::fabs(c) <= 1.0f)) {
      std::printf("SPECIAL FAIL sinf/cosf(%g) = %g %g\n", x, s, c);
      g_fail = 1;
    }
  }
  for (double x : {0x1p50, 1e20, -1e300, 1.7976931348623157e308, 6381956970095103.0 * 0x1p797}) {
    double s = sin_(x), c = cos_(x);
    if (!(std::fabs(s) <= 1.0 && std::fabs(c) <= 1.0)) {
      std::printf("SPECIAL FAIL sin/cos(%g) = %g %g\n", x, s, c);
      g_fail = 1;
    }
  }
  std::printf("special values: %s\n", g_fail ? "FAIL" : "ok");
}

}  // namespace

#if defined(__CUDACC__)
// ---- GPU bit-identity check (only when this file is compiled by nvcc -x cu) -----------
// Evaluates every function on the GPU and on the CPU for the same inputs and counts
// results whose bits differ.  Build: see tests/cpp/README.md.
__global__ void gpu_eval_f(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  using namespace cl::portable;
  float a = x[i];
  y[6 * i + 0] = expf_(a);
  y[6 * i + 1] = logf_(a);
  y[6 * i + 2] = sinf_(a);
  y[6 * i + 3] = cosf_(a);
  y[6 * i + 4] = tanhf_(a);
  y[6 * i + 5] = erff_(a);
}
__global__ void gpu_eval_d(const double* x, double* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  using namespace cl::portable;
  double a = x[i];
  y[6 * i + 0] = exp_(a);
  y[6 * i + 1] = log_(a);
  y[6 * i + 2] = sin_(a);
  y[6 * i + 3] = cos_(a);
  y[6 * i + 4] = tanh_(a);
  y[6 * i + 5] = erf_(a);
}
int gpu_bit_check() {
  using namespace cl::portable;
  const char* names[6] = {"exp", "log", "sin", "cos", "tanh", "erf"};
  const int nf = (1 << 24) + 65536, nd = 1 << 22;
  std::vector<float> xf(nf);
  std::vector<double> xd(nd);
  std::mt19937_64 rng(99);
  for (int i = 0; i < 65536; ++i) xf[i] = f_from_bits((uint32_t)i << 16);
  for (int i = 65536; i < nf; ++i)
    xf[i] = (i & 1) ? f_from_bits((uint32_t)rng())
                    : (float)std::uniform_real_distribution<double>(-100, 100)(rng);
  for (int i = 0; i < nd; ++i)
    xd[i] = (i & 1) ? d_from_bits(rng()) : std::uniform_real_distribution<double>(-800, 800)(rng);
  float *dxf, *dyf;
  double *dxd, *dyd;
  cudaMalloc(&dxf, nf * 4);
  cudaMalloc(&dyf, 6ull * nf * 4);
  cudaMalloc(&dxd, nd * 8);
  cudaMalloc(&dyd, 6ull * nd * 8);
  cudaMemcpy(dxf, xf.data(), nf * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dxd, xd.data(), nd * 8, cudaMemcpyHostToDevice);
  gpu_eval_f<<<(nf + 255) / 256, 256>>>(dxf, dyf, nf);
  gpu_eval_d<<<(nd + 255) / 256, 256>>>(dxd, dyd, nd);
  std::vector<float> yf(6ull * nf);
  std::vector<double> yd(6ull * nd);
  cudaMemcpy(yf.data(), dyf, 6ull * nf * 4, cudaMemcpyDeviceToHost);
  cudaError_t err = cudaMemcpy(yd.data(), dyd, 6ull * nd * 8, cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(err));
    return 1;
  }
  int bad = 0;
  for (int f = 0; f < 6; ++f) {
    uint64_t mf = 0, md = 0;
    for (int i = 0; i < nf; ++i) {
      float a = xf[i], c;
      switch (f) {
        case 0: c = expf_(a); break;
        case 1: c = logf_(a); break;
        case 2: c = sinf_(a); break;
        case 3: c = cosf_(a); break;
        case 4: c = tanhf_(a); break;
        default: c = erff_(a);
      }
      if (f_bits(c) != f_bits(yf[6ull * i + f])) {
        if (mf++ < 3)
          std::printf("  %sf mismatch x=%a cpu=%a gpu=%a\n", names[f], a, c, yf[6ull * i + f]);
      }
    }
    for (int i = 0; i < nd; ++i) {
      double a = xd[i], c;
      switch (f) {
        case 0: c = exp_(a); break;
        case 1: c = log_(a); break;
        case 2: c = sin_(a); break;
        case 3: c = cos_(a); break;
        case 4: c = tanh_(a); break;
        default: c = erf_(a);
      }
      if (d_bits(c) != d_bits(yd[6ull * i + f])) {
        if (md++ < 3)
          std::printf("  %s mismatch x=%a cpu=%a gpu=%a\n", names[f], a, c, yd[6ull * i + f]);
      }
    }
    std::printf("GPU vs CPU bits: %-5s float %d inputs, %" PRIu64
                " differ; double %d inputs, %" PRIu64 " differ\n",
                names[f], nf, mf, nd, md);
    if (mf || md) bad = 1;
  }
  return bad;
}
#endif

int main(int argc, char** argv) {
  bool skip_exhaustive = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
#if defined(__CUDACC__)
  if (argc > 1 && std::strcmp(argv[1], "--gpu") == 0) {
    int r = gpu_bit_check();
    std::printf("%s\n", r ? "GPU BIT CHECK: FAIL" : "GPU BIT CHECK: PASS");
    return r;
  }
#endif
  using namespace cl::portable;
  check_specials();

  // float: bf16 patterns + 10M random (sin/cos: every finite float is in the domain; the
  // double std::sin/cos reference reduces huge arguments exactly too).
  check_float("logf_", logf_, [](double x) { return std::log(x); }, 0.0, 4.0, 2.0, INFINITY, false);
  check_float("sinf_", sinf_, [](double x) { return std::sin(x); }, -1e5, 1e5, 1.0, INFINITY, true);
  check_float("cosf_", cosf_, [](double x) { return std::cos(x); }, -1e5, 1e5, 1.0, INFINITY, true);
  check_float(
      "tanhf_", tanhf_, [](double x) { return std::tanh(x); }, -10.0, 10.0, 2.0, INFINITY, false);
  check_float(
      "erff_", erff_, [](double x) { return std::erf(x); }, -5.0, 5.0, 2.0, INFINITY, false);
  check_float(
      "expf_ (sampled)", expf_, [](double x) { return std::exp(x); }, -104.0, 89.0, 1.0, INFINITY,
      false);

  // double: 1M each (mixtures of uniform ranges and random bit patterns).
  const int N = 1000000;
  auto mix = [](double lo, double hi, double bits_max) {
    return [=](std::mt19937_64& r) {
      if (r() & 1) return std::uniform_real_distribution<double>(lo, hi)(r);
      for (;;) {
        double x = d_from_bits(r());
        if (std::fabs(x) <= bits_max) return x;
      }
    };
  };
  check_double(
      "exp_", exp_, [](long double x) { return std::exp(x); }, mix(-746.0, 710.0, 746.0), N, 2.0);
  check_double(
      "log_", log_, [](long double x) { return std::log(x); },
      [](std::mt19937_64& r) {
        uint64_t u = r();
        if (u & 1) return std::uniform_real_distribution<double>(0.25, 4.0)(r);
        return std::fabs(d_from_bits(u));
      },
      N, 2.0);
  check_double(
      "sin_ |x|<10", sin_, [](long double x) { return std::sin(x); }, mix(-10.0, 10.0, 10.0), N,
      2.0);
  check_double(
      "cos_ |x|<10", cos_, [](long double x) { return std::cos(x); }, mix(-10.0, 10.0, 10.0), N,
      2.0);
  check_double(
      "sin_ |x|<1e9", sin_, [](long double x) { return std::sin(x); }, mix(-1e9, 1e9, 1e9), N, 2.0);
  check_double(
      "cos_ |x|<1e9", cos_, [](long double x) { return std::cos(x); }, mix(-1e9, 1e9, 1e9), N, 2.0);
  // Arguments next to multiples of pi/2 (the hard cases of the reduction).
  auto near_pio2 = [](std::mt19937_64& r) {
    double k = (double)(r() % (1ull << 30));
    long double v = (long double)k * 1.570796326794896619231321691639751442L;
    double x = (double)v;
    int d = (int)(r() % 9) - 4;
    uint64_t b = d_bits(x) + d;
    return d_from_bits(b);
  };
  check_double(
      "sin_ near k*pi/2", sin_, [](long double x) { return std::sin(x); }, near_pio2, 200000, 2.0);
  check_double(
      "cos_ near k*pi/2", cos_, [](long double x) { return std::cos(x); }, near_pio2, 200000, 2.0);
  // Payne-Hanek range (|x| >= 2^31): exponent uniform in [31, 1023], random sign; and
  // next to multiples of pi/2 for k up to 2^62 (glibc's sinl/cosl reduce exactly).
  auto huge = [](std::mt19937_64& r) {
    double x = std::ldexp(std::uniform_real_distribution<double>(1, 2)(r), 31 + (int)(r() % 993));
    return (r() & 1) ? -x : x;
  };
  check_double(
      "sin_ 2^31<=|x|<=DBL_MAX", sin_, [](long double x) { return std::sin(x); }, huge, N, 2.0);
  check_double(
      "cos_ 2^31<=|x|<=DBL_MAX", cos_, [](long double x) { return std::cos(x); }, huge, N, 2.0);
  auto near_pio2_big = [](std::mt19937_64& r) {
    long double k = (long double)(r() >> (int)(r() % 33));  // up to 2^64
    double x = (double)(k * 1.570796326794896619231321691639751442L);
    int d = (int)(r() % 9) - 4;
    return d_from_bits(d_bits(x) + d);
  };
  check_double(
      "sin_ near k*pi/2, k<2^64", sin_, [](long double x) { return std::sin(x); }, near_pio2_big,
      200000, 2.0);
  check_double(
      "cos_ near k*pi/2, k<2^64", cos_, [](long double x) { return std::cos(x); }, near_pio2_big,
      200000, 2.0);
  check_double(
      "tanh_", tanh_, [](long double x) { return std::tanh(x); }, mix(-20.0, 20.0, 30.0), N, 2.0);
  check_double(
      "erf_", erf_, [](long double x) { return std::erf(x); }, mix(-6.0, 6.0, 7.0), N, 2.0);

  if (!skip_exhaustive) check_expf_exhaustive();
  std::printf("%s\n", g_fail ? "RESULT: FAIL" : "RESULT: PASS");
  return g_fail;
}
