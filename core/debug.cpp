#include "core/debug.h"

#include <atomic>

namespace cl {

namespace {
std::atomic<int> g_level{0};
}  // namespace

int debug_level() { return g_level.load(std::memory_order_relaxed); }

void set_debug_level(int level) { g_level.store(level, std::memory_order_relaxed); }

}  // namespace cl
