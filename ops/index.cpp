#include "ops/index.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "ops/backend.h"

namespace cl {

namespace {

std::string bounds_message(int64_t v, int dim, int64_t size, bool target = false) {
  if (target) return "Target " + std::to_string(v) + " is out of bounds.";
  return "index " + std::to_string(v) + " is out of bounds for dimension " + std::to_string(dim) +
         " with size " + std::to_string(size);
}

void check_spec(const IndexSpec& s, const Tensor& src, const Tensor& index, const Tensor& out) {
  const char* fn = s.mode == kIndexScatterAdd ? "scatter_add" : "gather";
  const int64_t nd = index.ndim();
  if (s.mode != kIndexGather && s.mode != kIndexScatterAdd && s.mode != kIndexCheck)
    throw std::invalid_argument("index step: unknown mode " + std::to_string(s.mode));
  if (index.dtype() != kInt64)
    throw std::invalid_argument(std::string(fn) + "(): Expected dtype int64 for index");
  if (s.mode == kIndexCheck) {
    if (s.size < 0) throw std::invalid_argument("index check: negative size");
    if (nd > kIndexMaxDims)
      throw std::invalid_argument("gather(): at most " + std::to_string(kIndexMaxDims) +
                                  " dimensions");
    return;
  }
  if (src.ndim() != nd || out.ndim() != nd)
    throw std::invalid_argument(std::string(fn) +
                                "(): the input, index and output must have the same number of "
                                "dimensions");
  if (nd > kIndexMaxDims)
    throw std::invalid_argument(std::string(fn) + "(): at most " + std::to_string(kIndexMaxDims) +
                                " dimensions");
  if (s.dim < 0 || s.dim >= std::max<int64_t>(nd, 1))
    throw std::invalid_argument(std::string(fn) + "(): dim out of range");
  if (src.device() != index.device() || out.device() != index.device())
    throw std::invalid_argument(std::string(fn) + "(): tensors on " + src.device().str() + ", " +
                                index.device().str() + " and " + out.device().str());
  // gather: out is index-shaped; scatter_add: src covers index
  const Tensor& same = s.mode == kIndexGather ? out : src;
  const Tensor& big = s.mode == kIndexGather ? src : out;
  for (int64_t d = 0; d < nd; ++d) {
    if (s.mode == kIndexGather ? same.shape()[d] != index.shape()[d]
                               : same.shape()[d] < index.shape()[d])
      throw std::invalid_argument(std::string(fn) + "(): index " + shape_str(index.shape()) +
                                  " does not fit " + shape_str(same.shape()));
    if (d != s.dim && big.shape()[d] < index.shape()[d])
      throw std::invalid_argument(
          std::string(fn) + "(): Size does not match at dimension " + std::to_string(d) +
          " expected index " + shape_str(index.shape()) + " to be no larger than self " +
          shape_str(big.shape()) + " apart from dimension " + std::to_string(s.dim));
  }
  if (s.mode == kIndexGather) {
    if (src.dtype() != out.dtype())
      throw std::invalid_argument("gather(): the output's dtype differs from the input's");
  } else if (src.dtype() != out.dtype() || (out.dtype() != kFloat32 && out.dtype() != kFloat64)) {
    throw std::invalid_argument("scatter_add(): float32 or float64 operands of one dtype");
  }
  if (s.mode == kIndexScatterAdd && !out.is_contiguous())
    throw std::invalid_argument("scatter_add(): the output must be contiguous");
}

// Offsets of element (coords) in a strided view.
int64_t offset_of(const int64_t* c, const Shape& st, int64_t nd) {
  int64_t o = 0;
  for (int64_t d = 0; d < nd; ++d) o += c[d] * st[d];
  return o;
}

// An index as the kernels read it: modulo the size when asked (take_along_dim's
// `indices % dim_size`, a floor modulo: -1 is the last, size + 1 the second).
int64_t wrapped(int64_t v, int64_t size, bool wrap) {
  if (!wrap || size <= 0) return v;
  const int64_t r = v % size;
  return r < 0 ? r + size : r;
}

// The coordinates of the k-th element (row-major) of `shape`.
void coords_of(int64_t k, const Shape& shape, int64_t nd, int64_t* c) {
  for (int64_t d = nd - 1; d >= 0; --d) {
    c[d] = k % shape[d];
    k /= shape[d];
  }
}

// Index element k: its coordinates into c, and its value wrapped and range-checked.
int64_t index_at(int64_t k, const Tensor& index, int dim, int64_t size, bool wrap, int64_t* c) {
  const int64_t nd = index.ndim();
  coords_of(k, index.shape(), nd, c);
  const int64_t raw =
      static_cast<const int64_t*>(index.data_ptr())[offset_of(c, index.strides(), nd)];
  const int64_t v = wrapped(raw, size, wrap);
  if (v < 0 || v >= size) throw std::out_of_range(bounds_message(raw, dim, size));
  return v;
}

void check_cpu(int dim, int64_t size, bool wrap, const Tensor& index) {
  int64_t c[kIndexMaxDims];
  for (int64_t k = 0; k < index.numel(); ++k) index_at(k, index, dim, size, wrap, c);
}

void gather_cpu(int dim, bool wrap, const Tensor& src, const Tensor& index, const Tensor& out) {
  const int64_t nd = index.ndim(), n = index.numel();
  const size_t es = static_cast<size_t>(src.itemsize());
  const int64_t size = src.shape().empty() ? 1 : src.shape()[dim];
  const char* sp = static_cast<const char*>(src.data_ptr());
  char* op = static_cast<char*>(out.data_ptr());
  for (int64_t k = 0; k < n; ++k) {
    int64_t c[kIndexMaxDims];
    const int64_t v = index_at(k, index, dim, size, wrap, c);
    const int64_t oo = offset_of(c, out.strides(), nd);
    if (nd > 0) c[dim] = v;
    std::memcpy(op + oo * static_cast<int64_t>(es),
                sp + offset_of(c, src.strides(), nd) * int64_t(es), es);
  }
}

template <typename T>
void scatter_add_cpu(int dim, const Tensor& src, const Tensor& index, const Tensor& out) {
  const int64_t nd = index.ndim(), n = index.numel();
  T* op = static_cast<T*>(out.data_ptr());
  const int64_t total = out.numel();
  for (int64_t k = 0; k < total; ++k) op[k] = T(0);
  if (n == 0) return;
  const Shape& shape = index.shape();
  const int64_t len = nd > 0 ? shape[dim] : 1, rows = n / len;
  const int64_t size = nd > 0 ? out.shape()[dim] : 1;
  const T* sp = static_cast<const T*>(src.data_ptr());
  const int64_t* ip = static_cast<const int64_t*>(index.data_ptr());
  for (int64_t r = 0; r < rows; ++r) {
    int64_t c[kIndexMaxDims];
    int64_t q = r;
    for (int64_t d = nd - 1; d >= 0; --d) {
      if (d == dim) {
        c[d] = 0;
        continue;
      }
      c[d] = q % shape[d];
      q /= shape[d];
    }
    for (int64_t i = 0; i < len; ++i) {
      if (nd > 0) c[dim] = i;
      const int64_t v = ip[offset_of(c, index.strides(), nd)];
      if (v < 0 || v >= size) throw std::out_of_range(bounds_message(v, dim, size));
      const T x = sp[offset_of(c, src.strides(), nd)];
      if (nd > 0) c[dim] = v;
      T& o = op[offset_of(c, out.strides(), nd)];
      o = o + x;
    }
  }
}

}  // namespace

void run_index(const IndexSpec& s, const Tensor& src, const Tensor& index, const Tensor& out) {
  check_spec(s, src, index, out);
  if (index.numel() == 0 && s.mode != kIndexScatterAdd) return;
  const Tensor& big = s.mode == kIndexGather ? src : out;
  const int64_t size = s.mode == kIndexCheck ? s.size : (big.ndim() > 0 ? big.shape()[s.dim] : 1);
  if (index.device().type != DeviceType::CPU) {
    bool bad = false;
    int64_t v = 0;
    device_backend(index.device().type).index(s, src, index, out, size, &bad, &v);
    if (bad) throw std::out_of_range(bounds_message(v, s.dim, size, s.target));
    return;
  }
  try {
    if (s.mode == kIndexCheck)
      check_cpu(s.dim, size, s.wrap, index);
    else if (s.mode == kIndexGather)
      gather_cpu(s.dim, s.wrap, src, index, out);
    else if (out.dtype() == kFloat32)
      scatter_add_cpu<float>(s.dim, src, index, out);
    else
      scatter_add_cpu<double>(s.dim, src, index, out);
  } catch (const std::out_of_range& e) {
    if (!s.target) throw;
    // the offending value is the message's second word
    const std::string m = e.what();
    const size_t a = m.find(' ') + 1, b = m.find(' ', a);
    throw std::out_of_range(bounds_message(std::stoll(m.substr(a, b - a)), s.dim, size, true));
  }
}

}  // namespace cl
