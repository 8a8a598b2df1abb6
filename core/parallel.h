// A small persistent thread pool: parallel_for splits [0, n) into chunks that the
// calling thread and the workers take in turn.
#pragma once
#include <cstdint>
#include <functional>

namespace cl {

int num_threads();
void set_num_threads(int n);
// Calls fn(begin, end) on disjoint chunks covering [0, n), in parallel when n is
// large enough; returns when every chunk is done. Exceptions are rethrown.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace cl
