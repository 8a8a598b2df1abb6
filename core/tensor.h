// Tensor: a strided view (shape, strides in elements, offset) of shared storage.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace cl {

// Raised for wrong types (maps to Python TypeError).
struct type_error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
// Raised when a buffer cannot be shared as asked (maps to Python BufferError).
struct buffer_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class DeviceType : int32_t { CPU = 0, CUDA = 1 };

struct Device {
  DeviceType type = DeviceType::CPU;
  int32_t index = 0;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;
  // "cpu", "cuda" (= cuda:0) or "cuda:N" with N a non-negative integer; anything else
  // throws std::invalid_argument.
  static Device parse(const std::string& s);
};

// A block of memory. It frees itself (through `deleter`) when the last tensor viewing
// it goes away; memory owned by another library (NumPy, DLPack producers) is released
// by a deleter that drops the reference on that library's object.
struct Storage {
  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  bool readonly = false;
  std::function<void(void*)> deleter;
  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (deleter) deleter(data);
  }
};

// Allocates device memory; CPU is built in, CUDA registers itself when it loads.
struct Allocator {
  virtual ~Allocator() = default;
  virtual std::shared_ptr<Storage> allocate(size_t nbytes, Device device) = 0;
};
void register_allocator(DeviceType type, Allocator* allocator);
Allocator* get_allocator(DeviceType type);
// Host memory cache (large blocks are reused rather than returned to the OS).
void cpu_empty_cache();

using Shape = std::vector<int64_t>;

// The element count; throws std::invalid_argument ("<fn>: shape [...] has more elements
// than fit in 64 bits") when it does not fit.
int64_t numel_of(const Shape& shape, const char* fn = nullptr);
Shape contiguous_strides(const Shape& shape);
std::string shape_str(const Shape& shape);
// The element offsets a strided view touches, relative to its first element: [lo, hi]
// (strides may be negative). Returns false for an empty view (a zero-size dimension).
// Throws std::invalid_argument when the extent does not fit in 64 bits.
bool strided_extent(const Shape& shape, const Shape& strides, int64_t* lo, int64_t* hi);
// Broadcast two shapes as NumPy does; throws std::invalid_argument naming both.
Shape broadcast_shapes(const Shape& a, const Shape& b);

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset,
         DTypeCode dtype);

  static Tensor empty(const Shape& shape, DTypeCode dtype, Device device = {});

  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  DTypeCode dtype() const { return dtype_; }
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const { return numel_of(shape_); }
  int64_t itemsize() const { return cl::itemsize(dtype_); }
  Device device() const { return storage_->device; }
  bool readonly() const { return storage_->readonly; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool defined() const { return storage_ != nullptr; }
  void* data_ptr() const { return static_cast<char*>(storage_->data) + offset_ * itemsize(); }
  bool is_contiguous() const;
  int64_t size(int64_t dim) const { return shape_[normalize_dim(dim)]; }

  // Views (no copy).
  Tensor as_strided(const Shape& shape, const Shape& strides, int64_t offset) const;
  Tensor slice(int64_t dim, int64_t start, int64_t stop, int64_t step) const;  // clamped
  Tensor select(int64_t dim, int64_t index) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor expand(const Shape& shape) const;  // -1 keeps a dimension
  // A view with the new shape, or an undefined tensor when no view exists (then
  // reshape copies). One dimension may be -1.
  Tensor view_or_null(const Shape& shape) const;
  Tensor view(const Shape& shape) const;  // throws when impossible
  Shape infer_shape(const Shape& shape) const;

  int64_t normalize_dim(int64_t dim, int64_t ndim_plus = 0) const;

 private:
  void check_bounds() const;  // the view's elements lie inside its storage (or throws)

  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;
  DTypeCode dtype_ = kFloat32;
};

// Memory overlap of two views, by address range (the views may come from different
// Storage objects that share memory: NumPy or DLPack imports of one buffer).
// byte_extent: the bytes [*lo, *hi) a view reaches through its strides (negative strides
// included); false for a view with no elements, or when the extent does not fit the
// address space (then treat it as reaching everything).
bool byte_extent(const Tensor& t, uintptr_t* lo, uintptr_t* hi);
// True when a and b are on the same device and their byte ranges intersect (a range
// test: views that interleave without sharing an element also count as overlapping).
bool may_overlap(const Tensor& a, const Tensor& b);
// True when a and b are the same elements in the same order: same first byte, item size,
// shape and strides (strides of size-1 dimensions ignored). Writing a into b elementwise
// is then safe without a temporary.
bool same_elements(const Tensor& a, const Tensor& b);
// True when two different indices of t reach the same memory (a stride-0 dimension of
// size > 1, e.g. an expanded view), or the overlap cannot be ruled out cheaply.
bool has_internal_overlap(const Tensor& t);

}  // namespace cl
