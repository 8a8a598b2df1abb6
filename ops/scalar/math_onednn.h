// GELU (erf form) as oneDNN's JIT eltwise kernel computes it: what PyTorch's CPU gelu
// calls for contiguous fp32 input, and for contiguous bf16 where oneDNN supports bf16
// (aten/src/ATen/native/Activation.cpp gelu_out_cpu / use_mkldnn; docs/torch_cpu_kernels.md).
//
// Re-implemented from the instruction sequence of oneDNN v3.12.0 (commit 80afa71049cd,
// the version torch 2.13 bundles), src/cpu/x64/injectors/jit_uni_eltwise_injector.cpp:
//   gelu_erf_compute_vector_fwd            L1356-1423: on AVX512 cores (is_avx512_) the
//     minimax form below, else Abramowitz & Stegun 7.1.26 with the injector's own exp;
//   gelu_erf_minimax_approx_compute_vector_fwd  L1288-1354;
//   exp_compute_vector_fwd                 L393-457;
//   constants and polynomial tables        L2189-2211 (common, exp), L2486-2718 (gelu_erf).
// Each step is the same IEEE single operation as the JIT's instruction: an fma() here is
// a vfmadd/vfnmadd there, every other product or sum is rounded on its own (the host build
// uses -ffp-contract=off). vminps/vmaxps return their second operand when either is NaN,
// vcvtps2dq rounds to nearest, vpsrad shifts arithmetically; the helpers below do the same.
// The kernel is elementwise (its scalar tail runs the same sequence one element at a time,
// jit_uni_eltwise.cpp tail_size_ = 1), so one scalar function gives every element.
//
// Host only, as math_torch_cpu.h: oneDNN runs on the CPU.
#pragma once
#include <cstdint>

#include "core/cl_defs.h"
#include "ops/scalar/math_torch_cpu.h"

namespace cl {
namespace onednn {
namespace detail {

using torch_cpu::detail::bits;
using torch_cpu::detail::fbits;
using torch_cpu::detail::fma;
// vminps / vmaxps: a < b ? a : b (a > b ? a : b); a NaN in either gives b.
CL_HD float minps(float a, float b) { return a < b ? a : b; }
CL_HD float maxps(float a, float b) { return a > b ? a : b; }
CL_HD float sign_of(float x) { return fbits(bits(x) & 0x80000000u); }
CL_HD float xor_sign(float x, float s) { return fbits(bits(x) ^ bits(s)); }

// The injector's minimax table (gelu_erf_minimax_polynomial, L2518-2718): six coefficients
// (degree 0..5) for each of 25 pieces of |x|, each row padded to 32 entries as in the JIT
// (its indices, 1..24, never reach the padding).
alignas(64) constexpr uint32_t kGeluErfPol[6][32] = {
    {
        // degree 0
        0xa6f2cb94u, 0x32827792u, 0x3381cc0cu, 0x34523d4au, 0x351ac44du, 0x35f36d88u, 0x36ee8229u,
        0x37b8a3bbu, 0x3867a213u, 0x3940033bu, 0x3a2a5a1du, 0x3ae35863u, 0x3b7828f2u, 0x3c08b14bu,
        0x3c515ed3u, 0xbb503236u, 0xbd8d8e5eu, 0xbe8abcd9u, 0xbf0c19a2u, 0xbeccb328u, 0x3e176cedu,
        0x3f470d99u, 0x3f7abb28u, 0x3f800000u, 0x00000000u,
    },
    {
        // degree 1
        0x3f4c422au, 0x3f4c421fu, 0x3f4c4207u, 0x3f4c41cbu, 0x3f4c413bu, 0x3f4c3fadu, 0x3f4c3a2fu,
        0x3f4c2d40u, 0x3f4c146au, 0x3f4bc341u, 0x3f4ad08cu, 0x3f48f8cfu, 0x3f45fac7u, 0x3f404e07u,
        0x3f3b980fu, 0x3f48dff3u, 0x3f78b21bu, 0x3fbb0704u, 0x40019c32u, 0x3fe536d6u, 0x3f81331eu,
        0x3e6c8684u, 0x3c98f936u, 0x00000000u, 0x3f800000u,
    },
    {
        // degree 2
        0xb62173f4u, 0x3735e4cfu, 0x37f2ff89u, 0x388c23beu, 0x3917535cu, 0x39ab2ab0u, 0x3a60fadbu,
        0x3af9b960u, 0x3b6e5491u, 0x3c0a4ec5u, 0x3ca5aa8cu, 0x3d2138d9u, 0x3d8737d4u, 0x3ddfb660u,
        0x3e0f27abu, 0x3d94004bu, 0xbe0efdebu, 0xbf1d96c3u, 0xbf89db58u, 0xbf6d9897u, 0xbef69fb8u,
        0xbdc4f8a8u, 0xbbde6422u, 0x00000000u, 0x00000000u,
    },
    {
        // degree 3
        0xbe081a19u, 0xbe084570u, 0xbe08639bu, 0xbe089837u, 0xbe08f409u, 0xbe09ab95u, 0xbe0b66d0u,
        0xbe0e400au, 0xbe124df8u, 0xbe1bde02u, 0xbe2f19c9u, 0xbe4931bfu, 0xbe685fbcu, 0xbe89c95fu,
        0xbe96cbcau, 0xbe8044aau, 0xbe0550f2u, 0x3dcfd6a1u, 0x3e94c826u, 0x3e79345fu, 0x3decec91u,
        0x3ca46568u, 0x3aa1e00au, 0x00000000u, 0x00000000u,
    },
    {
        // degree 4
        0xba3d61dbu, 0x39f097a3u, 0x3a5845dcu, 0x3ab1fa35u, 0x3b0cefb8u, 0x3b653ab6u, 0x3bcae527u,
        0x3c221712u, 0x3c6c5840u, 0x3cc0a703u, 0x3d1dcc19u, 0x3d63656du, 0x3d955907u, 0x3dbf9910u,
        0x3dd53f69u, 0x3db7dcefu, 0x3d639ebeu, 0xba6ede48u, 0xbd22be69u, 0xbd041cf1u, 0xbc64f5abu,
        0xbb097a32u, 0xb8ebf380u, 0x00000000u, 0x00000000u,
    },
    {
        // degree 5
        0x3cb7d80cu, 0x3c9b6050u, 0x3c978d11u, 0x3c92e850u, 0x3c8d058bu, 0x3c848454u, 0x3c6cd623u,
        0x3c4c824bu, 0x3c2a7935u, 0x3be0b390u, 0x3b0651acu, 0xbb232f53u, 0xbbd42fa0u, 0xbc2c5366u,
        0xbc492c9eu, 0xbc2a7aa6u, 0xbbd55d04u, 0xba823a76u, 0x3b102aa8u, 0x3ae25a7eu, 0x3a31f792u,
        0x38b84375u, 0x3689bb5au, 0x00000000u, 0x00000000u,
    },
};

}  // namespace detail

// exp_compute_vector_fwd (L393-457): exp(x) = 2 * 2^(n-1) * p(r), n = floor(x*log2(e) + 1/2),
// r = x - n*ln2 (one vfnmadd), p a degree-5 polynomial in Horner form with fmas; inputs
// below ln(FLT_MIN) give 0 (the 2^(n-1) factor is zeroed). NaN becomes ln(FLT_MAX) in the
// clamp (vminps keeps its second operand), as in the JIT.
CL_HD float exp_jit(float x) {
  using namespace detail;
  const float ln_flt_min = fbits(0xc2aeac50u), ln_flt_max = fbits(0x42b17218u);
  const bool underflow = x < ln_flt_min;  // _cmp_lt_os: false for NaN
  x = maxps(minps(x, ln_flt_max), ln_flt_min);
  float fx = x * fbits(0x3fb8aa3bu);  // log2(e)
  fx = fx + 0.5f;
  const float n = __builtin_floorf(fx);
  const float r = fma(-n, fbits(0x3f317218u), x);  // vfnmadd231ps: x - n*ln2, one rounding
  // 2^(n-1) through the exponent field (vcvtps2dq; n - 1 is an integer in [-127, 127]);
  // n = 128 would not fit, hence the final doubling.
  const int32_t e = static_cast<int32_t>(n - 1.0f);
  const float scale = underflow ? 0.0f : fbits((static_cast<uint32_t>(e) + 0x7fu) << 23);
  float p = fbits(0x3c07cfceu);  // p5 .. p1 (exp_polynomial, L2203-2211), then 1
  p = fma(p, r, fbits(0x3d2b9d0du));
  p = fma(p, r, fbits(0x3e2aad40u));
  p = fma(p, r, fbits(0x3efffee3u));
  p = fma(p, r, fbits(0x3f7ffffbu));
  p = fma(p, r, 1.0f);
  return p * scale * 2.0f;
}

// gelu_erf_minimax_approx_compute_vector_fwd (L1288-1354), oneDNN's path on AVX512 cores:
// erf(s/sqrt2) is a degree-5 polynomial in |s| picked by the exponent and two leading
// mantissa bits of |s| (index = (bits(|s|) + 0xc21fffff) >> 21, clamped to [1, 24], 23 above
// the bound 0x40b15cee where erf is 1); gelu = s * (1 + sign(s)*P(|s|)) * 0.5.
// In three steps, so that the CPU executor can look the coefficients up for a whole block
// at once (the JIT's vpermt2ps; a compiler does not vectorise table loads without gathers):
// the piece of s, its coefficient of degree d, and the polynomial.
CL_HD int32_t gelu_erf_minimax_piece(float s) {
  using namespace detail;
  const float a = fbits(bits(s) & 0x7fffffffu);
  // vpaddd then vpsrad: wrapping integer add, arithmetic shift
  int32_t idx = static_cast<int32_t>(bits(a) + 0xc21fffffu) >> 21;
  idx = idx < 1 ? 1 : idx;                   // vpmaxsd
  idx = idx > 24 ? 24 : idx;                 // vpminsd
  return fbits(0x40b15ceeu) < a ? 23 : idx;  // _cmp_lt_os: a NaN keeps its index
}
CL_HD float gelu_erf_minimax_coef(int degree, int32_t piece) {
  return detail::fbits(detail::kGeluErfPol[degree][piece]);
}
CL_HD float gelu_erf_minimax_poly(float s, float c0, float c1, float c2, float c3, float c4,
                                  float c5) {
  using namespace detail;
  const float a = fbits(bits(s) & 0x7fffffffu);
  float p = fma(c5, a, c4);  // Horner from degree 5, one vfmadd213ps per step
  p = fma(p, a, c3);
  p = fma(p, a, c2);
  p = fma(p, a, c1);
  p = fma(p, a, c0);
  p = xor_sign(p, sign_of(s));
  p = p + 1.0f;
  return s * p * 0.5f;
}
CL_HD float gelu_erf_minimax(float s) {
  const int32_t i = gelu_erf_minimax_piece(s);
  return gelu_erf_minimax_poly(s, gelu_erf_minimax_coef(0, i), gelu_erf_minimax_coef(1, i),
                               gelu_erf_minimax_coef(2, i), gelu_erf_minimax_coef(3, i),
                               gelu_erf_minimax_coef(4, i), gelu_erf_minimax_coef(5, i));
}

// gelu_erf_compute_vector_fwd below AVX512 (L1366-1422): Abramowitz & Stegun 7.1.26 on
// x = s/sqrt2: t = 1/(1 + p|x|), erf = sign * (1 - t*P(t)*exp(-x*x)), with the JIT's exp;
// gelu = S + S*erf, S = s/2, as one fma.
CL_HD float gelu_erf_as(float s) {
  using namespace detail;
  const float x = s * fbits(0x3f3504f3u);  // 1/sqrt(2)
  const float ax = fbits(bits(x) & 0x7fffffffu);
  const float t = 1.0f / fma(fbits(0x3ea7ba05u), ax, 1.0f);
  const float e = -exp_jit(-(x * x));  // sign flips are xors: exact
  const float et = e * t;
  float r = fbits(0x3f87dc22u);  // p5 .. p1 (L2494-2507)
  r = fma(r, t, fbits(0xbfba00e3u));
  r = fma(r, t, fbits(0x3fb5f0e3u));
  r = fma(r, t, fbits(0xbe91a98eu));
  r = fma(r, t, fbits(0x3e827906u));
  const float erf = xor_sign(fma(et, r, 1.0f), sign_of(s));
  const float half_s = s * 0.5f;
  return fma(erf, half_s, half_s);
}

// gelu_erf_compute_vector_bwd (the same file, every ISA): the derivative of gelu (erf
// form) by Abramowitz & Stegun with the JIT's exp: R = s/sqrt2, Q = exp(-R*R),
// T = R/sqrt(pi) * Q, W = 1/(p|R| + 1), erf = sign(R) * (1 - Q*W*P(W)) (one fma),
// result = (T + 1/2) + erf/2 (one fma). The eltwise backward kernel multiplies it by
// diff_dst.
CL_HD float gelu_erf_bwd(float s) {
  using namespace detail;
  const float r = s * fbits(0x3f3504f3u);  // 1/sqrt(2)
  const float q = exp_jit(-(r * r));
  const float t = r * fbits(0x3f106ebau) * q;  // 1/sqrt(pi)
  const float w = 1.0f / fma(fbits(0x3ea7ba05u), fbits(bits(r) & 0x7fffffffu), 1.0f);
  const float qw = -q * w;
  float p = fbits(0x3f87dc22u);
  p = fma(p, w, fbits(0xbfba00e3u));
  p = fma(p, w, fbits(0x3fb5f0e3u));
  p = fma(p, w, fbits(0xbe91a98eu));
  p = fma(p, w, fbits(0x3e827906u));
  const float erf = xor_sign(fma(qw, p, 1.0f), sign_of(r));
  return fma(erf, 0.5f, t + 0.5f);
}

// oneDNN's bf16 store on CPUs with avx512_bf16, vcvtneps2bf16, writes a subnormal float as
// a signed zero (Intel SDM, VCVTNEPS2BF16: denormal inputs are treated as zero); what it
// keeps of y, so that the round to nearest even that follows is exact.
CL_HD float bf16_store_ftz(float y) {
  using namespace detail;
  return (bits(y) & 0x7f800000u) == 0 ? sign_of(y) : y;
}

}  // namespace onednn
}  // namespace cl
