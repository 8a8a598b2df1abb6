// Storage dtypes: names as PyTorch prints them, sizes, and what computes them.
#pragma once
#include <cstdint>
#include <string>

#include "core/convert.h"

namespace cl {

struct DTypeInfo {
  DTypeCode code;
  const char* name;        // "bfloat16" (castlab and torch name)
  const char* short_name;  // "bf16" (used in traces)
  int itemsize;
  bool is_float;
};

const DTypeInfo& dtype_info(DTypeCode code);
inline int itemsize(DTypeCode code) { return dtype_info(code).itemsize; }
inline bool is_floating(DTypeCode code) { return dtype_info(code).is_float; }
DTypeCode dtype_from_name(const std::string& name);  // throws std::invalid_argument
constexpr int kNumDTypes = 9;

}  // namespace cl
