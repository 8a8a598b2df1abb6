// DLPack export (castlab Tensor -> PyCapsule) and import (PyCapsule -> castlab Tensor).
//
// Export convention: dl_tensor.data = tensor.data_ptr() (the first element) and
// byte_offset = 0; strides are always filled, in elements. The managed struct, the
// shared_ptr that keeps the storage alive, and the shape and strides arrays are one
// allocation; manager_ctx points at that block.
#include <cstring>
#include <new>
#include <string>

#include "core/checked.h"
#include "core/cuda/driver.h"
#include "core/dlpack.h"
#include "python/src/bindings.h"

namespace dl = cl::dl;
using cl::Shape;
using cl::Tensor;

namespace {

// ---- dtype and device mapping ------------------------------------------------------

dl::DLDataType to_dl_dtype(cl::DTypeCode code) {
  switch (code) {
    case cl::kFloat64: return {dl::kDLFloat, 64, 1};
    case cl::kFloat32: return {dl::kDLFloat, 32, 1};
    case cl::kFloat16: return {dl::kDLFloat, 16, 1};
    case cl::kBFloat16: return {dl::kDLBfloat, 16, 1};
    case cl::kFloat8E4M3FN: return {dl::kDLFloat8_e4m3fn, 8, 1};
    case cl::kFloat8E5M2: return {dl::kDLFloat8_e5m2, 8, 1};
    case cl::kBool: return {dl::kDLBool, 8, 1};
    case cl::kInt32: return {dl::kDLInt, 32, 1};
    case cl::kInt64: return {dl::kDLInt, 64, 1};
  }
  throw cl::type_error("castlab dtype has no DLPack equivalent");
}

// A readable name for a DLPack dtype, for error messages ("complex64", "uint8x4").
std::string dl_dtype_name(dl::DLDataType t) {
  std::string base;
  const std::string bits = std::to_string(t.bits);
  switch (t.code) {
    case dl::kDLInt: base = "int" + bits; break;
    case dl::kDLUInt: base = "uint" + bits; break;
    case dl::kDLFloat: base = "float" + bits; break;
    case dl::kDLOpaqueHandle: base = "opaque_handle" + bits; break;
    case dl::kDLBfloat: base = "bfloat" + bits; break;
    case dl::kDLComplex: base = "complex" + bits; break;
    case dl::kDLBool: base = "bool" + bits; break;
    case dl::kDLFloat8_e3m4: base = "float8_e3m4"; break;
    case dl::kDLFloat8_e4m3: base = "float8_e4m3"; break;
    case dl::kDLFloat8_e4m3b11fnuz: base = "float8_e4m3b11fnuz"; break;
    case dl::kDLFloat8_e4m3fn: base = "float8_e4m3fn"; break;
    case dl::kDLFloat8_e4m3fnuz: base = "float8_e4m3fnuz"; break;
    case dl::kDLFloat8_e5m2: base = "float8_e5m2"; break;
    case dl::kDLFloat8_e5m2fnuz: base = "float8_e5m2fnuz"; break;
    case dl::kDLFloat8_e8m0fnu: base = "float8_e8m0fnu"; break;
    case dl::kDLFloat6_e2m3fn: base = "float6_e2m3fn"; break;
    case dl::kDLFloat6_e3m2fn: base = "float6_e3m2fn"; break;
    case dl::kDLFloat4_e2m1fn: base = "float4_e2m1fn"; break;
    default: base = "code" + std::to_string(t.code) + "_bits" + bits; break;
  }
  if (t.lanes != 1) base += "x" + std::to_string(t.lanes);
  return base + " (code=" + std::to_string(t.code) + ", bits=" + bits +
         ", lanes=" + std::to_string(t.lanes) + ")";
}

cl::DTypeCode from_dl_dtype(dl::DLDataType t) {
  if (t.lanes == 1) {
    switch (t.code) {
      case dl::kDLFloat:
        if (t.bits == 64) return cl::kFloat64;
        if (t.bits == 32) return cl::kFloat32;
        if (t.bits == 16) return cl::kFloat16;
        break;
      case dl::kDLBfloat:
        if (t.bits == 16) return cl::kBFloat16;
        break;
      case dl::kDLFloat8_e4m3fn:
        if (t.bits == 8) return cl::kFloat8E4M3FN;
        break;
      case dl::kDLFloat8_e5m2:
        if (t.bits == 8) return cl::kFloat8E5M2;
        break;
      case dl::kDLBool:
        if (t.bits == 8) return cl::kBool;
        break;
      case dl::kDLInt:
        if (t.bits == 32) return cl::kInt32;
        if (t.bits == 64) return cl::kInt64;
        break;
      default: break;
    }
  }
  throw cl::type_error("unsupported DLPack dtype " + dl_dtype_name(t) +
                       "; castlab supports float64, float32, float16, bfloat16, "
                       "float8_e4m3fn, float8_e5m2, bool, int32 and int64");
}

dl::DLDevice to_dl_device(cl::Device d) {
  if (d.type == cl::DeviceType::CPU) return {dl::kDLCPU, 0};
  return {dl::kDLCUDA, d.index};
}

cl::Device from_dl_device(dl::DLDevice d) {
  switch (d.device_type) {
    case dl::kDLCPU:
    case dl::kDLCUDAHost:  // pinned host memory: ordinary CPU memory to castlab
      return {cl::DeviceType::CPU, 0};
    case dl::kDLCUDA: return {cl::DeviceType::CUDA, d.device_id};
    default: break;
  }
  throw cl::buffer_error("unsupported DLPack device type " +
                         std::to_string(static_cast<int>(d.device_type)));
}

// ---- export --------------------------------------------------------------------------

// One heap block per export: managed struct, storage owner, then shape and strides.
template <class Managed>
struct ExportBlock {
  Managed managed;
  std::shared_ptr<cl::Storage> storage;
  // The consumer's CUDA stream (0: none). When the consumer releases the capsule, castlab's
  // stream waits for the work the consumer queued so far: the memory may go back to
  // castlab's allocator, and its next user must not overwrite it under a pending read.
  uintptr_t consumer_stream = 0;
  int64_t* dims() { return reinterpret_cast<int64_t*>(this + 1); }
};
static_assert(sizeof(ExportBlock<dl::DLManagedTensor>) % alignof(int64_t) == 0, "dims alignment");
static_assert(sizeof(ExportBlock<dl::DLManagedTensorVersioned>) % alignof(int64_t) == 0,
              "dims alignment");

// The managed deleter. It needs no GIL: dropping the storage reference either frees
// castlab's own memory or runs a storage deleter that takes the GIL itself.
template <class Managed>
void export_deleter(Managed* self) {
  if (self == nullptr) return;
  auto* block = static_cast<ExportBlock<Managed>*>(self->manager_ctx);
  if (block->consumer_stream != 0 && block->storage &&
      block->storage->device.type == cl::DeviceType::CUDA)
    cl::cuda::stream_wait_for_noexcept(block->consumer_stream, block->storage->device.index);
  block->~ExportBlock<Managed>();
  ::operator delete(static_cast<void*>(block));
}

template <class Managed>
Managed* make_export(const Tensor& t) {
  const int64_t ndim = t.ndim();
  const size_t bytes =
      sizeof(ExportBlock<Managed>) + 2 * static_cast<size_t>(ndim) * sizeof(int64_t);
  void* raw = ::operator new(bytes);
  auto* block = new (raw) ExportBlock<Managed>();
  block->storage = t.storage();
  int64_t* shape = block->dims();
  int64_t* strides = shape + ndim;
  for (int64_t i = 0; i < ndim; ++i) {
    shape[i] = t.shape()[i];
    strides[i] = t.strides()[i];
  }
  Managed& m = block->managed;
  std::memset(static_cast<void*>(&m), 0, sizeof(Managed));
  m.manager_ctx = block;
  m.deleter = &export_deleter<Managed>;
  dl::DLTensor& d = m.dl_tensor;
  d.data = t.data_ptr();
  d.device = to_dl_device(t.device());
  d.ndim = static_cast<int32_t>(ndim);
  d.dtype = to_dl_dtype(t.dtype());
  d.shape = ndim ? shape : nullptr;
  d.strides = ndim ? strides : nullptr;
  d.byte_offset = 0;
  return &m;
}

// Capsule destructor: frees the managed tensor only if no consumer took it (a consumer
// renames the capsule to "used_..."). Must not disturb a Python exception in flight.
extern "C" void dlpack_capsule_destructor(PyObject* capsule) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  if (PyCapsule_IsValid(capsule, dl::kCapsuleNameVersioned)) {
    auto* m = static_cast<dl::DLManagedTensorVersioned*>(
        PyCapsule_GetPointer(capsule, dl::kCapsuleNameVersioned));
    if (m && m->deleter) m->deleter(m);
  } else if (PyCapsule_IsValid(capsule, dl::kCapsuleName)) {
    auto* m = static_cast<dl::DLManagedTensor*>(PyCapsule_GetPointer(capsule, dl::kCapsuleName));
    if (m && m->deleter) m->deleter(m);
  }
  PyErr_Clear();
  PyErr_Restore(type, value, tb);
}

py::object to_dlpack(const Tensor& t, bool versioned, bool readonly_flag, bool copied,
                     uintptr_t consumer_stream) {
  if (!t.defined()) throw std::invalid_argument("to_dlpack: undefined tensor");
  if (versioned) {
    auto* m = make_export<dl::DLManagedTensorVersioned>(t);
    static_cast<ExportBlock<dl::DLManagedTensorVersioned>*>(m->manager_ctx)->consumer_stream =
        consumer_stream;
    m->version = {dl::kMajorVersion, dl::kMinorVersion};
    m->flags = 0;
    if (readonly_flag || t.readonly()) m->flags |= dl::kFlagReadOnly;
    if (copied) m->flags |= dl::kFlagIsCopied;
    PyObject* cap = PyCapsule_New(m, dl::kCapsuleNameVersioned, &dlpack_capsule_destructor);
    if (!cap) {
      m->deleter(m);
      throw py::error_already_set();
    }
    return py::reinterpret_steal<py::object>(cap);
  }
  // The legacy struct cannot say "read-only"; refuse rather than hand out writable
  // access to read-only memory (NumPy does the same).
  if (readonly_flag || t.readonly())
    throw cl::buffer_error(
        "cannot export a read-only tensor as a legacy (unversioned) DLPack capsule: "
        "ask for max_version >= (1, 0) so the READ_ONLY flag can be carried");
  auto* m = make_export<dl::DLManagedTensor>(t);
  static_cast<ExportBlock<dl::DLManagedTensor>*>(m->manager_ctx)->consumer_stream = consumer_stream;
  PyObject* cap = PyCapsule_New(m, dl::kCapsuleName, &dlpack_capsule_destructor);
  if (!cap) {
    m->deleter(m);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(cap);
}

// ---- import --------------------------------------------------------------------------

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// Calls a producer's deleter exactly once, with the GIL (producers' deleters may touch
// Python objects). Leaks when the interpreter is gone or shutting down.
template <class Managed>
void call_producer_deleter(Managed* m) {
  if (m == nullptr || m->deleter == nullptr) return;
  if (!Py_IsInitialized() || interpreter_finalizing()) return;
  py::gil_scoped_acquire gil;
  m->deleter(m);
}

// No process can map more than 2**57 bytes (x86-64 5-level paging and AArch64 52-bit
// addresses are below that): a DLPack view reaching further from its data pointer
// cannot be valid, whatever its producer says.
constexpr int64_t kMaxAddressableBytes = int64_t(1) << 57;

// castlab's own exports know their extent: the storage the capsule keeps alive.
template <class Managed>
const cl::Storage* castlab_export_storage(const Managed* m) {
  if (m->deleter != &export_deleter<Managed>) return nullptr;
  return static_cast<const ExportBlock<Managed>*>(m->manager_ctx)->storage.get();
}

template <class Managed>
Tensor import_managed(PyObject* capsule, Managed* m, const char* used_name, bool readonly,
                      bool stream_tracked) {
  const dl::DLTensor& d = m->dl_tensor;
  auto bad = [](const std::string& msg) { throw cl::buffer_error("from_dlpack: " + msg); };
  // Validate everything before taking ownership: on error the capsule stays unconsumed
  // and its own destructor releases the producer's memory.
  const cl::DTypeCode code = from_dl_dtype(d.dtype);
  const cl::Device device = from_dl_device(d.device);
  if (d.ndim < 0) bad("DLPack tensor has negative ndim " + std::to_string(d.ndim));
  if (d.ndim > 64) bad("DLPack tensor has " + std::to_string(d.ndim) + " dimensions (at most 64)");
  if (d.ndim > 0 && d.shape == nullptr) bad("DLPack tensor has no shape");
  const size_t ndim = static_cast<size_t>(d.ndim);
  Shape shape(d.shape, d.shape + ndim);
  for (int64_t s : shape)
    if (s < 0) bad("DLPack tensor has a negative dimension in shape " + cl::shape_str(shape));
  Shape strides;
  int64_t lo = 0, hi = 0;
  bool empty = true;
  try {
    cl::numel_of(shape, "from_dlpack");
    strides = d.strides ? Shape(d.strides, d.strides + ndim) : cl::contiguous_strides(shape);
    empty = !cl::strided_extent(shape, strides, &lo, &hi);
  } catch (const std::invalid_argument& e) {
    bad(std::string("DLPack tensor is invalid: ") + e.what());
  }

  // The storage spans the memory the view touches (strides may be negative): it starts
  // at the lowest address, and the view's offset (in elements) points at element 0.
  const int64_t isz = cl::itemsize(code);
  if (d.byte_offset > static_cast<uint64_t>(kMaxAddressableBytes))
    bad("DLPack byte_offset " + std::to_string(d.byte_offset) + " is beyond any address space");
  const uintptr_t first = reinterpret_cast<uintptr_t>(d.data) + d.byte_offset;
  int64_t span = 0, lo_bytes = 0;
  if (!empty) {
    if (d.data == nullptr) bad("DLPack tensor has a null data pointer");
    if (!cl::span_bytes(lo, hi, isz, &span) || !cl::mul_ok(lo, isz, &lo_bytes) ||
        span > kMaxAddressableBytes || lo_bytes < -kMaxAddressableBytes ||
        static_cast<int64_t>(d.byte_offset) + lo_bytes + span > kMaxAddressableBytes)
      bad("DLPack tensor of shape " + cl::shape_str(shape) + " with strides " +
          cl::shape_str(strides) + " and byte_offset " + std::to_string(d.byte_offset) +
          " spans more memory than any address space has");
    if (first % static_cast<uintptr_t>(isz) != 0)
      bad("DLPack tensor data (pointer + byte_offset) is not aligned to its " +
          std::to_string(isz) + "-byte items");
    if (lo_bytes < 0 && static_cast<uintptr_t>(-lo_bytes) > first)
      bad("DLPack tensor strides reach below address 0");
    if (const cl::Storage* own = castlab_export_storage(m)) {
      const uintptr_t base = reinterpret_cast<uintptr_t>(own->data);
      const uintptr_t start = first + static_cast<uintptr_t>(lo_bytes);
      if (start < base || start - base > own->nbytes ||
          static_cast<uint64_t>(span) > own->nbytes - (start - base))
        bad("DLPack tensor (a castlab export) reaches outside its memory of " +
            std::to_string(own->nbytes) + " bytes");
    }
  }
  auto storage = std::make_shared<cl::Storage>();
  storage->data = reinterpret_cast<char*>(first + static_cast<uintptr_t>(lo_bytes));
  storage->nbytes = empty ? 0 : static_cast<size_t>(span);
  storage->device = device;
  storage->readonly = readonly;
  Tensor t(storage, shape, strides, -lo, code);  // checks the view against the storage

  // Take ownership: from here the storage's deleter releases the producer's memory.
  if (PyCapsule_SetName(capsule, used_name) != 0) throw py::error_already_set();
  // On CUDA, castlab's kernels may still read the memory when its last castlab tensor goes:
  // they finish before the producer gets its memory back (its allocator may reuse it at
  // once on a stream that does not wait for castlab's). A host synchronisation, unless the
  // producer's allocator tracks castlab's stream itself (stream_tracked: the importer told
  // PyTorch's caching allocator, Tensor.record_stream, to wait for castlab's queued work).
  // Also none for memory castlab's own allocator handed out (a castlab export coming back
  // through another library): castlab reuses it only in its stream's order.
  const bool cuda =
      device.type == cl::DeviceType::CUDA && !stream_tracked &&
      !(storage->nbytes > 0 &&
        cl::cuda::owns_memory(device.index, reinterpret_cast<uintptr_t>(storage->data),
                              storage->nbytes));
  const int dev_index = device.index;
  storage->deleter = [m, cuda, dev_index](void*) {
    if (cuda) {
      try {
        cl::cuda::synchronize(dev_index);
      } catch (...) {  // a failed device: the producer still gets its memory back
      }
    }
    call_producer_deleter(m);
  };
  return t;
}

Tensor from_dlpack_capsule(py::handle obj, bool stream_tracked) {
  PyObject* cap = obj.ptr();
  if (!PyCapsule_CheckExact(cap))
    throw cl::type_error(std::string("from_dlpack_capsule expects a PyCapsule, got ") +
                         Py_TYPE(cap)->tp_name);
  if (PyCapsule_IsValid(cap, dl::kCapsuleNameVersioned)) {
    auto* m = static_cast<dl::DLManagedTensorVersioned*>(
        PyCapsule_GetPointer(cap, dl::kCapsuleNameVersioned));
    if (m->version.major != dl::kMajorVersion)
      throw cl::buffer_error("unsupported DLPack version " + std::to_string(m->version.major) +
                             "." + std::to_string(m->version.minor) +
                             " (castlab understands major version 1)");
    if (m->flags & dl::kFlagIsSubbyteTypePadded)
      throw cl::type_error("unsupported DLPack tensor: padded sub-byte type");
    return import_managed(cap, m, dl::kUsedCapsuleNameVersioned,
                          (m->flags & dl::kFlagReadOnly) != 0, stream_tracked);
  }
  if (PyCapsule_IsValid(cap, dl::kCapsuleName)) {
    auto* m = static_cast<dl::DLManagedTensor*>(PyCapsule_GetPointer(cap, dl::kCapsuleName));
    return import_managed(cap, m, dl::kUsedCapsuleName, false, stream_tracked);
  }
  const char* name = PyCapsule_GetName(cap);
  if (name == nullptr) PyErr_Clear();
  const std::string sname = name ? name : "<unnamed>";
  if (sname == dl::kUsedCapsuleName || sname == dl::kUsedCapsuleNameVersioned)
    throw std::invalid_argument("DLPack capsule was already consumed (its name is '" + sname +
                                "')");
  throw cl::type_error("not a DLPack capsule: its name is '" + sname +
                       "' (expected 'dltensor_versioned' or 'dltensor')");
}

}  // namespace

void bind_dlpack(py::module_& m) {
  m.def("to_dlpack", &to_dlpack, py::arg("tensor"), py::arg("versioned"),
        py::arg("readonly_flag") = false, py::arg("copied") = false, py::arg("consumer_stream") = 0,
        "Export a tensor as a DLPack capsule ('dltensor_versioned' v1.1, or legacy "
        "'dltensor'). Zero-copy: the capsule keeps the storage alive; on CUDA, when the "
        "consumer releases it, castlab's stream waits for consumer_stream's work (0: none).");
  m.def("from_dlpack_capsule", &from_dlpack_capsule, py::arg("capsule"),
        py::arg("stream_tracked") = false,
        "Consume a 'dltensor_versioned' or 'dltensor' capsule into a Tensor (zero-copy). "
        "stream_tracked: the producer's allocator waits for castlab's stream itself (PyTorch "
        "after Tensor.record_stream), so releasing the memory needs no synchronisation.");
  // Facts about castlab's declaration of the ABI, checked against other producers in tests.
  m.def("_dlpack_abi", [] {
    py::dict d;
    d["version"] = py::make_tuple(dl::kMajorVersion, dl::kMinorVersion);
    d["sizeof_DLTensor"] = sizeof(dl::DLTensor);
    d["sizeof_DLManagedTensor"] = sizeof(dl::DLManagedTensor);
    d["sizeof_DLManagedTensorVersioned"] = sizeof(dl::DLManagedTensorVersioned);
    d["offsetof_versioned_flags"] = offsetof(dl::DLManagedTensorVersioned, flags);
    d["offsetof_versioned_dl_tensor"] = offsetof(dl::DLManagedTensorVersioned, dl_tensor);
    d["offsetof_dl_tensor_dtype"] = offsetof(dl::DLTensor, dtype);
    d["offsetof_dl_tensor_strides"] = offsetof(dl::DLTensor, strides);
    d["offsetof_dl_tensor_byte_offset"] = offsetof(dl::DLTensor, byte_offset);
    py::dict codes;
    for (int c = 0; c < cl::kNumDTypes; ++c) {
      const auto code = static_cast<cl::DTypeCode>(c);
      const dl::DLDataType t = to_dl_dtype(code);
      codes[cl::dtype_info(code).name] = py::make_tuple(t.code, t.bits, t.lanes);
    }
    d["dtypes"] = codes;
    d["flag_read_only"] = dl::kFlagReadOnly;
    d["flag_is_copied"] = dl::kFlagIsCopied;
    d["flag_is_subbyte_type_padded"] = dl::kFlagIsSubbyteTypePadded;
    return d;
  });
}
