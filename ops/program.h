// Program: the flat, register-based form of one fusible region of a graph, after the
// policy has placed every rounding step. Both executors consume it: the CPU
// interpreter evaluates it block by block; the CUDA code generator turns it into one
// kernel whose body is one line per instruction.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "core/tensor.h"
#include "ops/op_table.h"

namespace cl {

// The type of a register. Integer and bool values live in int64 registers, so they
// stay exact through loads, copies, comparisons, selections and stores; the explicit
// conversions to_f32, to_f64 and to_i64 move values between the kinds.
enum RegType : uint8_t { kRegF32 = 0, kRegF64 = 1, kRegI64 = 2 };
const char* reg_type_name(int rt);  // "f32", "f64", "i64" ("?" otherwise)
// The C++ type of a register type in generated CUDA code.
const char* reg_type_cxx(int rt);

struct Instr {
  uint8_t op = kOpConst;  // OpCode
  uint8_t rtype = 0;      // register type of dst (RegType: float, double, int64)
  uint8_t dtype = 0;      // Load: input's storage dtype; Round: target format
  uint8_t mode = 0;       // Round: RoundMode
  uint8_t saturate = 0;   // Round: saturate fp8 overflow
  uint32_t var = 0;       // VariantBits
  int32_t dst = 0, a = -1, b = -1, c = -1;
  int32_t aux = 0;   // Load: input index; Round: random stream (salt)
  double imm = 0.0;  // Const (float and double registers)
  int64_t iimm = 0;  // Const (int64 registers: exact)
};

struct OutputSpec {
  int32_t reg = 0;
  uint8_t mode = kNearestEven;
  uint8_t saturate = 1;
  int32_t salt = 0;
};

// The fields of the IR, in one list: the Python bindings (named attributes) and the
// serializer (kernel keys) are both generated from it.
// CL_FIELD(name, comment)
#define CL_INSTR_FIELDS(X)                                                      \
  X(op, "opcode (castlab._C.op_table())")                                       \
  X(rtype, "register type of dst: 0 float, 1 double, 2 int64")                  \
  X(var, "math-variant bits (castlab._C.VARIANT_BITS)")                         \
  X(dtype, "load: the input's storage dtype; round: target format")             \
  X(mode, "round: rounding mode (0 nearest even, 1 toward zero, 2 stochastic)") \
  X(saturate, "round: fp8 overflow saturates")                                  \
  X(dst, "destination register")                                                \
  X(a, "first operand register (-1: none)")                                     \
  X(b, "second operand register (-1: none)")                                    \
  X(c, "third operand register (-1: none)")                                     \
  X(aux, "load: input index; round and random ops: stream")                     \
  X(imm, "const: the value (float and double registers)")                       \
  X(iimm, "const: the value (int64 registers)")
#define CL_OUTPUT_FIELDS(X)                \
  X(reg, "register stored to this output") \
  X(mode, "rounding mode of the store")    \
  X(saturate, "fp8 overflow saturates")    \
  X(salt, "random stream of stochastic rounding")

// Calls f(name, field) for every field of an Instr or an OutputSpec, in CL_*_FIELDS order
// (const and non-const objects).
template <typename S, typename F>
void for_each_field(S& in, F&& f) {
  using T = typename std::remove_const<S>::type;
  if constexpr (std::is_same<T, Instr>::value) {
#define CL_VISIT_FIELD(name, doc) f(#name, in.name);
    CL_INSTR_FIELDS(CL_VISIT_FIELD)
  } else {
    static_assert(std::is_same<T, OutputSpec>::value, "Instr or OutputSpec");
    CL_OUTPUT_FIELDS(CL_VISIT_FIELD)
#undef CL_VISIT_FIELD
  }
}

// A per-Program memo for executors (the CUDA executor keeps its compiled kernels per
// operand layout here, so a repeated launch skips keying the instructions). Entries
// are pushed lock-free and live as long as the Program; a copy or an assignment of a
// Program starts with an empty memo (the memo describes one object's contents, which
// must not change once the Program has been run).
class ExecMemo {
 public:
  struct Entry {
    virtual ~Entry() = default;
    Entry* next = nullptr;
  };
  ExecMemo() = default;
  ExecMemo(const ExecMemo&) noexcept {}
  ExecMemo& operator=(const ExecMemo&) noexcept {
    clear();
    return *this;
  }
  ~ExecMemo() { clear(); }
  Entry* head() const noexcept { return head_.load(std::memory_order_acquire); }
  void push(Entry* e) const noexcept {  // takes ownership
    Entry* h = head_.load(std::memory_order_relaxed);
    do {
      e->next = h;
    } while (
        !head_.compare_exchange_weak(h, e, std::memory_order_release, std::memory_order_relaxed));
  }

 private:
  void clear() noexcept {
    Entry* e = head_.exchange(nullptr, std::memory_order_acq_rel);
    while (e) {
      Entry* n = e->next;
      delete e;
      e = n;
    }
  }
  mutable std::atomic<Entry*> head_{nullptr};
};

struct Program {
  std::vector<Instr> code;
  int32_t n_regs = 0;
  std::vector<OutputSpec> outputs;
  uint64_t seed = 0;
  ExecMemo memo;  // executors' per-object cache (not part of the program's meaning)
  bool uses_random() const;
  std::string str() const;  // one line per instruction (debugging)
  // Appends every field that determines the generated code (kernel keys; the seed is
  // a launch parameter, not part of the code).
  void serialize(std::string* out) const;
  // Throws std::invalid_argument unless every opcode, register, dtype and mode is valid
  // and every register holds one type, used as its readers expect.
  void validate() const;
  // The type of every register (the type of the instructions writing it; kRegF32 for a
  // register nothing writes).
  std::vector<uint8_t> reg_types() const;
};

// Run `prog` on the CPU. All inputs and outputs have the same shape (inputs already
// broadcast by stride-0 views); outputs are written in place.
// ---- shared by the executors (ops/operands.cpp) ----

// The checks every executor makes before running `prog`: output count, one shape for all
// operands, writable outputs. Lists the operands, outputs first, into `ops`.
void gather_operands(const Program& prog, const Tensor* const* inputs, int n_in,
                     const Tensor* const* outputs, int n_out, std::vector<const Tensor*>* ops);
// Every load names an existing input of the dtype the program was built for.
void check_loads(const Program& prog, const Tensor* const* inputs, int n_in);

// The iteration space of a program's operands: size-1 dimensions dropped, and a
// dimension merged into the next where it is contiguous with it in every operand.
// Operand k's stride along collapsed dimension d is st[k * nd + d].
struct Iter {
  int nd = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> st;
  int64_t stride(int k, int d) const { return st[static_cast<size_t>(k) * nd + d]; }
};
// `scratch` is reused between calls, so a warm caller allocates nothing.
void collapse_dims(const Shape& shape, const Tensor* const* ops, int nops, Iter* it,
                   std::vector<int64_t>* scratch);

void run_program_cpu(const Program& prog, const std::vector<Tensor>& inputs,
                     const std::vector<Tensor>& outputs);
// The build of the CPU executor run_program_cpu runs on this CPU (the generated CPU
// kernels, ops/cpu/jit.h, compile for the same ISA).
enum class CpuIsa { kBaseline, kAvx2, kAvx512 };
CpuIsa cpu_executor_isa();

}  // namespace cl
