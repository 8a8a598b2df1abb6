// MKL VML through libtorch_cpu.so (torch_vml.h says why and what).
#include "ops/cpu/torch_vml.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>

#include "ops/op_table.h"

namespace cl {
namespace {

// mkl_vml_defines.h: VML_HA 0x2, VML_FTZDAZ_OFF 0x140000, VML_ERRMODE_IGNORE 0x100 (the
// mode vml.h passes). MKL_INT is int in the LP64 MKL PyTorch links (vml.h L102-108); the
// mode argument is MKL_INT64.
constexpr long long kVmlMode = 0x2 | 0x140000 | 0x100;
using VmlS = void (*)(int, const float*, float*, long long);
using VmlD = void (*)(int, const double*, double*, long long);

// The ops, in vml.h's names (exp -> Exp, log -> Ln, ...).
struct VmlOp {
  int op;
  const char* name;
};
constexpr VmlOp kVmlOps[] = {{kOpExp, "Exp"},   {kOpLog, "Ln"},  {kOpSin, "Sin"},  {kOpCos, "Cos"},
                             {kOpTanh, "Tanh"}, {kOpErf, "Erf"}, {kOpSqrt, "Sqrt"}};
constexpr int kNumVmlOps = sizeof(kVmlOps) / sizeof(kVmlOps[0]);

using NumThreads = int (*)();
NumThreads g_num_threads = nullptr;
// MKL_Set_Num_Threads_Local (mkl_service.h; the lowercase symbol is the Fortran binding,
// by pointer): castlab calls VML from its own worker threads,
// one block at a time, as PyTorch calls it inside its parallel_for chunks; MKL's own
// threading on top made each small call fork and join MKL's pool (fp32 exp on 16M
// elements, 2 threads: 182 ms, torch 25 ms). Each call runs on the calling thread alone,
// and that thread's previous setting is put back (VML's results do not depend on it).
using SetLocalThreads = int (*)(int);
SetLocalThreads g_set_local_threads = nullptr;
VmlS g_s[kOpCount] = {};
VmlD g_d[kOpCount] = {};
std::atomic<bool> g_loaded{false};
std::mutex g_mu;

// VML takes an MKL_INT length: castlab's blocks are far shorter, but split anyway.
template <typename T, typename F>
void call_split(F f, const T* in, T* out, int64_t n) {
  const int prev = g_set_local_threads ? g_set_local_threads(1) : 0;
  constexpr int64_t kMax = 1 << 30;
  for (int64_t i = 0; i < n; i += kMax)
    f(static_cast<int>(n - i < kMax ? n - i : kMax), in + i, out + i, kVmlMode);
  if (g_set_local_threads) g_set_local_threads(prev);
}

}  // namespace

std::string torch_vml_load(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_loaded.load()) return "";
  // RTLD_NOLOAD: only a library the process already has (torch imported); never loads it.
  void* lib = dlopen(path.c_str(), RTLD_NOLOAD | RTLD_LAZY | RTLD_LOCAL);
  if (!lib) return path + " is not loaded in this process (import torch first)";
  VmlS s[kNumVmlOps];
  VmlD d[kNumVmlOps];
  for (int i = 0; i < kNumVmlOps; ++i) {
    const std::string ns = std::string("vms") + kVmlOps[i].name;
    const std::string nd = std::string("vmd") + kVmlOps[i].name;
    s[i] = reinterpret_cast<VmlS>(dlsym(lib, ns.c_str()));
    d[i] = reinterpret_cast<VmlD>(dlsym(lib, nd.c_str()));
    if (!s[i] || !d[i]) {
      dlclose(lib);
      return path + " does not export " + (s[i] ? nd : ns) + " (a PyTorch build without MKL)";
    }
  }
  // at::get_num_threads(), by its Itanium-mangled name (ATen/Parallel.h); optional
  g_num_threads = reinterpret_cast<NumThreads>(dlsym(lib, "_ZN2at15get_num_threadsEv"));
  g_set_local_threads = reinterpret_cast<SetLocalThreads>(dlsym(lib, "MKL_Set_Num_Threads_Local"));
  for (int i = 0; i < kNumVmlOps; ++i) {
    g_s[kVmlOps[i].op] = s[i];
    g_d[kVmlOps[i].op] = d[i];
  }
  g_loaded.store(true);  // the handle stays open: the functions live as long as the process
  return "";
}

bool torch_vml_loaded() { return g_loaded.load(); }

int torch_num_threads() { return g_loaded.load() && g_num_threads ? g_num_threads() : 0; }

bool torch_vml(int op, const float* in, float* out, int64_t n) {
  if (!g_loaded.load() || op < 0 || op >= kOpCount || !g_s[op]) return false;
  call_split(g_s[op], in, out, n);
  return true;
}

bool torch_vml(int op, const double* in, double* out, int64_t n) {
  if (!g_loaded.load() || op < 0 || op >= kOpCount || !g_d[op]) return false;
  call_split(g_d[op], in, out, n);
  return true;
}

}  // namespace cl
