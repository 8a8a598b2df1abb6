#include "core/cuda/driver.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>

namespace cl {
namespace cuda {

namespace {

constexpr int kMaxDevices = 64;

std::mutex g_mu;

// ---- driver ----
bool g_driver_tried = false;
bool g_driver_ok = false;
std::atomic<bool> g_driver_ready{false};  // g_driver_ok, readable without the lock
std::string g_driver_error;
DriverApi g_drv{};
int g_ndev = 0;

struct DevState {
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;
  int cc_major = 0, cc_minor = 0, sms = 0, smem_optin = 0, l2 = 0;
  std::atomic<const char*> last_kernel{nullptr};  // a name owned by the kernel cache
};
DevState g_dev[kMaxDevices];

// ---- nvrtc ----
bool g_nvrtc_tried = false;
bool g_nvrtc_ok = false;
std::string g_nvrtc_error;
std::string g_nvrtc_path;
NvrtcApi g_rtc{};
std::vector<std::string> g_nvrtc_candidates;

template <typename F>
bool sym(void* lib, const char* name, F* out, std::string* missing) {
  void* p = dlsym(lib, name);
  *out = reinterpret_cast<F>(p);
  if (!p && missing) {
    if (!missing->empty()) *missing += ", ";
    *missing += name;
  }
  return p != nullptr;
}

void load_driver_locked() {
  if (g_driver_tried) return;
  g_driver_tried = true;
  // CASTLAB_LIBCUDA: another driver library (testing with a stub driver).
  const char* override_lib = std::getenv("CASTLAB_LIBCUDA");
  void* lib =
      dlopen(override_lib && *override_lib ? override_lib : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  const char* e1 = lib ? nullptr : dlerror();
  const std::string first_error = e1 ? e1 : "not found";
  if (!lib) lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    g_driver_error = std::string("the CUDA driver library libcuda.so.1 could not be loaded (") +
                     first_error + "): install the NVIDIA driver (on a machine with an NVIDIA GPU)";
    return;
  }
  std::string missing;
  DriverApi& d = g_drv;
  sym(lib, "cuInit", &d.cuInit, &missing);
  sym(lib, "cuDriverGetVersion", &d.cuDriverGetVersion, &missing);
  sym(lib, "cuDeviceGetCount", &d.cuDeviceGetCount, &missing);
  sym(lib, "cuDeviceGet", &d.cuDeviceGet, &missing);
  sym(lib, "cuDeviceGetName", &d.cuDeviceGetName, &missing);
  sym(lib, "cuDeviceGetAttribute", &d.cuDeviceGetAttribute, &missing);
  sym(lib, "cuDeviceTotalMem_v2", &d.cuDeviceTotalMem, &missing);
  sym(lib, "cuDevicePrimaryCtxRetain", &d.cuDevicePrimaryCtxRetain, &missing);
  sym(lib, "cuCtxSetCurrent", &d.cuCtxSetCurrent, &missing);
  sym(lib, "cuCtxGetCurrent", &d.cuCtxGetCurrent, &missing);
  sym(lib, "cuCtxSynchronize", &d.cuCtxSynchronize, &missing);
  sym(lib, "cuStreamCreate", &d.cuStreamCreate, &missing);
  sym(lib, "cuStreamSynchronize", &d.cuStreamSynchronize, &missing);
  sym(lib, "cuStreamWaitEvent", &d.cuStreamWaitEvent, &missing);
  sym(lib, "cuEventCreate", &d.cuEventCreate, &missing);
  sym(lib, "cuEventRecord", &d.cuEventRecord, &missing);
  if (!sym(lib, "cuEventDestroy_v2", &d.cuEventDestroy, nullptr))
    sym(lib, "cuEventDestroy", &d.cuEventDestroy, &missing);
  sym(lib, "cuMemAlloc_v2", &d.cuMemAlloc, &missing);
  sym(lib, "cuMemFree_v2", &d.cuMemFree, &missing);
  sym(lib, "cuMemGetInfo_v2", &d.cuMemGetInfo, &missing);
  sym(lib, "cuMemcpyHtoDAsync_v2", &d.cuMemcpyHtoDAsync, &missing);
  sym(lib, "cuMemcpyDtoHAsync_v2", &d.cuMemcpyDtoHAsync, &missing);
  sym(lib, "cuMemcpyDtoDAsync_v2", &d.cuMemcpyDtoDAsync, &missing);
  sym(lib, "cuMemcpyPeerAsync", &d.cuMemcpyPeerAsync, &missing);
  sym(lib, "cuModuleLoadData", &d.cuModuleLoadData, &missing);
  sym(lib, "cuModuleGetFunction", &d.cuModuleGetFunction, &missing);
  sym(lib, "cuLinkCreate_v2", &d.cuLinkCreate, &missing);
  sym(lib, "cuLinkAddData_v2", &d.cuLinkAddData, &missing);
  sym(lib, "cuLinkComplete", &d.cuLinkComplete, &missing);
  sym(lib, "cuLinkDestroy", &d.cuLinkDestroy, &missing);
  sym(lib, "cuFuncSetAttribute", &d.cuFuncSetAttribute, &missing);
  sym(lib, "cuLaunchKernel", &d.cuLaunchKernel, &missing);
  sym(lib, "cuGetErrorString", &d.cuGetErrorString, &missing);
  sym(lib, "cuGetErrorName", &d.cuGetErrorName, &missing);
  sym(lib, "cuLaunchKernelEx", &d.cuLaunchKernelEx, nullptr);  // optional
  if (!missing.empty()) {
    g_driver_error = "the CUDA driver library is too old (missing " + missing +
                     "): install a newer NVIDIA driver";
    return;
  }
  CUresult r = d.cuInit(0);
  if (r != CUDA_SUCCESS) {
    g_driver_error = "cuInit failed (" + error_string(r) +
                     "): is an NVIDIA GPU present and the NVIDIA driver installed?";
    return;
  }
  int n = 0;
  r = d.cuDeviceGetCount(&n);
  if (r != CUDA_SUCCESS || n <= 0) {
    g_driver_error = "the CUDA driver found no GPU";
    return;
  }
  g_ndev = n < kMaxDevices ? n : kMaxDevices;
  g_driver_ok = true;
  g_driver_ready.store(true, std::memory_order_release);
}

void load_nvrtc_locked() {
  if (g_nvrtc_tried) return;
  g_nvrtc_tried = true;
  std::vector<std::string> cands;
  if (const char* e = std::getenv("CASTLAB_NVRTC")) cands.push_back(e);
  for (const auto& c : g_nvrtc_candidates) cands.push_back(c);
  for (const char* env : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* e = std::getenv(env)) cands.push_back(std::string(e) + "/lib64");
  cands.push_back("/usr/local/cuda/lib64");
  const char* names[] = {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2"};
  std::vector<std::string> tries;
  for (const auto& c : cands) {
    // A candidate is a file or a directory.
    if (c.size() > 3 && c.find(".so") != std::string::npos) {
      tries.push_back(c);
    } else {
      for (const char* n : names) tries.push_back(c + "/" + n);
    }
  }
  for (const char* n : names) tries.push_back(n);
  void* lib = nullptr;
  std::string errors;
  for (const auto& t : tries) {
    lib = dlopen(t.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      g_nvrtc_path = t;
      break;
    }
  }
  if (!lib) {
    g_nvrtc_error =
        "NVRTC (libnvrtc.so) could not be found: pip install nvidia-cuda-nvrtc-cu12 (or "
        "nvidia-cuda-nvrtc for CUDA 13), or install the CUDA toolkit, or set CASTLAB_NVRTC "
        "to the library's path";
    return;
  }
  std::string missing;
  NvrtcApi& r = g_rtc;
  sym(lib, "nvrtcVersion", &r.nvrtcVersion, &missing);
  sym(lib, "nvrtcGetErrorString", &r.nvrtcGetErrorString, &missing);
  sym(lib, "nvrtcCreateProgram", &r.nvrtcCreateProgram, &missing);
  sym(lib, "nvrtcDestroyProgram", &r.nvrtcDestroyProgram, &missing);
  sym(lib, "nvrtcCompileProgram", &r.nvrtcCompileProgram, &missing);
  sym(lib, "nvrtcGetProgramLogSize", &r.nvrtcGetProgramLogSize, &missing);
  sym(lib, "nvrtcGetProgramLog", &r.nvrtcGetProgramLog, &missing);
  sym(lib, "nvrtcGetPTXSize", &r.nvrtcGetPTXSize, &missing);
  sym(lib, "nvrtcGetPTX", &r.nvrtcGetPTX, &missing);
  sym(lib, "nvrtcGetCUBINSize", &r.nvrtcGetCUBINSize, nullptr);
  sym(lib, "nvrtcGetCUBIN", &r.nvrtcGetCUBIN, nullptr);
  sym(lib, "nvrtcGetNumSupportedArchs", &r.nvrtcGetNumSupportedArchs, nullptr);
  sym(lib, "nvrtcGetSupportedArchs", &r.nvrtcGetSupportedArchs, nullptr);
  if (!missing.empty()) {
    g_nvrtc_error = "the NVRTC library at " + g_nvrtc_path + " lacks " + missing +
                    ": install a newer NVRTC (pip install nvidia-cuda-nvrtc-cu12)";
    return;
  }
  g_nvrtc_ok = true;
}

}  // namespace

void set_nvrtc_candidates(const std::vector<std::string>& paths) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_nvrtc_candidates = paths;
  if (g_nvrtc_tried && !g_nvrtc_ok) g_nvrtc_tried = false;  // try again with the new list
}

bool is_available() {
  try {
    std::lock_guard<std::mutex> lk(g_mu);
    load_driver_locked();
    return g_driver_ok;
  } catch (...) {
    return false;
  }
}

std::string unavailable_reason() {
  std::lock_guard<std::mutex> lk(g_mu);
  load_driver_locked();
  return g_driver_ok ? std::string() : g_driver_error;
}

int device_count() { return is_available() ? g_ndev : 0; }

const DriverApi& driver() {
  if (g_driver_ready.load(std::memory_order_acquire)) return g_drv;  // hot path: no lock
  std::lock_guard<std::mutex> lk(g_mu);
  load_driver_locked();
  if (!g_driver_ok) throw std::runtime_error("CUDA is not available: " + g_driver_error);
  return g_drv;
}

const NvrtcApi& nvrtc() {
  std::lock_guard<std::mutex> lk(g_mu);
  load_nvrtc_locked();
  if (!g_nvrtc_ok) throw std::runtime_error(g_nvrtc_error);
  return g_rtc;
}

std::string nvrtc_path() {
  nvrtc();
  return g_nvrtc_path;
}

void nvrtc_version(int* major, int* minor) {
  const NvrtcApi& r = nvrtc();
  r.nvrtcVersion(major, minor);
}

std::string error_string(CUresult r) {
  const char* name = nullptr;
  const char* str = nullptr;
  if (g_drv.cuGetErrorName) g_drv.cuGetErrorName(r, &name);
  if (g_drv.cuGetErrorString) g_drv.cuGetErrorString(r, &str);
  std::string s = name ? name : ("CUDA error " + std::to_string(r));
  if (str) s += std::string(": ") + str;
  return s;
}

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  if (r == CUDA_ERROR_OUT_OF_MEMORY)
    throw std::runtime_error(std::string("CUDA out of memory in ") + what + ": " + error_string(r));
  throw std::runtime_error(std::string("CUDA error in ") + what + ": " + error_string(r));
}

static DevState& dev_state(int index) {
  const DriverApi& d = driver();
  if (index < 0 || index >= g_ndev)
    throw std::invalid_argument("CUDA device " + std::to_string(index) + " does not exist (" +
                                std::to_string(g_ndev) + " device(s) found)");
  DevState& s = g_dev[index];
  if (!s.ctx) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (!s.ctx) {
      CUdevice dev;
      check(d.cuDeviceGet(&dev, index), "cuDeviceGet");
      CUcontext ctx = nullptr;
      check(d.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
      check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
      check(d.cuDeviceGetAttribute(&s.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
            "cuDeviceGetAttribute");
      check(d.cuDeviceGetAttribute(&s.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
            "cuDeviceGetAttribute");
      check(d.cuDeviceGetAttribute(&s.sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
            "cuDeviceGetAttribute");
      check(d.cuDeviceGetAttribute(&s.l2, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, dev),
            "cuDeviceGetAttribute");
      check(d.cuDeviceGetAttribute(&s.smem_optin,
                                   CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev),
            "cuDeviceGetAttribute");
      CUstream st = nullptr;
      check(d.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
      s.stream = st;
      s.ctx = ctx;  // last: marks the state complete
    }
  }
  return s;
}

// Makes the device's primary context current unless it already is. The driver is asked
// (cuCtxGetCurrent, a thread-local read) rather than a cache of castlab's own: other
// libraries in the process (PyTorch, CuPy) switch the current device too, and a launch
// on cuda:1 with cuda:0's context current fails with an invalid-handle error.
static void make_current(const DevState& s) {
  CUcontext cur = nullptr;
  if (g_drv.cuCtxGetCurrent(&cur) != CUDA_SUCCESS || cur != s.ctx)
    check(g_drv.cuCtxSetCurrent(s.ctx), "cuCtxSetCurrent");
}

void set_device(int index) { make_current(dev_state(index)); }

CUstream launch_stream(int index) {
  DevState& s = dev_state(index);
  make_current(s);
  return s.stream;
}

CUstream stream(int index) { return dev_state(index).stream; }
CUcontext context(int index) { return dev_state(index).ctx; }

int multiprocessor_count(int index) { return dev_state(index).sms; }
int l2_cache_bytes(int index) { return dev_state(index).l2; }
int max_shared_per_block(int index) { return dev_state(index).smem_optin; }

void compute_capability(int index, int* major, int* minor) {
  DevState& s = dev_state(index);
  *major = s.cc_major;
  *minor = s.cc_minor;
}

void note_launch(int index, const char* kernel_name) {
  if (index >= 0 && index < kMaxDevices)
    g_dev[index].last_kernel.store(kernel_name, std::memory_order_relaxed);
}

void synchronize(int index) {
  if (!is_available()) return;
  for (int i = 0; i < g_ndev; ++i) {
    if (index >= 0 && i != index) continue;
    DevState& s = g_dev[i];
    if (!s.ctx) continue;
    set_device(i);
    CUresult r = g_drv.cuStreamSynchronize(s.stream);
    if (r != CUDA_SUCCESS) {
      const char* lk = s.last_kernel.load(std::memory_order_relaxed);
      std::string k = lk && *lk ? std::string(lk) : std::string("(none)");
      throw std::runtime_error("CUDA error at synchronisation of cuda:" + std::to_string(i) +
                               " (last kernel launched: " + k + "): " + error_string(r));
    }
  }
}

namespace {
// One event per thread and device, recorded and waited on at once: a stream-to-stream
// wait captures the event's state when cuStreamWaitEvent is called, so the event can be
// recorded again right after, and per thread no other record can come in between. This
// saves a cuEventCreate/cuEventDestroy pair on every wait (castlab.torch makes several
// per region).
struct WaitEvents {
  CUevent ev[kMaxDevices] = {};
  ~WaitEvents() {
    for (CUevent e : ev)
      if (e) g_drv.cuEventDestroy(e);
  }
};

CUresult order_after(CUstream waiter, CUstream producer, int index) {
  thread_local WaitEvents events;
  CUevent& ev = events.ev[index];
  if (!ev) {
    CUresult r = g_drv.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS) {
      ev = nullptr;
      return r;
    }
  }
  CUresult r = g_drv.cuEventRecord(ev, producer);
  if (r != CUDA_SUCCESS) return r;
  return g_drv.cuStreamWaitEvent(waiter, ev, 0);
}
}  // namespace

void stream_wait_for(uintptr_t other, int index) {
  DevState& s = dev_state(index);
  make_current(s);
  check(order_after(s.stream, reinterpret_cast<CUstream>(other), index),
        "cuStreamWaitEvent (castlab's stream after another)");
}

void stream_wait_for_noexcept(uintptr_t other, int index) noexcept {
  try {
    stream_wait_for(other, index);
  } catch (...) {
  }
}

void other_stream_wait(uintptr_t other, int index) {
  DevState& s = dev_state(index);
  make_current(s);
  check(order_after(reinterpret_cast<CUstream>(other), s.stream, index),
        "cuStreamWaitEvent (another stream after castlab's)");
}

}  // namespace cuda
}  // namespace cl
