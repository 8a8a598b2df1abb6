#include "core/parallel.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

namespace cl {

namespace {

constexpr std::chrono::microseconds kSpin{50};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins while waiting() holds, for at most kSpin; the caller then sleeps on its condition
// variable (which re-checks under the lock).
template <class Pred>
void spin_while(Pred waiting) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 1; waiting(); ++i) {
    cpu_relax();
    if ((i & 63) == 0 && std::chrono::steady_clock::now() - t0 > kSpin) return;
  }
}

class Pool {
 public:
  explicit Pool(int n) { resize(n); }
  ~Pool() { stop(); }

  int size() const { return size_.load(); }

  // fork(): the child has only the thread that forked. The locks are taken around the fork
  // (no job is then half-started) so the child gets them free; the child's pool forgets its
  // workers (their std::thread objects, naming threads that do not exist there, are
  // leaked) and starts as many again on its first parallel job.
  void before_fork() {
    job_mutex_.lock();
    m_.lock();
  }
  void after_fork_parent() {
    m_.unlock();
    job_mutex_.unlock();
  }
  void after_fork_child() {
    // the parent's sleeping workers are still counted as waiters inside the condition
    // variables (a notify would wait for them forever): fresh ones
    new (&cv_) std::condition_variable;
    new (&done_cv_) std::condition_variable;
    if (!workers_.empty()) {
      new std::vector<std::thread>(std::move(workers_));  // leaked on purpose
      workers_.clear();
      restart_.store(true);
    }
    m_.unlock();
    job_mutex_.unlock();
  }
  // In a forked child: the workers again (size() of them).
  void restart_if_forked() {
    if (restart_.exchange(false)) resize(size_.load());
  }

  // Serialised with run() through job_mutex_: a resize waits for the running job to
  // finish, and a job never sees a half-built worker list. New workers start at the
  // current generation so they do not join (and decrement pending_ for) a job that
  // was started before they existed.
  void resize(int n) {
    std::lock_guard<std::mutex> job_lock(job_mutex_);
    stop();
    uint64_t gen;
    {
      std::lock_guard<std::mutex> g(m_);
      stopping_ = false;
      stop_flag_.store(false);
      gen = generation_;
    }
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, gen] { loop(gen); });
    size_.store(static_cast<int>(workers_.size()) + 1);
  }

  void run(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t)>& fn) {
    std::unique_lock<std::mutex> job_lock(job_mutex_);  // one parallel job at a time
    if (workers_.empty()) {  // resized to one thread since the caller looked
      fn(0, n);
      return;
    }
    {
      std::lock_guard<std::mutex> g(m_);
      fn_ = &fn;
      n_ = n;
      chunk_ = chunk;
      next_.store(0);
      pending_ = static_cast<int>(workers_.size());
      pending_left_.store(pending_, std::memory_order_relaxed);
      error_ = nullptr;
      ++generation_;
      gen_.store(generation_, std::memory_order_release);
    }
    cv_.notify_all();
    work();
    // the workers' last chunks usually end within microseconds: spin before sleeping
    spin_while([this] { return pending_left_.load(std::memory_order_acquire) != 0; });
    std::unique_lock<std::mutex> g(m_);
    done_cv_.wait(g, [this] { return pending_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work() {
    for (;;) {
      const int64_t b = next_.fetch_add(chunk_);
      if (b >= n_) break;
      const int64_t e = std::min(n_, b + chunk_);
      try {
        (*fn_)(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> g(m_);
        if (!error_) error_ = std::current_exception();
        next_.store(n_);
      }
    }
  }
  void loop(uint64_t seen) {
    for (;;) {
      // Spin a little before sleeping: parallel jobs come in bursts (one per op or
      // kernel), and waking a sleeping thread costs tens of microseconds, a large share
      // of a job over a million elements. OpenMP runtimes spin likewise.
      spin_while(
          [&] { return gen_.load(std::memory_order_acquire) == seen && !stop_flag_.load(); });
      {
        std::unique_lock<std::mutex> g(m_);
        cv_.wait(g, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
      }
      work();
      {
        std::lock_guard<std::mutex> g(m_);
        pending_left_.store(pending_ - 1, std::memory_order_release);
        if (--pending_ == 0) done_cv_.notify_all();
      }
    }
  }
  void stop() {
    {
      std::lock_guard<std::mutex> g(m_);
      stopping_ = true;
      stop_flag_.store(true);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  std::vector<std::thread> workers_;
  std::atomic<int> size_{1};
  std::mutex m_, job_mutex_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, chunk_ = 1;
  std::atomic<int64_t> next_{0};
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
  std::atomic<uint64_t> gen_{0};        // generation_, readable without the lock (spinning)
  std::atomic<bool> stop_flag_{false};  // stopping_, likewise
  std::atomic<int> pending_left_{0};    // pending_, likewise
  std::atomic<bool> restart_{false};    // forked: the workers to start again
  std::exception_ptr error_;
};

int default_threads() {
  const unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}

Pool* g_pool = nullptr;

Pool& pool() {
  // Leaked on purpose: worker threads must not be joined during static destruction.
  static Pool* p = [] {
    g_pool = new Pool(default_threads());
    pthread_atfork([] { g_pool->before_fork(); }, [] { g_pool->after_fork_parent(); },
                   [] { g_pool->after_fork_child(); });
    return g_pool;
  }();
  p->restart_if_forked();
  return *p;
}

}  // namespace

int num_threads() { return pool().size(); }
void set_num_threads(int n) { pool().resize(std::max(1, n)); }

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  Pool& p = pool();
  if (p.size() == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  const int64_t chunk = std::max<int64_t>(grain, (n + 4 * p.size() - 1) / (4 * p.size()));
  p.run(n, chunk, fn);
}

}  // namespace cl
