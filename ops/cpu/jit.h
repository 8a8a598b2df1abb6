// Fused CPU kernels compiled at run time: a Program's instructions as one loop over a
// block's elements, every value in registers, as Inductor's C++ backend writes them.
//
// The interpreter (executor_impl.h) runs each instruction as its own pass over a block of
// up to 512 lanes; on a kernel whose time is compute (SwiGLU's exp and division), the
// passes that only move memory (the other operand's load, the output's store) cannot
// overlap it. The generated loop can. It calls the very scalar functions the interpreter
// calls (the op table's, ops/scalar/ops.h), written out by the CUDA code generator's
// per-element function (ops/codegen/element.h emit_element_function) and compiled by the
// system's C++ compiler with the executor's flags (-ffp-contract=off, no fast math, the
// executor's ISA), so both give the same bits (tests/test_cpu_jit.py checks them).
//
// Modes (CASTLAB_CPU_CODEGEN, or castlab.cpu_codegen()): "async" (default) compiles in a
// background thread while the interpreter runs the calls; "sync" compiles before the
// call; "off" never. Programs below min_elements (CASTLAB_CPU_CODEGEN_MIN, default 2^18)
// stay interpreted: there a call's time is its fixed costs. Compiled libraries are kept in
// the kernel disk cache (ops/codegen/disk_cache.h cache_dir(), kind "so").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ops/program.h"

namespace cl {

// One block: for r < nrows, operand k's row starts at element row_off[k * rpb + r] (plus
// c0 * inner_stride[k]); ncols elements a row. Operands: outputs, then inputs.
using CpuKernelFn = void (*)(char* const* bases, const int64_t* row_off, int64_t rpb, int64_t nrows,
                             int64_t c0, int64_t ncols, const int64_t* inner_stride);

enum class CpuJitMode { kOff = 0, kAsync = 1, kSync = 2 };

struct CpuJitStatus {
  CpuJitMode mode = CpuJitMode::kAsync;
  int64_t min_elements = 0;
  std::string compiler;    // the compiler's first line of --version ("" when none)
  std::string why_not;     // why nothing compiles ("" when it can)
  std::string last_error;  // the log of the last kernel that failed to compile or load
  int64_t compiled = 0, disk_hits = 0, failures = 0, pending = 0;
  int64_t runs = 0;  // executor calls that ran a generated kernel
  double compile_seconds = 0;
};

CpuJitStatus cpu_jit_status();
// mode/min_elements < 0: unchanged. Returns the status after the change.
CpuJitStatus cpu_jit_configure(int mode, int64_t min_elements);
// Counts one executor call that ran a generated kernel (CpuJitStatus::runs).
void cpu_jit_count_run();
// Waits until no compilation is queued or running (tests, benchmarks).
void cpu_jit_wait();

// Can `prog` run as a generated loop at all (instruction kinds, dtypes)? dtypes: per
// operand, outputs first.
bool cpu_jit_supports(const Program& prog, const std::vector<uint8_t>& dtypes);

// The kernel for `prog` with these operand dtypes and inner strides, or null: not
// supported, below min_elements, off, still compiling (async) or failed to compile.
// `code`: the instructions as the executor runs them on this layout (prog.code, or a copy
// whose oneDNN gelu bits it changed).
CpuKernelFn cpu_jit_kernel(const Program& prog, const std::vector<Instr>& code,
                           const std::vector<uint8_t>& dtypes,
                           const std::vector<int64_t>& inner_strides, int64_t numel);

// The generated source for these operands (tests, CASTLAB_DEBUG=3).
std::string cpu_jit_source(const Program& prog, const std::vector<uint8_t>& dtypes,
                           const std::vector<int64_t>& inner_strides);

}  // namespace cl
