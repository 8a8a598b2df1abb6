// MKL VML (and torch's intra-op thread count), borrowed at run time from PyTorch's own
// libtorch_cpu.so: what torch's CPU kernels compute for float/double exp, log, sin, cos, tanh, erf
// and sqrt.
//
// ATen/cpu/vml.h (torch 2.13, hdr@cf30153) L109-137: with AT_MKL_ENABLED, vml::v<op> for
// float and double is IMPLEMENT_VML_MKL_STUB, i.e.
//     vm{s,d}<Op>(size, in, out, VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE);
// and L141-165 list the ops (exp -> Exp, log -> Ln, sqrt -> Sqrt, ...). UnaryOpsKernel.cpp
// calls it on each contiguous chunk, or on an 8 KiB contiguous copy of strided input.
// MKL is closed source, so castlab cannot rebuild these functions; it calls the same
// exported symbols instead. castlab never links against torch: the library must already be
// loaded (import torch), and is found with dlopen(RTLD_NOLOAD). VML is elementwise: the
// same input gives the same output whatever the call's length or the pointers' alignment
// (tests/test_torch_cpu_math.py checks lengths 1..40 at odd offsets).
#pragma once
#include <cstdint>
#include <string>

namespace cl {

// Loads the vms*/vmd* functions from the already-loaded library at `path`. Returns "" on
// success, else why not (the library is not loaded, or lacks a symbol). Thread-safe; a
// second successful call is a no-op.
std::string torch_vml_load(const std::string& path);
bool torch_vml_loaded();

// out[i] = VML's op(in[i]) for i < n, op one of kOpExp, kOpLog, kOpSin, kOpCos, kOpTanh,
// kOpErf, kOpSqrt. False when VML is not loaded or the op has no VML function (out is then
// untouched).
bool torch_vml(int op, const float* in, float* out, int64_t n);
bool torch_vml(int op, const double* in, double* out, int64_t n);

// at::get_num_threads() of the loaded torch (its intra-op OpenMP threads, which decide how
// at::parallel_for splits a loop), or 0 when torch's library is not borrowed.
int torch_num_threads();

}  // namespace cl
