#include "ops/op_table.h"

#include <stdexcept>
#include <string>

namespace cl {

namespace {
constexpr OpInfo kTable[kOpCount] = {
#define CL_INFO_INTERNAL(E, name, cost) \
  {name, nullptr, 0, kCatInternal, 0, cost, cost, "", false, "", ""},
#define CL_INFO_OP(E, name, aten, arity, cat, factors, cost, cost_fast, fn, py, formula, grad) \
  {name, aten, arity, cat, factors, cost, cost_fast, "cl::" #fn, py != 0, formula, grad},
    CL_INTERNAL_OPS(CL_INFO_INTERNAL) CL_ELEMENTWISE_OPS(CL_INFO_OP)
#undef CL_INFO_INTERNAL
#undef CL_INFO_OP
};
}  // namespace

const OpInfo& op_info(int op) {
  if (op < 0 || op >= kOpCount) throw std::out_of_range("unknown opcode " + std::to_string(op));
  return kTable[op];
}

const char* op_name(int op) { return op >= 0 && op < kOpCount ? kTable[op].name : "?"; }

int instr_cost(int op, uint32_t var, int mode) {
  const OpInfo& i = op_info(op);
  if (op == kOpRound && mode == kStochastic) return 12;
  return (var & kVarApproxDiv) ? i.cost_fast : i.cost;
}

}  // namespace cl
