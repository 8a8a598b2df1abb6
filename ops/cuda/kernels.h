// The CUDA kernels of the device-neutral steps (ops/reduce.h, index.h, loss.h, compare.h,
// exhaustive.h): their generated sources (tests compile them with NVRTC without a GPU) and
// their launches, which the runtime reaches through CUDA's backend record
// (ops/cuda/backend.cpp) and the bindings call directly (compare, exhaustive). The
// device-neutral headers declare nothing of CUDA (tests/test_layering.py).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/compare.h"
#include "ops/exhaustive.h"
#include "ops/index.h"
#include "ops/loss.h"
#include "ops/reduce.h"

namespace cl {
namespace cuda {

// The CUDA source of the reduce kernel of one order (ReduceOrder) for float (f64 false) or
// double rows, and its name, cl_reduce_f32_o<order> (tests compile it with NVRTC without a
// GPU). reduce_kernel_order: the order whose kernel computes `order` (the softmax orders
// share one); std::invalid_argument for a number that is no order.
int reduce_kernel_order(int order);
const std::string& reduce_kernel_name(bool f64, int order);
std::string reduce_kernel_source(bool f64, int order);
// `src`: contiguous [rows, n] rows, or the columns of a contiguous [n, rows] matrix (a
// reduction over leading dims), which run in two passes of colred_kernel_source (each
// thread's part of each column, then each column's parts combined) where
// reduce_columns_supported(p) (ops/reduce.h): the triton order's sum, max and min.
void launch_reduce_cuda(const RedPlan& p, const Tensor& src, const Tensor& dst, int64_t rows);
const std::string& colred_kernel_name(bool f64);
std::string colred_kernel_source(bool f64);

std::string index_kernel_source();
// Returns the first out-of-range index found (or none: *bad == false).
void launch_index_cuda(const IndexSpec& s, const Tensor& src, const Tensor& index,
                       const Tensor& out, int64_t size, bool* bad, int64_t* bad_value);

std::string nll_kernel_source(bool f64);
void launch_nll_cuda(const NllPlan& plan, const Tensor& x, const Tensor& w, const Tensor& t,
                     const Tensor& out);

// castlab.numerics.compare on GPU `device` (ops/cuda/compare.cpp).
CmpTotals compare_cuda(const CmpParams& P, int device);
void ulp_error_cuda(const void* x, int xcode, const void* r, int rcode, int64_t n, int fmt,
                    double* out, int device);
void ulp_diff_cuda(const void* a, const void* b, int code, int64_t n, int64_t* out, uint8_t* mask,
                   int device);
int64_t near_ties_cuda(const void* ref, int ref_code, int64_t n, int fmt, double fmax,
                       double within, uint8_t* mask, double* dist, int device);
void tie_split_cuda(const void* a, int acode, const void* b, int bcode, const uint8_t* mask,
                    int64_t n, int64_t* out3, int device);
// The source of its kernels (cl_compare_leaves, cl_compare_tree, cl_near_ties,
// cl_tie_split, cl_ulp_error, cl_ulp_diff), for NVRTC.
extern const char* const kCompareSource;

// castlab.numerics.exhaustive on the GPU (ops/cuda/exhaustive.cpp).
// The patterns of the table inputs as the kernel reads them: one array, input 0's first;
// offset[k] is where input k's start in `words` (also what the tests check the source by).
struct ExTables {
  std::vector<uint64_t> words;
  std::vector<uint64_t> offset;
};
ExTables exhaustive_tables(const std::vector<Enumeration>& inputs);
// The generated kernel's source (also compiled without a GPU by the tests, with NVRTC).
std::string exhaustive_kernel_source(const ExhaustiveSpec& spec, const std::vector<ExChain>& cfgs,
                                     const ExChain& ref, const std::string& name);
// Runs the exhaustive comparison on GPU `device` (ops/cuda/exhaustive.cpp).
ExhaustiveResult exhaustive_cuda(const ExhaustiveSpec& spec, const std::vector<ExChain>& cfgs,
                                 const ExChain& ref, int device);

}  // namespace cuda
}  // namespace cl
