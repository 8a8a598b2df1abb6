#include "core/dtype.h"

#include <stdexcept>

namespace cl {

namespace {
const DTypeInfo kInfos[kNumDTypes] = {
    {kFloat64, "float64", "f64", 8, true},
    {kFloat32, "float32", "f32", 4, true},
    {kFloat16, "float16", "f16", 2, true},
    {kBFloat16, "bfloat16", "bf16", 2, true},
    {kFloat8E4M3FN, "float8_e4m3fn", "f8e4m3fn", 1, true},
    {kFloat8E5M2, "float8_e5m2", "f8e5m2", 1, true},
    {kBool, "bool", "b8", 1, false},
    {kInt32, "int32", "i32", 4, false},
    {kInt64, "int64", "i64", 8, false},
};
}  // namespace

const DTypeInfo& dtype_info(DTypeCode code) {
  if (static_cast<int>(code) >= kNumDTypes) throw std::invalid_argument("invalid dtype code");
  return kInfos[static_cast<int>(code)];
}

DTypeCode dtype_from_name(const std::string& name) {
  for (const auto& info : kInfos) {
    if (name == info.name || name == info.short_name) return info.code;
  }
  throw std::invalid_argument("unsupported dtype '" + name + "'");
}

}  // namespace cl
