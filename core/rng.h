// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11): the value for
// element i depends only on (seed, stream, i), so every device and every thread split
// produces the same numbers.
#pragma once
#include "core/cl_defs.h"

namespace cl {

struct U32x4 {
  uint32_t v[4];
};

CL_HD void mulhilo32(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = (uint64_t)a * (uint64_t)b;
  *hi = (uint32_t)(p >> 32);
  *lo = (uint32_t)p;
}

CL_HD U32x4 philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                       uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(0xD2511F53u, c0, &hi0, &lo0);
    mulhilo32(0xCD9E8D57u, c2, &hi1, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0;
    const uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  U32x4 r;
  r.v[0] = c0;
  r.v[1] = c1;
  r.v[2] = c2;
  r.v[3] = c3;
  return r;
}

// 32 random bits for element `index` of stream `stream` under `seed`.
CL_HD uint32_t random_bits(uint64_t seed, uint32_t stream, uint64_t index) {
  return philox4x32((uint32_t)index, (uint32_t)(index >> 32), stream, 0x43A57AB1u, (uint32_t)seed,
                    (uint32_t)(seed >> 32))
      .v[0];
}

// Uniform in [0, 1): 24 random bits scaled exactly.
CL_HD float uniform_f32(uint32_t bits) { return (float)(bits >> 8) * 5.9604644775390625e-08f; }
// Uniform in [0, 1) with 53 bits, from two words.
CL_HD double uniform_f64(uint32_t hi, uint32_t lo) {
  const uint64_t m = ((uint64_t)(hi >> 5) << 26) | (uint64_t)(lo >> 6);
  return (double)m * 1.1102230246251565e-16;  // 2^-53
}

}  // namespace cl
