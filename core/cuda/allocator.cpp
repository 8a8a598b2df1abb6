// Caching allocator for CUDA device memory. Requests are rounded (512 B below 1 MiB,
// 2 MiB above) and freed blocks go to a per-device free list, from which later requests
// of the same rounded size are served without cuMemAlloc. All of
// castlab's work on a device runs on one stream, so a block freed while kernels that use
// it are still queued can be handed out again at once: the next user's work is queued
// behind them.
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "core/cuda/driver.h"
#include "core/tensor.h"

namespace cl {
namespace cuda {

namespace {

constexpr size_t kSmall = 1u << 20;  // below: 512-byte granularity
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = 2u << 20;  // above: 2 MiB granularity
constexpr int kMaxDev = 64;

size_t round_size(size_t n) {
  if (n <= kSmall) return (n + kSmallRound - 1) / kSmallRound * kSmallRound;
  return (n + kLargeRound - 1) / kLargeRound * kLargeRound;
}

std::string human(size_t n) {
  char buf[64];
  if (n >= (1ull << 30))
    snprintf(buf, sizeof buf, "%.2f GiB", n / double(1ull << 30));
  else if (n >= (1ull << 20))
    snprintf(buf, sizeof buf, "%.2f MiB", n / double(1ull << 20));
  else
    snprintf(buf, sizeof buf, "%zu bytes", n);
  return buf;
}

class CudaCachingAllocator : public Allocator {
 public:
  std::shared_ptr<Storage> allocate(size_t nbytes, Device device) override {
    if (device.type != DeviceType::CUDA)
      throw std::logic_error("CUDA allocator: not a CUDA device");
    const int d = device.index;
    auto st = std::make_shared<Storage>();
    st->device = device;
    st->nbytes = nbytes;
    if (nbytes == 0) return st;
    set_device(d);
    const size_t size = round_size(nbytes);
    CUdeviceptr p = take(d, size);
    st->data = reinterpret_cast<void*>(static_cast<uintptr_t>(p));
    // 16 bytes of captures: std::function keeps them inline (no allocation per tensor).
    const uint64_t size_dev = static_cast<uint64_t>(size) << 8 | static_cast<uint64_t>(d);
    st->deleter = [this, size_dev](void* ptr) {
      give(static_cast<int>(size_dev & 0xff), reinterpret_cast<uintptr_t>(ptr),
           static_cast<size_t>(size_dev >> 8));
    };
    return st;
  }

  // Is [p, p + n) inside a block castlab's allocator handed out on device d?
  bool owns(int d, uintptr_t p, size_t n) {
    std::lock_guard<std::mutex> lk(mu_);
    const auto& live = dev_[d].live;
    auto it = live.upper_bound(static_cast<CUdeviceptr>(p));
    if (it == live.begin()) return false;
    --it;
    return p >= it->first && p - it->first <= it->second && n <= it->second - (p - it->first);
  }

  MemoryStats stats(int d) {
    std::lock_guard<std::mutex> lk(mu_);
    return dev_[d].stats;
  }

  void empty_cache_all() {
    for (int d = 0; d < kMaxDev; ++d) {
      bool any;
      {
        std::lock_guard<std::mutex> lk(mu_);
        any = !dev_[d].free.empty();
      }
      if (any) release_cached(d);
    }
  }

 private:
  struct Dev {
    std::multimap<size_t, CUdeviceptr> free;
    std::map<CUdeviceptr, size_t> live;  // blocks handed out: start -> size
    MemoryStats stats;
  };

  CUdeviceptr take(int d, size_t size) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      Dev& dv = dev_[d];
      auto it = dv.free.find(size);  // sizes are rounded to classes: reuse exact matches
      if (it != dv.free.end()) {
        CUdeviceptr p = it->second;
        dv.free.erase(it);
        dv.stats.cache_hits++;
        note_alloc(dv, size);
        dv.live.emplace(p, size);
        return p;
      }
    }
    const DriverApi& drv = driver();
    CUdeviceptr p = 0;
    CUresult r = drv.cuMemAlloc(&p, size);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      release_cached(d);
      r = drv.cuMemAlloc(&p, size);
    }
    if (r != CUDA_SUCCESS) {
      MemoryStats s;
      {
        std::lock_guard<std::mutex> lk(mu_);
        dev_[d].stats.num_ooms++;
        s = dev_[d].stats;
      }
      size_t free_b = 0, total_b = 0;
      drv.cuMemGetInfo(&free_b, &total_b);
      if (r == CUDA_ERROR_OUT_OF_MEMORY)
        throw std::runtime_error("CUDA out of memory: tried to allocate " + human(size) +
                                 " on cuda:" + std::to_string(d) + " (" + human(free_b) +
                                 " free of " + human(total_b) + "; castlab holds " +
                                 human(s.allocated) + " in tensors)");
      check(r, "cuMemAlloc");
    }
    std::lock_guard<std::mutex> lk(mu_);
    Dev& dv = dev_[d];
    dv.stats.reserved += size;
    dv.stats.num_device_allocs++;
    note_alloc(dv, size);
    dv.live.emplace(p, size);
    return p;
  }

  static void note_alloc(Dev& dv, size_t size) {
    dv.stats.allocated += size;
    dv.stats.num_allocs++;
    if (dv.stats.allocated > dv.stats.peak_allocated) dv.stats.peak_allocated = dv.stats.allocated;
  }

  void give(int d, uintptr_t p, size_t size) {
    std::lock_guard<std::mutex> lk(mu_);
    Dev& dv = dev_[d];
    dv.free.emplace(size, static_cast<CUdeviceptr>(p));
    dv.live.erase(static_cast<CUdeviceptr>(p));
    dv.stats.allocated -= size;
    dv.stats.num_frees++;
  }

  // Returns every cached block of device d to the driver (after castlab's queued work
  // on d has finished, since that work may still use them).
  void release_cached(int d) {
    std::multimap<size_t, CUdeviceptr> blocks;
    {
      std::lock_guard<std::mutex> lk(mu_);
      blocks.swap(dev_[d].free);
    }
    if (blocks.empty()) return;
    const DriverApi& drv = driver();
    set_device(d);
    drv.cuStreamSynchronize(stream(d));  // errors surface at the next synchronize
    size_t freed = 0;
    for (auto& b : blocks) {
      drv.cuMemFree(b.second);
      freed += b.first;
    }
    std::lock_guard<std::mutex> lk(mu_);
    dev_[d].stats.reserved -= freed;
  }

  std::mutex mu_;
  Dev dev_[kMaxDev];
};

// Never destroyed: storages may be released during interpreter shutdown.
CudaCachingAllocator* g_alloc = nullptr;
std::once_flag g_once;

CudaCachingAllocator& alloc() {
  std::call_once(g_once, [] { g_alloc = new CudaCachingAllocator(); });
  return *g_alloc;
}

}  // namespace

void register_cuda_allocator() { register_allocator(DeviceType::CUDA, &alloc()); }

MemoryStats memory_stats(int device) {
  if (device < 0 || device >= kMaxDev) throw std::invalid_argument("bad CUDA device index");
  return alloc().stats(device);
}

bool owns_memory(int device, uintptr_t ptr, size_t nbytes) {
  if (device < 0 || device >= kMaxDev || g_alloc == nullptr) return false;
  return alloc().owns(device, ptr, nbytes);
}

void empty_cache() {
  if (!is_available()) return;
  alloc().empty_cache_all();
}

}  // namespace cuda
}  // namespace cl
