// Overflow-checked integer arithmetic for sizes, strides and offsets. Every size,
// stride, offset and byte-count computation that can see user-controlled values goes
// through these helpers, so an overflow raises (std::invalid_argument -> ValueError)
// instead of wrapping into a small number that later reads or writes out of bounds.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

namespace cl {

// a * b and a + b; false (and *out unspecified) on int64 overflow.
inline bool mul_ok(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
inline bool add_ok(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}
inline bool sub_ok(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_sub_overflow(a, b, out);
}

// The number of bytes of the element range [lo, hi] (from strided_extent) of items of
// `isz` bytes: (hi - lo + 1) * isz, false on overflow.
inline bool span_bytes(int64_t lo, int64_t hi, int64_t isz, int64_t* out) {
  int64_t n;
  return sub_ok(hi, lo, &n) && add_ok(n, 1, &n) && mul_ok(n, isz, out);
}

// a * b and a + b, or std::invalid_argument("<what>: a * b does not fit in 64 bits").
inline int64_t checked(bool ok, int64_t r, int64_t a, const char* op, int64_t b, const char* what) {
  if (!ok)
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(a) + op +
                                std::to_string(b) + " does not fit in 64 bits");
  return r;
}
inline int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  const bool ok = mul_ok(a, b, &r);
  return checked(ok, r, a, " * ", b, what);
}
inline int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  const bool ok = add_ok(a, b, &r);
  return checked(ok, r, a, " + ", b, what);
}

}  // namespace cl
