// castlab.numerics.compare on the GPU: one thread per leaf of NumPy's pairwise tree computes
// the leaf's statistics (ops/scalar/compare.h, the CPU's code), then one launch per level of
// the tree combines the nodes of that level (children before parents); the host reads the root.
#include "ops/compare.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/cuda/driver.h"
#include "core/tensor.h"
#include "ops/cuda/kernel_cache.h"
#include "ops/cuda/kernels.h"

namespace cl {
namespace cuda {

namespace {

constexpr int kLeafThreads = 128;
constexpr int kTreeThreads = 128;

}  // namespace

const char* const kCompareSource =
    "// castlab.numerics.compare (ops/cuda/compare.cpp)\n"
    "#include \"ops/scalar/compare.h\"\n"
    "extern \"C\" __global__ void cl_compare_leaves(cl::CmpParams P, const long long* lo,\n"
    "    long long L, double* D, long long* I) {\n"
    "  const long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (k >= L) return;\n"
    "  const int nd = cl::cmp_nd(P.nres), ni = cl::cmp_ni(P.nres);\n"
    "  cl::cmp_leaf(P, lo[k], lo[k + 1] - lo[k], D + k * nd, (int64_t*)I + k * ni);\n"
    "}\n"
    "extern \"C\" __global__ void cl_compare_tree(int nres, const long long* left,\n"
    "    const long long* right, long long begin, long long end, long long L, double* D,\n"
    "    long long* I) {\n"
    "  const long long i = begin + (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= end) return;\n"
    "  const int nd = cl::cmp_nd(nres), ni = cl::cmp_ni(nres);\n"
    "  const long long a = left[i], c = right[i], node = L + i;\n"
    "  cl::cmp_combine(nres, D + a * nd, (const int64_t*)I + a * ni, D + c * nd,\n"
    "                  (const int64_t*)I + c * ni, D + node * nd, (int64_t*)I + node * ni);\n"
    "}\n"
    // near_ties: one element per thread (grid-stride), the mask's count one atomic per warp
    "extern \"C\" __global__ void cl_near_ties(const void* ref, int ref_code, long long n,\n"
    "    int fmt, double fmax, double within, unsigned char* mask, double* dist,\n"
    "    unsigned long long* count) {\n"
    "  const cl::ExFormat f = cl::ex_format(fmt);\n"
    "  unsigned long long k = 0;\n"
    "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;\n"
    "       i += (long long)gridDim.x * blockDim.x) {\n"
    "    bool in = false;\n"
    "    dist[i] = cl::tie_distance(cl::cmp_load(ref, ref_code, i), f, fmax, within, &in);\n"
    "    mask[i] = in ? 1 : 0;\n"
    "    k += in ? 1 : 0;\n"
    "  }\n"
    "  for (int o = 16; o > 0; o >>= 1) k += __shfl_xor_sync(0xffffffffu, k, o);\n"
    "  if ((threadIdx.x & 31) == 0 && k) atomicAdd(count, k);\n"
    "}\n"
    "extern \"C\" __global__ void cl_tie_split(const void* a, int acode, const void* b,\n"
    "    int bcode, const unsigned char* mask, long long n, unsigned long long* out) {\n"
    "  long long tc[3] = {0, 0, 0};\n"
    "  const long long step = (long long)gridDim.x * blockDim.x;\n"
    "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)\n"
    "    cl::tie_split_range(a, acode, b, bcode, mask, i, i + 1, (int64_t*)tc);\n"
    "  for (int j = 0; j < 3; ++j) {\n"
    "    unsigned long long v = (unsigned long long)tc[j];\n"
    "    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "    if ((threadIdx.x & 31) == 0 && v) atomicAdd(out + j, v);\n"
    "  }\n"
    "}\n"
    "extern \"C\" __global__ void cl_ulp_error(const void* x, int xcode, const void* r,\n"
    "    int rcode, long long n, int fmt, double* out) {\n"
    "  const cl::ExFormat f = cl::ex_format(fmt);\n"
    "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;\n"
    "       i += (long long)gridDim.x * blockDim.x)\n"
    "    out[i] = cl::ulp_error_at(x, xcode, r, rcode, i, f);\n"
    "}\n"
    "extern \"C\" __global__ void cl_ulp_diff(const void* a, const void* b, int code,\n"
    "    long long n, long long* out, unsigned char* mask) {\n"
    "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;\n"
    "       i += (long long)gridDim.x * blockDim.x) {\n"
    "    bool m = false;\n"
    "    out[i] = cl::ulp_diff_at(a, b, code, i, &m);\n"
    "    mask[i] = m ? 1 : 0;\n"
    "  }\n"
    "}\n";

namespace {

Tensor upload(const std::vector<int64_t>& v, int device, CUstream stream) {
  const Tensor t = Tensor::empty({static_cast<int64_t>(std::max<size_t>(v.size(), 1))}, kInt64,
                                 Device{DeviceType::CUDA, device});
  if (!v.empty())
    check(driver().cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(t.data_ptr()), v.data(),
                                     v.size() * 8, stream),
          "cuMemcpyHtoDAsync");
  return t;
}

void launch(const CompiledKernel& k, int device, unsigned blocks, unsigned threads, CUstream stream,
            void** args) {
  const CUresult r =
      driver().cuLaunchKernel(k.fn, blocks, 1, 1, threads, 1, 1, 0, stream, args, nullptr);
  note_launch(device, k.name.c_str());
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("CUDA error launching " + k.name + ": " + error_string(r));
}

}  // namespace

CmpTotals compare_cuda(const CmpParams& P, int device) {
  cmp_check(P);
  const CmpTree t = cmp_tree(P.n);
  const int nd = cmp_nd(P.nres), ni = cmp_ni(P.nres);
  const int64_t L = t.leaves(), N = t.nodes();
  const CompiledKernel kl = get_kernel(device, "cl_compare_leaves", kCompareSource);
  const CompiledKernel kt = get_kernel(device, "cl_compare_tree", kCompareSource);
  const CUstream stream = launch_stream(device);
  const Device dev{DeviceType::CUDA, device};
  const Tensor D = Tensor::empty({N * nd}, kFloat64, dev);
  const Tensor I = Tensor::empty({N * ni}, kInt64, dev);
  const Tensor lo = upload(t.leaf_lo, device, stream);
  const Tensor left = upload(t.left, device, stream);
  const Tensor right = upload(t.right, device, stream);
  CmpParams p = P;
  void* dp = D.data_ptr();
  void* ip = I.data_ptr();
  const void* lop = lo.data_ptr();
  long long nleaves = L;
  void* leaf_args[] = {&p, &lop, &nleaves, &dp, &ip};
  launch(kl, device, static_cast<unsigned>((L + kLeafThreads - 1) / kLeafThreads), kLeafThreads,
         stream, leaf_args);
  // one launch per level of the tree (children before parents), each node one thread
  int nres = P.nres;
  const void* lp = left.data_ptr();
  const void* rp = right.data_ptr();
  long long begin = 0;
  for (const int64_t level_end : t.level_end) {
    long long end = level_end;
    void* tree_args[] = {&nres, &lp, &rp, &begin, &end, &nleaves, &dp, &ip};
    launch(kt, device, static_cast<unsigned>((end - begin + kTreeThreads - 1) / kTreeThreads),
           kTreeThreads, stream, tree_args);
    begin = end;
  }
  CmpTotals out;
  out.d.resize(static_cast<size_t>(nd));
  out.i.resize(static_cast<size_t>(ni));
  const int64_t root = N - 1;
  check(driver().cuMemcpyDtoHAsync(
            out.d.data(),
            reinterpret_cast<CUdeviceptr>(static_cast<double*>(D.data_ptr()) + root * nd),
            static_cast<size_t>(nd) * 8, stream),
        "cuMemcpyDtoHAsync");
  check(driver().cuMemcpyDtoHAsync(
            out.i.data(),
            reinterpret_cast<CUdeviceptr>(static_cast<int64_t*>(I.data_ptr()) + root * ni),
            static_cast<size_t>(ni) * 8, stream),
        "cuMemcpyDtoHAsync");
  synchronize(device);
  return out;
}

namespace {

// Blocks of 256 threads for a grid-stride loop over n elements: enough to fill the GPU.
unsigned stride_blocks(int64_t n, int device) {
  const int64_t want = (n + 255) / 256;
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>(want, int64_t(multiprocessor_count(device)) * 8)));
}

// The counters a kernel adds to: zeroed on the device, read back after it.
std::vector<int64_t> run_counted(const CompiledKernel& k, int device, int64_t n, int ncount,
                                 std::vector<void*> args) {
  const CUstream stream = launch_stream(device);
  const Tensor cnt = Tensor::empty({ncount}, kInt64, Device{DeviceType::CUDA, device});
  std::vector<int64_t> host(static_cast<size_t>(ncount), 0);
  check(driver().cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(cnt.data_ptr()), host.data(),
                                   host.size() * 8, stream),
        "cuMemcpyHtoDAsync");
  void* cp = cnt.data_ptr();
  args.push_back(&cp);
  if (n > 0) launch(k, device, stride_blocks(n, device), 256, stream, args.data());
  check(driver().cuMemcpyDtoHAsync(host.data(), reinterpret_cast<CUdeviceptr>(cnt.data_ptr()),
                                   host.size() * 8, stream),
        "cuMemcpyDtoHAsync");
  synchronize(device);
  return host;
}

}  // namespace

int64_t near_ties_cuda(const void* ref, int ref_code, int64_t n, int fmt, double fmax,
                       double within, uint8_t* mask, double* dist, int device) {
  const CompiledKernel k = get_kernel(device, "cl_near_ties", kCompareSource);
  long long nn = n;
  return run_counted(k, device, n, 1,
                     {&ref, &ref_code, &nn, &fmt, &fmax, &within, &mask, &dist})[0];
}

void tie_split_cuda(const void* a, int acode, const void* b, int bcode, const uint8_t* mask,
                    int64_t n, int64_t* out3, int device) {
  const CompiledKernel k = get_kernel(device, "cl_tie_split", kCompareSource);
  long long nn = n;
  const std::vector<int64_t> c = run_counted(k, device, n, 3, {&a, &acode, &b, &bcode, &mask, &nn});
  for (int j = 0; j < 3; ++j) out3[j] = c[static_cast<size_t>(j)];
}

void ulp_error_cuda(const void* x, int xcode, const void* r, int rcode, int64_t n, int fmt,
                    double* out, int device) {
  const CompiledKernel k = get_kernel(device, "cl_ulp_error", kCompareSource);
  long long nn = n;
  void* args[] = {&x, &xcode, &r, &rcode, &nn, &fmt, &out};
  if (n > 0) launch(k, device, stride_blocks(n, device), 256, launch_stream(device), args);
  synchronize(device);
}

void ulp_diff_cuda(const void* a, const void* b, int code, int64_t n, int64_t* out, uint8_t* mask,
                   int device) {
  const CompiledKernel k = get_kernel(device, "cl_ulp_diff", kCompareSource);
  long long nn = n;
  void* args[] = {&a, &b, &code, &nn, &out, &mask};
  if (n > 0) launch(k, device, stride_blocks(n, device), 256, launch_stream(device), args);
  synchronize(device);
}

}  // namespace cuda
}  // namespace cl
