// The devices as the runtime reaches them: a device's code registers one record of its
// kernels (as its allocator registers itself: core/tensor.h register_allocator), and the
// device-neutral code (runtime.h, row_step.h, reduce.h, index.h, loss.h) calls through it,
// never a device's functions by name. The CPU is built in; CUDA registers its record when
// its support loads (ops/cuda/backend.cpp). Nothing here includes ops/cpu or ops/cuda.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ops/program.h"

namespace cl {

// The steps' descriptions (declared where their CPU code is: backend.h includes none of
// the modules that call through it).
struct RowStep;    // ops/row_step.h
struct RedPlan;    // ops/scalar/reduce.h (ops/reduce.h)
struct IndexSpec;  // ops/index.h
struct NllPlan;    // ops/scalar/loss.h (ops/loss.h)

struct Backend {
  // A Program on operands given as tensors, and on borrowed ones (the launch path of
  // cached plans).
  void (*run_program)(const Program& p, const std::vector<Tensor>& in,
                      const std::vector<Tensor>& out) = nullptr;
  void (*launch_program)(const Program& p, const Tensor* const* in, int n_in,
                         const Tensor* const* out, int n_out) = nullptr;
  // A row step (operands: its leaves, then its outs).
  void (*run_rows)(const RowStep& s, const Tensor* const* ops, size_t nops) = nullptr;
  // The rows of src reduced into dst (contiguous, float32 or float64).
  void (*reduce)(const RedPlan& p, const Tensor& src, const Tensor& dst, int64_t rows) = nullptr;
  // An index step; *bad and *bad_value report the first out-of-range index.
  void (*index)(const IndexSpec& s, const Tensor& src, const Tensor& index, const Tensor& out,
                int64_t size, bool* bad, int64_t* bad_value) = nullptr;
  void (*nll)(const NllPlan& p, const Tensor& x, const Tensor& w, const Tensor& t,
              const Tensor& out) = nullptr;
};

// Registers the record of a device type other than the CPU (idempotent callers: the
// last record wins).
void register_backend(DeviceType type, const Backend& b);
// The record of device type `type`; std::runtime_error "CUDA support is not loaded" when
// none was registered.
const Backend& device_backend(DeviceType type);

// Runs a Program on the device of its outputs; every operand must be on that device
// (std::invalid_argument naming both devices otherwise).
void run_program_any(const Program& p, const std::vector<Tensor>& in,
                     const std::vector<Tensor>& out);

}  // namespace cl
