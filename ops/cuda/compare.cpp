// castlab.numerics.compare on the GPU: one thread per leaf of NumPy's pairwise tree computes
// the leaf's statistics (ops/scalar/compare.h, the CPU's code), then one launch per level of
// the tree combines the nodes of that level (children before parents); the host reads the root.
#include "ops/compare.h"

#include <stdexcept>
#include <string>

#include "core/cuda/driver.h"
#include "core/tensor.h"
#include "ops/cuda/kernel_cache.h"

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

}  // namespace cuda
}  // namespace cl
