// One Program instruction -> the C++ expression that computes its value in the generated
// kernel's body (ops/codegen/element.cpp writes "const T rD = <expr>;"). Kept on its own so
// the mapping from opcodes to device code can change without touching the kernel layout.
#pragma once
#include <string>
#include <vector>

#include "ops/program.h"

namespace cl {
namespace codegen {

// The body's name of register r ("r<r>").
std::string reg_name(int r);

// The expression for `in`. wide[k]: input k arrives in the body as float although stored
// as fp16 (the kernel widened it); nin: the number of inputs (loads are checked against it).
std::string instr_expr(const Instr& in, const std::vector<bool>& wide, int nin);

}  // namespace codegen
}  // namespace cl
