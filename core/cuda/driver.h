// Run-time access to the CUDA driver API (libcuda.so.1) and NVRTC, loaded with dlopen,
// so castlab builds without a CUDA toolkit and imports on machines without a GPU.
// Only the handful of types and functions castlab uses are declared here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cl {
namespace cuda {

// ---- driver API types (ABI-compatible declarations) ----
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
struct CUctx_st;
struct CUstream_st;
struct CUmod_st;
struct CUfunc_st;
struct CUevent_st;
using CUcontext = CUctx_st*;
using CUstream = CUstream_st*;
using CUmodule = CUmod_st*;
using CUfunction = CUfunc_st*;
using CUevent = CUevent_st*;
struct CUlinkState_st;
using CUlinkState = CUlinkState_st*;
using CUjit_option = int;
using CUjitInputType = int;
constexpr CUjitInputType CU_JIT_INPUT_PTX = 1;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr CUresult CUDA_ERROR_NOT_READY = 600;
constexpr CUresult CUDA_ERROR_NOT_SUPPORTED = 801;
constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
constexpr unsigned CU_EVENT_DISABLE_TIMING = 0x2;
constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39;
constexpr int CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97;
constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
// cuLaunchKernelEx (CUDA 12+): a launch with attributes. Only programmatic stream
// serialization is used (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION).
constexpr int CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6;
struct CUlaunchAttribute {
  int id;
  char pad[4];
  union alignas(8) {
    char bytes[64];
    int programmaticStreamSerializationAllowed;
  } value;
};
struct CUlaunchConfig {
  unsigned gridDimX, gridDimY, gridDimZ;
  unsigned blockDimX, blockDimY, blockDimZ;
  unsigned sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;
  unsigned numAttrs;
};
static_assert(sizeof(CUlaunchAttribute) == 72, "CUlaunchAttribute layout (cuda.h)");

// ---- NVRTC types ----
using nvrtcResult = int;
struct _nvrtcProgram;
using nvrtcProgram = _nvrtcProgram*;

struct DriverApi {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDeviceTotalMem)(size_t*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuStreamCreate)(CUstream*, unsigned);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned);
  CUresult (*cuEventCreate)(CUevent*, unsigned);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemGetInfo)(size_t*, size_t*);
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*cuMemcpyPeerAsync)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  // linking separately compiled device code (ops/cuda/kernel_cache.cpp: CUDA's double pow)
  CUresult (*cuLinkCreate)(unsigned, CUjit_option*, void**, CUlinkState*);
  CUresult (*cuLinkAddData)(CUlinkState, CUjitInputType, void*, size_t, const char*, unsigned,
                            CUjit_option*, void**);
  CUresult (*cuLinkComplete)(CUlinkState, void**, size_t*);
  CUresult (*cuLinkDestroy)(CUlinkState);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  // may be null (a driver older than CUDA 12): launches then go through cuLaunchKernel
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**);
};

struct NvrtcApi {
  nvrtcResult (*nvrtcVersion)(int*, int*);
  const char* (*nvrtcGetErrorString)(nvrtcResult);
  nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram*, const char*, const char*, int,
                                    const char* const*, const char* const*);
  nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram*);
  nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char* const*);
  nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t*);
  nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char*);
  nvrtcResult (*nvrtcGetPTXSize)(nvrtcProgram, size_t*);
  nvrtcResult (*nvrtcGetPTX)(nvrtcProgram, char*);
  nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t*);  // may be null (old NVRTC)
  nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char*);
  nvrtcResult (*nvrtcGetNumSupportedArchs)(int*);  // may be null
  nvrtcResult (*nvrtcGetSupportedArchs)(int*);
};

// Candidate directories/files for NVRTC, set from Python (the nvidia-cuda-nvrtc wheel).
void set_nvrtc_candidates(const std::vector<std::string>& paths);

// True when libcuda loads, cuInit succeeds and at least one device exists. Never throws.
bool is_available();
// Why is_available() is false ("" when it is true).
std::string unavailable_reason();
int device_count();  // 0 when unavailable; never throws

// Loads the driver (throws with advice when impossible) and returns its function table.
const DriverApi& driver();
// Loads NVRTC (throws with advice) and returns its function table.
const NvrtcApi& nvrtc();
std::string nvrtc_path();
void nvrtc_version(int* major, int* minor);

// Throws std::runtime_error("CUDA error in <what>: <name>: <string>") unless ok.
void check(CUresult r, const char* what);
std::string error_string(CUresult r);

// Makes device `index`'s primary context current on this thread (retaining it once).
void set_device(int index);
// castlab's stream on `index` (non-blocking, created once), after set_device(index).
CUstream stream(int index);
// set_device(index) and stream(index) in one call (the launch path).
CUstream launch_stream(int index);
// Compute capability of device `index`.
void compute_capability(int index, int* major, int* minor);
// Streaming multiprocessors of device `index`.
int multiprocessor_count(int index);
// Bytes of L2 cache of device `index`.
int l2_cache_bytes(int index);
// The most shared memory one thread block of device `index` may ask for (bytes, with the
// opt-in above the default 48 KiB).
int max_shared_per_block(int index);
CUcontext context(int index);

// Wait for all of castlab's work on `index` (or every device when index < 0); an error
// from an earlier asynchronous launch is reported with the name of the last kernel
// launched there.
void synchronize(int index);
// castlab's stream on `index` waits for the work queued so far on `other` (a CUstream
// handle: 1 and 2 are the legacy and per-thread default streams). Never throws: for
// deleters (DLPack exports released by their consumer).
void stream_wait_for_noexcept(uintptr_t other, int index) noexcept;
// The same, raising on a driver error.
void stream_wait_for(uintptr_t other, int index);
// The stream `other` waits for the work queued so far on castlab's stream on `index`.
void other_stream_wait(uintptr_t other, int index);
// Name of the kernel last launched on device `index` (for error messages). Only the
// pointer is kept: the name must live as long as the process (the kernel cache's do).
void note_launch(int index, const char* kernel_name);

// ---- caching allocator (allocator.cpp) ----
struct MemoryStats {
  uint64_t allocated = 0;  // bytes in blocks handed out (rounded sizes)
  uint64_t reserved = 0;   // bytes obtained from cuMemAlloc (in use + cached)
  uint64_t peak_allocated = 0;
  uint64_t num_allocs = 0;         // requests served
  uint64_t num_device_allocs = 0;  // cuMemAlloc calls
  uint64_t cache_hits = 0;         // requests served from the cache
  uint64_t num_frees = 0;
  uint64_t num_ooms = 0;
};
MemoryStats memory_stats(int device);
void empty_cache();
// Does [ptr, ptr + nbytes) lie in memory castlab's caching allocator handed out on `device`
// (and not freed)? Such memory is reused only in the order of castlab's own stream.
bool owns_memory(int device, uintptr_t ptr, size_t nbytes);
void register_cuda_allocator();  // idempotent

// ---- ops/cuda/backend.cpp ----
// Registers CUDA's backend record (ops/backend.h): the executor and the row, reduce,
// index and nll kernels.
void register_cuda_runner();  // idempotent
}  // namespace cuda
}  // namespace cl
