#include "core/tensor.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "core/checked.h"

namespace cl {

std::string Device::str() const {
  if (type == DeviceType::CPU) return "cpu";
  return "cuda:" + std::to_string(index);
}

Device Device::parse(const std::string& s) {
  if (s == "cpu") return {DeviceType::CPU, 0};
  if (s == "cuda") return {DeviceType::CUDA, 0};
  if (s.size() > 5 && s.size() <= 14 && s.compare(0, 5, "cuda:") == 0 &&
      s.find_first_not_of("0123456789", 5) == std::string::npos)
    return {DeviceType::CUDA, static_cast<int32_t>(std::stol(s.substr(5)))};
  throw std::invalid_argument("unknown device '" + s +
                              "' (expected 'cpu', 'cuda' or 'cuda:N' with N a non-negative "
                              "integer)");
}

namespace {

// Host memory: large blocks are cached and reused instead of being returned to the
// OS, so a fresh output does not pay a page fault per 4 KiB on every call (for a
// memory-bound op that is most of its time). Small blocks go straight to malloc.
struct CpuAllocator : Allocator {
  static constexpr size_t kLarge = size_t(1) << 20;      // cache blocks of >= 1 MiB
  static constexpr size_t kGranule = size_t(1) << 20;    // in 1 MiB size classes
  static constexpr size_t kMaxCached = size_t(4) << 30;  // keep at most 4 GiB idle

  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;
  size_t cached = 0;

  std::shared_ptr<Storage> allocate(size_t nbytes, Device device) override {
    auto s = std::make_shared<Storage>();
    s->nbytes = nbytes;
    s->device = device;
    if (nbytes < kLarge) {
      const size_t rounded = ((nbytes + 63) / 64) * 64;
      s->data = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
      if (!s->data) throw std::bad_alloc();
      s->deleter = [](void* p) { std::free(p); };
      return s;
    }
    const size_t cls = ((nbytes + kGranule - 1) / kGranule) * kGranule;
    {
      std::lock_guard<std::mutex> g(mu);
      auto it = free_blocks.find(cls);
      if (it != free_blocks.end() && !it->second.empty()) {
        s->data = it->second.back();
        it->second.pop_back();
        cached -= cls;
      }
    }
    if (!s->data) {
      s->data = std::aligned_alloc(4096, cls);
      if (!s->data) {
        empty_cache();
        s->data = std::aligned_alloc(4096, cls);
      }
      if (!s->data) throw std::bad_alloc();
    }
    s->deleter = [this, cls](void* p) { release(p, cls); };
    return s;
  }

  void release(void* p, size_t cls) {
    {
      std::lock_guard<std::mutex> g(mu);
      if (cached + cls <= kMaxCached) {
        free_blocks[cls].push_back(p);
        cached += cls;
        return;
      }
    }
    std::free(p);
  }

  void empty_cache() {
    std::lock_guard<std::mutex> g(mu);
    for (auto& kv : free_blocks)
      for (void* p : kv.second) std::free(p);
    free_blocks.clear();
    cached = 0;
  }
};

// Leaked on purpose: storages may be released during interpreter shutdown.
CpuAllocator& cpu_allocator() {
  static CpuAllocator* a = new CpuAllocator();
  return *a;
}
Allocator* g_allocators[2] = {nullptr, nullptr};

}  // namespace

void register_allocator(DeviceType type, Allocator* allocator) {
  g_allocators[static_cast<int>(type)] = allocator;
}

void cpu_empty_cache() { cpu_allocator().empty_cache(); }

Allocator* get_allocator(DeviceType type) {
  if (type == DeviceType::CPU) return &cpu_allocator();
  Allocator* a = g_allocators[static_cast<int>(type)];
  if (!a) throw std::runtime_error("no allocator for this device: CUDA support is not loaded");
  return a;
}

int64_t numel_of(const Shape& shape, const char* fn) {
  for (int64_t s : shape)
    if (s == 0) return 0;
  int64_t n = 1;
  for (int64_t s : shape) {
    if (!mul_ok(n, s, &n))
      throw std::invalid_argument(std::string(fn ? fn : "tensor") + ": shape " + shape_str(shape) +
                                  " has more elements than fit in 64 bits");
  }
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    if (i > 0 && !mul_ok(acc, shape[i] > 0 ? shape[i] : 1, &acc))
      throw std::invalid_argument("shape " + shape_str(shape) +
                                  ": its contiguous strides do not fit in 64 bits");
  }
  return st;
}

std::string shape_str(const Shape& shape) {
  // Plain string building (no iostreams: they crashed in one toolchain mix we met).
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

bool strided_extent(const Shape& shape, const Shape& strides, int64_t* lo, int64_t* hi) {
  *lo = *hi = 0;
  for (int64_t s : shape)
    if (s == 0) return false;
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t ext;
    if (shape[i] < 0 || !mul_ok(shape[i] - 1, strides[i], &ext) ||
        !add_ok(ext < 0 ? *lo : *hi, ext, ext < 0 ? lo : hi))
      throw std::invalid_argument("a view of shape " + shape_str(shape) + " with strides " +
                                  shape_str(strides) + " spans more elements than fit in 64 bits");
  }
  return true;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) {
      throw std::invalid_argument("shapes " + shape_str(a) + " and " + shape_str(b) +
                                  " do not broadcast (dimension " + std::to_string(i) + ": " +
                                  std::to_string(da) + " vs " + std::to_string(db) + ")");
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor::Tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset,
               DTypeCode dtype)
    : storage_(std::move(storage)),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      offset_(offset),
      dtype_(dtype) {
  if (shape_.size() != strides_.size())
    throw std::invalid_argument("shape and strides have different lengths");
  for (int64_t s : shape_)
    if (s < 0) throw std::invalid_argument("negative dimension in shape " + shape_str(shape_));
  check_bounds();
}

// The invariant every tensor keeps (so that no later index computation can overflow or
// leave the storage): its element count fits in 64 bits, and every element it views
// lies inside its storage.
void Tensor::check_bounds() const {
  if (!storage_) return;
  if (numel_of(shape_) == 0) return;
  int64_t lo = 0, hi = 0;
  strided_extent(shape_, strides_, &lo, &hi);
  const int64_t cap = static_cast<int64_t>(std::min<size_t>(
                          storage_->nbytes, size_t(std::numeric_limits<int64_t>::max()))) /
                      itemsize();
  if (!add_ok(lo, offset_, &lo) || !add_ok(hi, offset_, &hi) || lo < 0 || hi >= cap)
    throw std::invalid_argument("a view of shape " + shape_str(shape_) + " with strides " +
                                shape_str(strides_) + " at offset " + std::to_string(offset_) +
                                " does not fit in its storage of " + std::to_string(cap) +
                                " elements");
}

Tensor Tensor::empty(const Shape& shape, DTypeCode dtype, Device device) {
  for (int64_t s : shape)
    if (s < 0)
      throw std::invalid_argument("empty: negative dimension in shape " + shape_str(shape));
  const int64_t n = numel_of(shape, "empty");
  int64_t nbytes;
  if (!mul_ok(n, cl::itemsize(dtype), &nbytes))
    throw std::invalid_argument("empty: shape " + shape_str(shape) + " needs more bytes than fit " +
                                "in 64 bits");
  auto storage = get_allocator(device.type)->allocate(static_cast<size_t>(nbytes), device);
  return Tensor(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = ndim() - 1; i >= 0; --i) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

int64_t Tensor::normalize_dim(int64_t dim, int64_t ndim_plus) const {
  const int64_t n = ndim() + ndim_plus;
  if (dim < -n || dim >= n || (n == 0 && dim != 0 && dim != -1)) {
    throw std::out_of_range("dimension " + std::to_string(dim) + " is out of range for a " +
                            std::to_string(ndim()) + "-d tensor (expected a value in [" +
                            std::to_string(-n) + ", " + std::to_string(n - 1) + "])");
  }
  return dim < 0 ? dim + n : dim;
}

Tensor Tensor::as_strided(const Shape& shape, const Shape& strides, int64_t offset) const {
  // Check the view stays inside the storage.
  if (shape.size() != strides.size())
    throw std::invalid_argument("as_strided: shape and strides differ in length");
  for (int64_t d : shape)
    if (d < 0) throw std::invalid_argument("as_strided: negative size");
  int64_t lo = 0, hi = 0;
  const bool empty = !strided_extent(shape, strides, &lo, &hi);
  const bool shifted = add_ok(lo, offset, &lo) && add_ok(hi, offset, &hi);
  const int64_t cap = static_cast<int64_t>(storage_->nbytes) / itemsize();
  if (!empty && (!shifted || lo < 0 || hi >= cap)) {
    throw std::out_of_range("as_strided: view [" + std::to_string(lo) + ", " + std::to_string(hi) +
                            "] exceeds storage of " + std::to_string(cap) + " elements");
  }
  return Tensor(storage_, shape, strides, offset, dtype_);
}

Tensor Tensor::slice(int64_t dim, int64_t start, int64_t stop, int64_t step) const {
  dim = normalize_dim(dim);
  if (step <= 0)
    throw std::invalid_argument("slice step must be positive (got " + std::to_string(step) + ")");
  const int64_t n = shape_[dim];
  auto clamp = [n](int64_t v) {
    if (v < 0) v += n;
    return v < 0 ? 0 : (v > n ? n : v);
  };
  start = clamp(start);
  stop = clamp(stop);
  const int64_t len = stop > start ? (stop - start - 1) / step + 1 : 0;  // no overflow
  Shape sh = shape_, st = strides_;
  sh[dim] = len;
  // A stride only matters when the dimension has two elements or more (then it fits:
  // the view stays inside the storage).
  if (!mul_ok(strides_[dim], step, &st[dim])) {
    if (len > 1) throw std::invalid_argument("slice: stride * step does not fit in 64 bits");
    st[dim] = strides_[dim];
  }
  return Tensor(storage_, sh, st, offset_ + (len > 0 ? start * strides_[dim] : 0), dtype_);
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
  dim = normalize_dim(dim);
  const int64_t n = shape_[dim];
  if (index < -n || index >= n) {
    throw std::out_of_range("index " + std::to_string(index) + " is out of bounds for dimension " +
                            std::to_string(dim) + " with size " + std::to_string(n));
  }
  if (index < 0) index += n;
  Shape sh = shape_, st = strides_;
  sh.erase(sh.begin() + dim);
  st.erase(st.begin() + dim);
  return Tensor(storage_, sh, st, offset_ + index * strides_[dim], dtype_);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  if (static_cast<int64_t>(dims.size()) != ndim())
    throw std::invalid_argument("permute: expected " + std::to_string(ndim()) + " dims, got " +
                                std::to_string(dims.size()));
  std::vector<bool> seen(ndim(), false);
  Shape sh(ndim()), st(ndim());
  for (int64_t i = 0; i < ndim(); ++i) {
    const int64_t d = normalize_dim(dims[i]);
    if (seen[d]) throw std::invalid_argument("permute: repeated dim " + std::to_string(d));
    seen[d] = true;
    sh[i] = shape_[d];
    st[i] = strides_[d];
  }
  return Tensor(storage_, sh, st, offset_, dtype_);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  d0 = normalize_dim(d0);
  d1 = normalize_dim(d1);
  Shape sh = shape_, st = strides_;
  std::swap(sh[d0], sh[d1]);
  std::swap(st[d0], st[d1]);
  return Tensor(storage_, sh, st, offset_, dtype_);
}

Tensor Tensor::unsqueeze(int64_t dim) const {
  dim = normalize_dim(dim, 1);
  Shape sh = shape_, st = strides_;
  int64_t s = 1;
  if (dim < ndim() && !mul_ok(shape_[dim], strides_[dim], &s)) s = strides_[dim];
  sh.insert(sh.begin() + dim, 1);
  st.insert(st.begin() + dim, s);
  return Tensor(storage_, sh, st, offset_, dtype_);
}

Tensor Tensor::squeeze(int64_t dim) const {
  dim = normalize_dim(dim);
  if (shape_[dim] != 1) return *this;
  Shape sh = shape_, st = strides_;
  sh.erase(sh.begin() + dim);
  st.erase(st.begin() + dim);
  return Tensor(storage_, sh, st, offset_, dtype_);
}

Tensor Tensor::expand(const Shape& shape) const {
  const int64_t n = static_cast<int64_t>(shape.size());
  if (n < ndim())
    throw std::invalid_argument("expand: the target shape " + shape_str(shape) +
                                " has fewer dimensions than the tensor's " + shape_str(shape_));
  Shape sh(n), st(n);
  for (int64_t i = n - 1; i >= 0; --i) {
    const int64_t j = i - (n - ndim());
    const int64_t want = shape[i];
    if (j < 0) {
      if (want < 0)
        throw std::invalid_argument("expand: -1 is not allowed for a new leading dimension");
      sh[i] = want;
      st[i] = 0;
      continue;
    }
    const int64_t have = shape_[j];
    if (want == -1 || want == have) {
      sh[i] = have;
      st[i] = strides_[j];
    } else if (have == 1) {
      if (want < 0) throw std::invalid_argument("expand: negative size in " + shape_str(shape));
      sh[i] = want;
      st[i] = 0;
    } else {
      throw std::invalid_argument("expand: the size of dimension " + std::to_string(j) + " (" +
                                  std::to_string(have) + ") must match the target " +
                                  std::to_string(want) + " or be 1 (tensor " + shape_str(shape_) +
                                  " -> " + shape_str(shape) + ")");
    }
  }
  return Tensor(storage_, sh, st, offset_, dtype_);
}

Shape Tensor::infer_shape(const Shape& shape) const {
  Shape out = shape;
  int64_t infer = -1;
  bool has_zero = false;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      if (infer >= 0)
        throw std::invalid_argument("only one dimension can be -1 in " + shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else if (out[i] < 0) {
      throw std::invalid_argument("invalid shape " + shape_str(shape));
    } else if (out[i] == 0) {
      has_zero = true;
    }
  }
  int64_t known = 1;
  if (has_zero) {
    known = 0;
  } else {
    for (size_t i = 0; i < out.size(); ++i)
      if (static_cast<int64_t>(i) != infer && !mul_ok(known, out[i], &known))
        throw std::invalid_argument("shape " + shape_str(shape) +
                                    " has more elements than fit in 64 bits");
  }
  const int64_t n = numel();
  if (infer >= 0) {
    if (known == 0 || n % known != 0)
      throw std::invalid_argument("shape " + shape_str(shape) + " is invalid for a tensor of " +
                                  std::to_string(n) + " elements");
    out[infer] = n / known;
  } else if (known != n) {
    throw std::invalid_argument("shape " + shape_str(shape) + " is invalid for a tensor of " +
                                std::to_string(n) + " elements");
  }
  return out;
}

// The stride computation of PyTorch's `view` (ATen computeStride): a view exists when
// each chunk of old dimensions that is merged or split is itself contiguous.
Tensor Tensor::view_or_null(const Shape& shape) const {
  const Shape newshape = infer_shape(shape);
  if (numel() == 0 || ndim() == 0)  // a 0-d tensor: every view of it has size-1 dims
    return Tensor(storage_, newshape, contiguous_strides(newshape), offset_, dtype_);
  Shape newstrides(newshape.size());
  int64_t view_d = static_cast<int64_t>(newshape.size()) - 1;
  int64_t chunk_base_stride = strides_.empty() ? 1 : strides_.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t tensor_d = ndim() - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= shape_[tensor_d];  // <= numel(): no overflow
    int64_t chunk_stride = 0;
    const bool fits = mul_ok(tensor_numel, chunk_base_stride, &chunk_stride);
    if (tensor_d == 0 ||
        (shape_[tensor_d - 1] != 1 && (!fits || strides_[tensor_d - 1] != chunk_stride))) {
      while (view_d >= 0 && (view_numel < tensor_numel || newshape[view_d] == 1)) {
        newstrides[view_d] = view_numel * chunk_base_stride;
        view_numel *= newshape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return Tensor();
      if (tensor_d > 0) {
        chunk_base_stride = strides_[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return Tensor();
  return Tensor(storage_, newshape, newstrides, offset_, dtype_);
}

Tensor Tensor::view(const Shape& shape) const {
  Tensor t = view_or_null(shape);
  if (!t.defined())
    throw std::invalid_argument("view of shape " + shape_str(shape) +
                                " is not possible for a tensor of shape " + shape_str(shape_) +
                                " with strides " + shape_str(strides_) +
                                "; use reshape(), which copies");
  return t;
}

bool byte_extent(const Tensor& t, uintptr_t* lo, uintptr_t* hi) {
  *lo = *hi = 0;
  if (!t.defined()) return false;
  int64_t elo = 0, ehi = 0;  // element offsets reached below and above the first element
  if (!strided_extent(t.shape(), t.strides(), &elo, &ehi)) return false;
  const int64_t isz = t.itemsize();
  int64_t down = 0, up = 0;
  if (!mul_ok(-elo, isz, &down) || !add_ok(ehi, 1, &up) || !mul_ok(up, isz, &up)) {
    *lo = 0;  // cannot happen for a tensor inside its storage; be conservative anyway
    *hi = UINTPTR_MAX;
    return true;
  }
  const auto base = reinterpret_cast<uintptr_t>(t.data_ptr());
  *lo = base >= static_cast<uintptr_t>(down) ? base - static_cast<uintptr_t>(down) : 0;
  *hi = UINTPTR_MAX - base >= static_cast<uintptr_t>(up) ? base + static_cast<uintptr_t>(up)
                                                         : UINTPTR_MAX;
  return true;
}

bool may_overlap(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.device() != b.device()) return false;
  uintptr_t alo = 0, ahi = 0, blo = 0, bhi = 0;
  if (!byte_extent(a, &alo, &ahi) || !byte_extent(b, &blo, &bhi)) return false;
  return alo < bhi && blo < ahi;
}

bool same_elements(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.device() != b.device()) return false;
  if (a.data_ptr() != b.data_ptr() || a.itemsize() != b.itemsize() || a.shape() != b.shape())
    return false;
  for (size_t i = 0; i < a.shape().size(); ++i)
    if (a.shape()[i] > 1 && a.strides()[i] != b.strides()[i]) return false;
  return true;
}

bool has_internal_overlap(const Tensor& t) {
  if (!t.defined()) return false;
  for (const int64_t n : t.shape())
    if (n == 0) return false;  // no elements: nothing shared
  // Sort the dimensions of size > 1 by |stride|: the view is free of self-overlap when
  // each stride exceeds the extent reached by all the smaller ones (a sufficient test,
  // exact for every view castlab's own view ops make).
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, size)
  for (size_t i = 0; i < t.shape().size(); ++i) {
    const int64_t n = t.shape()[i];
    if (n > 1) {
      const int64_t s = t.strides()[i];
      if (s == 0) return true;
      if (s == INT64_MIN) return true;
      dims.emplace_back(s < 0 ? -s : s, n);
    }
  }
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;  // largest element offset reached by the dimensions so far
  for (const auto& d : dims) {
    if (d.first <= reach) return true;
    int64_t ext = 0;
    if (__builtin_mul_overflow(d.second - 1, d.first, &ext) ||
        __builtin_add_overflow(reach, ext, &reach))
      return true;
  }
  return false;
}

}  // namespace cl
