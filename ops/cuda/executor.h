// The CUDA executor: runs a Program as one generated kernel on castlab's stream of the
// operands' device (asynchronously), and copies tensors between devices.
#pragma once
#include <vector>

#include "core/tensor.h"
#include "ops/program.h"

namespace cl {
namespace cuda {

void run_program_cuda(const Program& prog, const std::vector<Tensor>& inputs,
                      const std::vector<Tensor>& outputs);
// The same on borrowed operands (no Tensor copies: the launch path of cached plans).
void launch_program_cuda(const Program& prog, const Tensor* const* inputs, int n_in,
                         const Tensor* const* outputs, int n_out);
// Whether device `dev`'s elementwise kernels launch with programmatic stream
// serialization (sm_90+ kernels and a driver with cuLaunchKernelEx; CASTLAB_CUDA_PDL=0: no).
bool pdl_on(int dev);
// Copies src into dst: same shape and dtype, both contiguous, any pair of devices.
// Host -> device returns once the source is staged; device -> host waits for the data.
void copy_tensor(const Tensor& src, const Tensor& dst);

}  // namespace cuda
}  // namespace cl
