#include "ops/backend.h"

#include <stdexcept>
#include <string>

namespace cl {

namespace {
Backend g_backends[2];
bool g_registered[2] = {false, false};
}  // namespace

void register_backend(DeviceType type, const Backend& b) {
  g_backends[static_cast<int>(type)] = b;
  g_registered[static_cast<int>(type)] = true;
}

const Backend& device_backend(DeviceType type) {
  if (!g_registered[static_cast<int>(type)]) throw std::runtime_error("CUDA support is not loaded");
  return g_backends[static_cast<int>(type)];
}

void run_program_any(const Program& p, const std::vector<Tensor>& in,
                     const std::vector<Tensor>& out) {
  if (out.empty()) return;
  const Device dev = out[0].device();
  for (const auto& t : out)
    if (t.device() != dev) throw std::invalid_argument("outputs on different devices");
  for (const auto& t : in)
    if (t.device() != dev)
      throw std::invalid_argument("expected all tensors on " + dev.str() + ", but one is on " +
                                  t.device().str());
  if (dev.type == DeviceType::CPU) {
    run_program_cpu(p, in, out);
    return;
  }
  device_backend(dev.type).run_program(p, in, out);
}

}  // namespace cl
