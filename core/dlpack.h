// castlab's own declaration of the DLPack 1.1 ABI, written from the specification
// (https://dmlc.github.io/dlpack/latest/). Only the memory layout and the numeric values
// matter for interoperability; the names follow the specification so that readers can
// match them, but live in namespace cl::dl so that they never clash with another
// library's dlpack.h in the same translation unit.
//
// Layout assumptions: x86-64 / aarch64 LP64 (8-byte pointers, 4-byte C enums). The
// static_asserts below pin every size and field offset.
#pragma once
#include <cstddef>
#include <cstdint>

#define CL_DLPACK_MAJOR_VERSION 1
#define CL_DLPACK_MINOR_VERSION 1

namespace cl::dl {

constexpr uint32_t kMajorVersion = CL_DLPACK_MAJOR_VERSION;
constexpr uint32_t kMinorVersion = CL_DLPACK_MINOR_VERSION;

// Capsule names of the Python exchange protocol. A consumer renames the capsule to the
// "used_" name when it takes ownership.
constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kCapsuleNameVersioned = "dltensor_versioned";
constexpr const char* kUsedCapsuleName = "used_dltensor";
constexpr const char* kUsedCapsuleNameVersioned = "used_dltensor_versioned";

struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};

// A C enum: 4 bytes, stored as such inside DLDevice.
enum DLDeviceType : int32_t {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,  // pinned host memory allocated by cudaMallocHost
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,  // cudaMallocManaged
  kDLOneAPI = 14,
  kDLWebGPU = 15,
  kDLHexagon = 16,
  kDLMAIA = 17,
};

struct DLDevice {
  DLDeviceType device_type;
  int32_t device_id;
};

// Stored in the uint8_t DLDataType::code.
enum DLDataTypeCode : uint8_t {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLOpaqueHandle = 3,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
  // DLPack 1.1: 8-bit floats (bits = 8), then 6- and 4-bit floats.
  kDLFloat8_e3m4 = 7,
  kDLFloat8_e4m3 = 8,
  kDLFloat8_e4m3b11fnuz = 9,
  kDLFloat8_e4m3fn = 10,
  kDLFloat8_e4m3fnuz = 11,
  kDLFloat8_e5m2 = 12,
  kDLFloat8_e5m2fnuz = 13,
  kDLFloat8_e8m0fnu = 14,
  kDLFloat6_e2m3fn = 15,
  kDLFloat6_e3m2fn = 16,
  kDLFloat4_e2m1fn = 17,
};

struct DLDataType {
  uint8_t code;    // a DLDataTypeCode
  uint8_t bits;    // bits per lane
  uint16_t lanes;  // 1 for scalars
};

struct DLTensor {
  void* data;  // base pointer; the first element is at data + byte_offset
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;    // ndim entries
  int64_t* strides;  // ndim entries, in elements; may be NULL (compact row-major) before 1.2
  uint64_t byte_offset;
};

// Legacy (pre-1.0 ABI) managed tensor, exchanged in a capsule named "dltensor".
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);  // may be NULL
};

// Flag bits of DLManagedTensorVersioned::flags.
constexpr uint64_t kFlagReadOnly = uint64_t(1) << 0;
constexpr uint64_t kFlagIsCopied = uint64_t(1) << 1;
constexpr uint64_t kFlagIsSubbyteTypePadded = uint64_t(1) << 2;

// Versioned managed tensor (DLPack >= 1.0), exchanged in a capsule named
// "dltensor_versioned".
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);  // may be NULL
  uint64_t flags;
  DLTensor dl_tensor;
};

static_assert(sizeof(void*) == 8, "castlab's DLPack declaration assumes LP64");

static_assert(sizeof(DLPackVersion) == 8, "DLPackVersion size");
static_assert(offsetof(DLPackVersion, major) == 0, "DLPackVersion.major");
static_assert(offsetof(DLPackVersion, minor) == 4, "DLPackVersion.minor");

static_assert(sizeof(DLDeviceType) == 4, "DLDeviceType is a 4-byte C enum");
static_assert(sizeof(DLDevice) == 8, "DLDevice size");
static_assert(offsetof(DLDevice, device_type) == 0, "DLDevice.device_type");
static_assert(offsetof(DLDevice, device_id) == 4, "DLDevice.device_id");

static_assert(sizeof(DLDataType) == 4, "DLDataType size");
static_assert(offsetof(DLDataType, code) == 0, "DLDataType.code");
static_assert(offsetof(DLDataType, bits) == 1, "DLDataType.bits");
static_assert(offsetof(DLDataType, lanes) == 2, "DLDataType.lanes");

static_assert(sizeof(DLTensor) == 48, "DLTensor size");
static_assert(offsetof(DLTensor, data) == 0, "DLTensor.data");
static_assert(offsetof(DLTensor, device) == 8, "DLTensor.device");
static_assert(offsetof(DLTensor, ndim) == 16, "DLTensor.ndim");
static_assert(offsetof(DLTensor, dtype) == 20, "DLTensor.dtype");
static_assert(offsetof(DLTensor, shape) == 24, "DLTensor.shape");
static_assert(offsetof(DLTensor, strides) == 32, "DLTensor.strides");
static_assert(offsetof(DLTensor, byte_offset) == 40, "DLTensor.byte_offset");

static_assert(sizeof(DLManagedTensor) == 64, "DLManagedTensor size");
static_assert(offsetof(DLManagedTensor, dl_tensor) == 0, "DLManagedTensor.dl_tensor");
static_assert(offsetof(DLManagedTensor, manager_ctx) == 48, "DLManagedTensor.manager_ctx");
static_assert(offsetof(DLManagedTensor, deleter) == 56, "DLManagedTensor.deleter");

static_assert(sizeof(DLManagedTensorVersioned) == 80, "DLManagedTensorVersioned size");
static_assert(offsetof(DLManagedTensorVersioned, version) == 0, "DLManagedTensorVersioned.version");
static_assert(offsetof(DLManagedTensorVersioned, manager_ctx) == 8,
              "DLManagedTensorVersioned.manager_ctx");
static_assert(offsetof(DLManagedTensorVersioned, deleter) == 16,
              "DLManagedTensorVersioned.deleter");
static_assert(offsetof(DLManagedTensorVersioned, flags) == 24, "DLManagedTensorVersioned.flags");
static_assert(offsetof(DLManagedTensorVersioned, dl_tensor) == 32,
              "DLManagedTensorVersioned.dl_tensor");

}  // namespace cl::dl
