// CUDA's backend record (ops/backend.h): the runtime reaches the CUDA executor, the row,
// reduce, index and nll kernels only through it.
#include "ops/backend.h"

#include <mutex>

#include "core/cuda/driver.h"
#include "ops/cuda/executor.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/row_kernel.h"

namespace cl {
namespace cuda {

void register_cuda_runner() {
  static std::once_flag once;
  std::call_once(once, [] {
    Backend b;
    b.run_program = run_program_cuda;
    b.launch_program = launch_program_cuda;
    b.run_rows = launch_row_kernel;
    b.reduce = launch_reduce_cuda;
    b.index = launch_index_cuda;
    b.nll = launch_nll_cuda;
    register_backend(DeviceType::CUDA, b);
  });
}

}  // namespace cuda
}  // namespace cl
