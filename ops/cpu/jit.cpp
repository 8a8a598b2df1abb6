// Fused CPU kernels compiled at run time (see jit.h).
#include "ops/cpu/jit.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "core/debug.h"
#include "ops/codegen/disk_cache.h"
#include "ops/codegen/element.h"
#include "ops/codegen/hash.h"

extern char** environ;

namespace cl {

namespace {

constexpr int64_t kDefaultMin = int64_t{1} << 18;
std::atomic<int64_t> g_runs{0};

// A kernel's slot: filled once, read without a lock by every call after.
struct Slot {
  std::string key, source;
  std::atomic<CpuKernelFn> fn{nullptr};
  int state = 0;  // 0 not requested, 1 queued or compiling, 2 done (fn set or failed)
};

// Per program (Program::memo): the slot for one signature (operand dtypes and inner
// stride classes); slot null: the program cannot be generated.
struct Memo : ExecMemo::Entry {
  std::string sig;
  std::shared_ptr<Slot> slot;
};

struct State {
  std::mutex mu;
  std::condition_variable cv;  // the worker's queue, and waits for slots
  CpuJitMode mode = CpuJitMode::kAsync;
  int64_t min_elements = kDefaultMin;
  bool probed = false;   // compiler looked for
  double timeout = 120;  // seconds a compiler run may take (CASTLAB_CXX_TIMEOUT)
  bool warned = false;   // the timeout warning was printed
  std::vector<std::string> cxx;
  std::string compiler, why_not;
  std::unordered_map<std::string, std::shared_ptr<Slot>> slots;  // key -> slot
  std::deque<std::shared_ptr<Slot>> queue;
  bool worker = false;
  int busy = 0;
  int64_t compiled = 0, disk_hits = 0, failures = 0;
  double seconds = 0;
  std::string last_error;  // the compiler's log (or the loader's error) of the last failure
};

State* g_state = nullptr;
// The compilers running now (pid -> their folder): killed, and the folders removed, when
// the process exits mid-compile (a background compile outlives no Python session).
std::mutex g_child_mu;
// Held while the compiler is looked for (its --version runs), never together with a wait
// on State::mu's condition: other threads keep running programs in the interpreter.
std::mutex g_probe_mu;
std::unordered_map<pid_t, std::string>* g_children = new std::unordered_map<pid_t, std::string>;
void kill_children_at_exit();

// fork(): the child has no worker thread and no compiler of its own. The locks are taken
// around the fork so the child gets them free; the child forgets its queue, what was
// compiling (asked for again) and the parent's compiler processes.
void before_fork() {
  g_probe_mu.lock();
  g_state->mu.lock();
  g_child_mu.lock();
}
void after_fork_parent() {
  g_child_mu.unlock();
  g_state->mu.unlock();
  g_probe_mu.unlock();
}
void after_fork_child() {
  g_children->clear();  // the parent's compilers, not this process's
  g_child_mu.unlock();
  State& s = *g_state;
  new (&s.cv) std::condition_variable;  // the parent's worker waited in it: a fresh one
  s.worker = false;
  s.busy = 0;
  s.queue.clear();
  for (auto& kv : s.slots)
    if (kv.second->state == 1) kv.second->state = 0;
  s.mu.unlock();
  g_probe_mu.unlock();
}

// Leaked: a detached worker may still use it while the process exits.
State& state() {
  static State* s = [] {
    auto* st = new State;
    g_state = st;
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    std::atexit(kill_children_at_exit);
    if (const char* m = std::getenv("CASTLAB_CPU_CODEGEN")) {
      const std::string v = m;
      if (v == "off" || v == "0")
        st->mode = CpuJitMode::kOff;
      else if (v == "sync")
        st->mode = CpuJitMode::kSync;
    }
    if (const char* n = std::getenv("CASTLAB_CPU_CODEGEN_MIN")) {
      char* end = nullptr;
      const long long v = std::strtoll(n, &end, 10);
      if (end != n && *end == '\0' && v >= 0) st->min_elements = v;
    }
    if (const char* t = std::getenv("CASTLAB_CXX_TIMEOUT")) {
      char* end = nullptr;
      const double v = std::strtod(t, &end);
      if (end != t && *end == '\0' && v > 0 && v <= 86400) st->timeout = v;
    }
    return st;
  }();
  return *s;
}

// The executor's flags (CMakeLists.txt: ISO C++17, -O3, no contraction, no fast math) and
// the ISA of the executor build run_program_cpu picks on this CPU.
std::vector<std::string> compile_flags() {
  std::vector<std::string> f = {"-std=c++17",
                                "-O3",
                                "-DNDEBUG",
                                "-ffp-contract=off",
                                "-fno-fast-math",
                                "-fno-math-errno",
                                "-fno-trapping-math",
                                "-fopenmp-simd",
                                "-fPIC",
                                "-shared",
                                "-w"};
  // the same -m flags as CMakeLists.txt gives executor_avx512.cpp / executor_avx2.cpp
  if (cpu_executor_isa() == CpuIsa::kAvx512) {
    for (const char* x : {"-mavx512f", "-mavx512vl", "-mavx512bw", "-mavx512dq", "-mfma",
                          "-mprefer-vector-width=512"})
      f.push_back(x);
  } else if (cpu_executor_isa() == CpuIsa::kAvx2) {
    f.push_back("-mavx2");
    f.push_back("-mfma");
  }
  return f;
}

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> w;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && s[i] == ' ') ++i;
    size_t j = i;
    while (j < s.size() && s[j] != ' ') ++j;
    if (j > i) w.push_back(s.substr(i, j - i));
    i = j;
  }
  return w;
}

std::string read_file(const std::string& path) {
  std::string out;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return out;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}

bool write_file(const std::string& path, const std::string& data) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size();
  return std::fclose(f) == 0 && ok;
}

std::string tmp_base() {
  const char* t = std::getenv("TMPDIR");
  return t && t[0] == '/' ? t : "/tmp";
}
// This process's temporary names: <tmp>/castlab-cpu-<pid>-...
std::string tmp_prefix() { return tmp_base() + "/castlab-cpu-" + std::to_string(getpid()) + "-"; }

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  std::remove(path);
  return 0;
}
// Removes a file or a folder and what it holds (never following a symlink).
void remove_tree(const std::string& path) {
  nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void kill_children_at_exit() {
  std::lock_guard<std::mutex> g(g_child_mu);
  for (const auto& kv : *g_children) {
    kill(-kv.first, SIGKILL);  // the process group
    waitpid(kv.first, nullptr, 0);
    remove_tree(kv.second);
  }
  g_children->clear();
}

// Removes what processes that died without cleaning up (killed) left in the temporary
// folder: entries named castlab-cpu-<pid>-... of this user whose pid is gone.
void clean_stale_temps() {
  DIR* d = opendir(tmp_base().c_str());
  if (!d) return;
  std::vector<std::string> doomed;
  const std::string pre = "castlab-cpu-";
  while (struct dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, pre.size(), pre) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + pre.size(), &end, 10);
    if (pid <= 0 || !end || *end != '-' || pid == getpid()) continue;
    const std::string path = tmp_base() + "/" + name;
    struct stat st;
    if (lstat(path.c_str(), &st) != 0 || st.st_uid != geteuid()) continue;
    if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) doomed.push_back(path);
  }
  closedir(d);
  for (const auto& p : doomed) remove_tree(p);
}

// A private folder under $TMPDIR (or /tmp), removed with what was written into it.
struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = tmp_prefix() + "XXXXXX";
    if (mkdtemp(&tmpl[0])) path = tmpl;
  }
  ~TempDir() {
    if (!path.empty()) remove_tree(path);
  }
  // Writes `rel` (parent folders created).
  bool put(const std::string& rel, const std::string& data) {
    for (size_t i = 0; i < rel.size(); ++i)
      if (rel[i] == '/') mkdir((path + "/" + rel.substr(0, i)).c_str(), 0700);
    return write_file(path + "/" + rel, data);
  }
};

constexpr int kTimedOut = -2;

// Runs argv with stdout and stderr into `log` (a file in the TempDir `dir`); the exit
// status (-1: could not start or killed by a signal; kTimedOut: still running after
// `timeout` seconds, then killed with its process group).
int run_command(const std::vector<std::string>& argv, const std::string& log,
                const std::string& dir, double timeout) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  // The compiler runs without this process's LD_PRELOAD (a sanitizer runtime preloaded
  // into Python is not meant for it).
  // Its temporary files go into `dir` (removed with it, also when killed at exit).
  const std::string tmpdir = "TMPDIR=" + dir;
  std::vector<char*> env;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "LD_PRELOAD=", 11) != 0 && std::strncmp(*e, "TMPDIR=", 7) != 0)
      env.push_back(*e);
  env.push_back(const_cast<char*>(tmpdir.c_str()));
  env.push_back(nullptr);
  // its own process group: killed at exit together with the compiler's own children
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = 0;
  int rc;
  {
    std::lock_guard<std::mutex> g(g_child_mu);
    rc = posix_spawnp(&pid, args[0], &fa, &attr, args.data(), env.data());
    if (rc == 0) (*g_children)[pid] = dir;
  }
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return -1;
  int status = 0;
  int w;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
  auto nap = std::chrono::microseconds(200);
  for (;;) {
    w = waitpid(pid, &status, WNOHANG);
    if (w < 0 && errno == EINTR) continue;
    if (w != 0) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      timed_out = true;
      kill(-pid, SIGKILL);  // the compiler and what it started
      while ((w = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
      }
      break;
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(20000));
  }
  std::lock_guard<std::mutex> g(g_child_mu);
  g_children->erase(pid);
  if (timed_out) return kTimedOut;
  if (w < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string join_words(const std::vector<std::string>& w) {
  std::string s;
  for (const auto& x : w) s += (s.empty() ? "" : " ") + x;
  return s;
}

std::string seconds_text(double t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", t);
  return buf;
}

// A compiler run went past the timeout: no more compiles in this process (the
// interpreter runs every program, the same bits), said once on stderr. Under s.mu.
void give_up_compiling(State& s, const std::string& why) {
  s.cxx.clear();
  s.why_not = why;
  if (!s.warned) {
    s.warned = true;
    std::fprintf(stderr,
                 "castlab: warning: %s; the CPU code generator is off for this process and "
                 "the interpreter runs every program (the same bits). CASTLAB_CXX_TIMEOUT "
                 "sets the limit in seconds.\n",
                 why.c_str());
    std::fflush(stderr);
  }
}

// Finds the compiler once: $CASTLAB_CXX, $CXX, c++, g++, clang++, each asked for its
// --version within the timeout. Runs without the state's lock (under g_probe_mu), so a
// slow compiler delays only the threads that need it.
void ensure_probed(State& s) {
  double timeout;
  {
    std::lock_guard<std::mutex> g(s.mu);
    if (s.probed) return;
  }
  std::lock_guard<std::mutex> pg(g_probe_mu);
  {
    std::lock_guard<std::mutex> g(s.mu);
    if (s.probed) return;
    timeout = s.timeout;
  }
  clean_stale_temps();
  std::vector<std::string> tried;
  for (const char* env : {"CASTLAB_CXX", "CXX"})
    if (const char* v = std::getenv(env))
      if (v[0]) tried.push_back(v);
  for (const char* c : {"c++", "g++", "clang++"}) tried.push_back(c);
  std::vector<std::string> cxx;
  std::string compiler, why_not, hung;
  TempDir dir;
  if (dir.path.empty()) {
    why_not = "cannot create a temporary folder for the compiler";
  } else {
    const std::string log = dir.path + "/version.txt";
    for (const auto& c : tried) {
      std::vector<std::string> argv = split_words(c);
      if (argv.empty()) continue;
      argv.push_back("--version");
      const int rc = run_command(argv, log, dir.path, timeout);
      if (rc == kTimedOut) {
        hung = "the C++ compiler '" + c + "' did not answer --version within " +
               seconds_text(timeout) + " s";
        break;
      }
      if (rc != 0) continue;
      const std::string v = read_file(log);
      cxx = split_words(c);
      compiler = v.substr(0, v.find('\n'));
      break;
    }
    if (cxx.empty() && hung.empty()) {
      std::string names;
      for (const auto& c : tried) names += (names.empty() ? "" : ", ") + c;
      why_not = "no C++ compiler found (tried " + names + "; set CASTLAB_CXX)";
    }
  }
  std::lock_guard<std::mutex> g(s.mu);
  s.cxx = cxx;
  s.compiler = compiler;
  s.why_not = why_not;
  if (!hung.empty()) give_up_compiling(s, hung);
  s.probed = true;
}

// Compiles `source` to a shared library's bytes in *image: 0, else 1 with the log in
// *log, or kTimedOut when the compiler ran past `timeout` seconds (and was killed).
int compile(const std::vector<std::string>& cxx, const std::string& source, double timeout,
            std::string* image, std::string* log) {
  TempDir dir;
  if (dir.path.empty()) {
    *log = "cannot create a temporary folder";
    return 1;
  }
  for (int i = 0; kEmbeddedHeaders[i].first; ++i)
    if (!dir.put(kEmbeddedHeaders[i].first, kEmbeddedHeaders[i].second)) {
      *log = "cannot write the headers";
      return 1;
    }
  if (!dir.put("kernel.cpp", source)) {
    *log = "cannot write the source";
    return 1;
  }
  std::vector<std::string> argv = cxx;
  for (const auto& f : compile_flags()) argv.push_back(f);
  const std::string so = dir.path + "/kernel.so", out = dir.path + "/log.txt";
  for (const auto& a : {"-I" + dir.path, "-o" + so, dir.path + "/kernel.cpp"}) argv.push_back(a);
  const int rc = run_command(argv, out, dir.path, timeout);
  if (rc == kTimedOut) return kTimedOut;
  *log = read_file(out);
  if (rc != 0) return 1;
  *image = read_file(so);
  return image->empty() ? 1 : 0;
}

// dlopens a library from its bytes (through a private file, removed once loaded).
CpuKernelFn load(const std::string& image, std::string* why) {
  std::string path = tmp_prefix() + "XXXXXX.so";
  const int fd = mkstemps(&path[0], 3);
  if (fd < 0) {
    *why = "cannot create a temporary file";
    return nullptr;
  }
  size_t put = 0;
  while (put < image.size()) {
    const ssize_t n = write(fd, image.data() + put, image.size() - put);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    put += static_cast<size_t>(n);
  }
  close(fd);
  void* h = put == image.size() ? dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL) : nullptr;
  unlink(path.c_str());
  if (!h) {
    const char* e = dlerror();
    *why = e ? e : "cannot write the library";
    return nullptr;
  }
  auto fn = reinterpret_cast<CpuKernelFn>(dlsym(h, "cl_cpu_kernel"));
  if (!fn) *why = "the library has no cl_cpu_kernel";
  return fn;  // the library stays loaded for the process
}

// Fills one slot: the disk cache, else the compiler. Called without the lock.
void build(State& s, Slot& slot) {
  std::vector<std::string> cxx;
  double timeout;
  {
    std::lock_guard<std::mutex> g(s.mu);
    cxx = s.cxx;
    timeout = s.timeout;
  }
  std::string why, kind, image;
  std::string dwhy;
  const int dfd = codegen::disk::open_dir(codegen::cache_dir(), &dwhy);
  const bool hit =
      dfd >= 0 && codegen::disk::load(dfd, slot.key, &kind, &image) == "ok" && kind == "so";
  const auto t0 = std::chrono::steady_clock::now();
  bool ok = hit, timed_out = false;
  if (!hit && cxx.empty()) {
    why = "compiling is off (an earlier compiler run timed out)";
  } else if (!hit) {
    const int rc = compile(cxx, slot.source, timeout, &image, &why);
    ok = rc == 0;
    timed_out = rc == kTimedOut;
    if (ok && dfd >= 0) codegen::disk::store(dfd, slot.key, "so", image);
  }
  if (dfd >= 0) close(dfd);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CpuKernelFn fn = ok ? load(image, &why) : nullptr;
  if (!fn && debug_level() >= 1) {
    std::fprintf(stderr, "# castlab: a CPU kernel did not compile (%s):\n%s\n", slot.key.c_str(),
                 why.c_str());
    std::fflush(stderr);
  }
  std::lock_guard<std::mutex> g(s.mu);
  if (fn) {
    slot.fn.store(fn, std::memory_order_release);
    if (hit)
      s.disk_hits++;
    else {
      s.compiled++;
      s.seconds += secs;
    }
  } else if (timed_out) {
    s.failures++;
    s.last_error = "the C++ compiler '" + join_words(cxx) + "' ran past " + seconds_text(timeout) +
                   " s on a kernel and was stopped";
    give_up_compiling(s, s.last_error);
  } else {
    s.failures++;
    s.last_error = why.empty() ? "the compiler wrote no library" : why;
  }
  slot.state = 2;
  s.cv.notify_all();
}

void worker_loop() {
  State& s = state();
  for (;;) {
    std::shared_ptr<Slot> slot;
    {
      std::unique_lock<std::mutex> g(s.mu);
      s.cv.wait(g, [&] { return !s.queue.empty(); });
      slot = s.queue.front();
      s.queue.pop_front();
      s.busy++;
    }
    build(s, *slot);
    std::lock_guard<std::mutex> g(s.mu);
    s.busy--;
    s.cv.notify_all();
  }
}

bool float_dtype(int dt) {
  return dt == kFloat64 || dt == kFloat32 || dt == kBFloat16 || dt == kFloat16 ||
         dt == kFloat8E4M3FN || dt == kFloat8E5M2;
}

// How an operand's index advances along the row: 1, 0 (broadcast) or its stride.
std::string stride_class(int64_t s) { return s == 1 ? "1" : s == 0 ? "0" : "n"; }

}  // namespace

bool cpu_jit_supports(const Program& prog, const std::vector<uint8_t>& dtypes) {
  if (prog.uses_random() || dtypes.size() < prog.outputs.size()) return false;
  for (uint8_t dt : dtypes)
    if (!float_dtype(dt)) return false;
  for (const Instr& in : prog.code) {
    if (in.rtype == kRegI64) return false;
    if (in.var & kVarTorchVml) return false;         // MKL VML over the whole block
    if (in.var & kVarTorchScalarLoop) return false;  // PyTorch's scalar lambda everywhere
    if (in.var & kVarOneDnnGeluBwd) return false;    // the executor's g * gelu'(x)
    switch (in.op) {
      case kOpLoad:
      case kOpConst:
      case kOpRound:
      case kOpToF32:
      case kOpToF64: continue;
      case kOpSin:
      case kOpCos:
        // SLEEF's float sin/cos choose one argument reduction per vector of 8 (executor)
        if (in.rtype == kRegF32 && (in.var & kVarImplMask) == kTorchCpu) return false;
        continue;
      default:
        if (op_info(in.op).category == kCatInternal) return false;  // random numbers, ToI64
    }
  }
  return true;
}

std::string cpu_jit_source(const Program& prog, const std::vector<uint8_t>& dtypes,
                           const std::vector<int64_t>& inner_strides) {
  const int nout = static_cast<int>(prog.outputs.size());
  const int nops = static_cast<int>(dtypes.size());
  std::string s = "// generated by castlab (ops/cpu/jit.cpp)\n";
  s += "#define __device__\n#define __forceinline__ inline __attribute__((always_inline))\n";
  s += "#include <cstdint>\n#include <cstring>\n#include \"ops/scalar/ops.h\"\n\n";
  s += codegen::emit_element_function(prog, dtypes, nout, "cl_body");
  s += R"(
template <typename T>
static inline __attribute__((always_inline)) T cl_ld(const char* p, int64_t i) {
  T v;
  std::memcpy(&v, p + i * static_cast<int64_t>(sizeof(T)), sizeof v);
  return v;
}
template <typename T>
static inline __attribute__((always_inline)) void cl_st(char* p, int64_t i, T v) {
  std::memcpy(p + i * static_cast<int64_t>(sizeof(T)), &v, sizeof v);
}

extern "C" void cl_cpu_kernel(char* const* bases, const int64_t* row_off, int64_t rpb,
                              int64_t nrows, int64_t c0, int64_t ncols, const int64_t* cs) {
  (void)cs;
  for (int64_t r = 0; r < nrows; ++r) {
)";
  auto index = [&](int k) {
    const std::string c = stride_class(inner_strides[k]);
    return c == "1"   ? std::string("c")
           : c == "0" ? std::string("0")
                      : "c * cs[" + std::to_string(k) + "]";
  };
  for (int k = 0; k < nops; ++k) {
    const std::string ks = std::to_string(k);
    s += std::string("    ") + (k < nout ? "char" : "const char") + "* __restrict p" + ks +
         " = bases[" + ks + "] + (row_off[" + ks + " * rpb + r] + c0 * cs[" + ks +
         "]) * static_cast<int64_t>(sizeof(" + codegen::storage_type(dtypes[k]) + "));\n";
  }
  // (omp simd: the elements are independent; without it GCC gives up on loops that mix
  // 16-bit storage and float arithmetic, RoPE's among them)
  s += "#pragma omp simd\n    for (int64_t c = 0; c < ncols; ++c) {\n";
  for (int k = 0; k < nout; ++k)
    s +=
        std::string("      ") + codegen::storage_type(dtypes[k]) + " y" + std::to_string(k) + ";\n";
  s += "      cl_body(0ull, 0ull";
  for (int k = nout; k < nops; ++k)
    s += std::string(", cl_ld<") + codegen::storage_type(dtypes[k]) + ">(p" + std::to_string(k) +
         ", " + index(k) + ")";
  for (int k = 0; k < nout; ++k) s += ", y" + std::to_string(k);
  s += ");\n";
  for (int k = 0; k < nout; ++k)
    s += std::string("      cl_st<") + codegen::storage_type(dtypes[k]) + ">(p" +
         std::to_string(k) + ", " + index(k) + ", y" + std::to_string(k) + ");\n";
  s += "    }\n  }\n}\n";
  return s;
}

CpuKernelFn cpu_jit_kernel(const Program& prog, const std::vector<Instr>& code,
                           const std::vector<uint8_t>& dtypes,
                           const std::vector<int64_t>& inner_strides, int64_t numel) {
  State& s = state();
  CpuJitMode mode;
  {
    std::lock_guard<std::mutex> g(s.mu);
    mode = s.mode;
    if (mode == CpuJitMode::kOff || numel < s.min_elements) return nullptr;
  }
  ensure_probed(s);
  {
    std::lock_guard<std::mutex> g(s.mu);
    if (s.cxx.empty()) return nullptr;
  }
  std::string sig(dtypes.begin(), dtypes.end());
  for (int64_t st : inner_strides) sig += stride_class(st);
  // the executor's changes for this layout (oneDNN's gelu bits): their instructions' bits
  for (size_t i = 0; i < code.size() && &code != &prog.code; ++i)
    if (code[i].var != prog.code[i].var)
      sig += "|" + std::to_string(i) + ":" + std::to_string(code[i].var);
  std::shared_ptr<Slot> slot;
  bool found = false;
  for (ExecMemo::Entry* e = prog.memo.head(); e; e = e->next)
    if (auto* m = dynamic_cast<Memo*>(e))
      if (m->sig == sig) {
        slot = m->slot;
        found = true;
        break;
      }
  if (!found) {
    Program here;
    const Program* p = &prog;
    if (&code != &prog.code) {
      here.code = code;
      here.n_regs = prog.n_regs;
      here.outputs = prog.outputs;
      here.seed = prog.seed;
      p = &here;
    }
    std::string source;
    if (cpu_jit_supports(*p, dtypes)) {
      try {
        source = cpu_jit_source(*p, dtypes, inner_strides);
      } catch (const std::exception& e) {  // the generator refused it: the interpreter runs it
        if (debug_level() >= 1) {
          std::fprintf(stderr, "# castlab: no CPU kernel generated: %s\n", e.what());
          std::fflush(stderr);
        }
      }
    }
    if (!source.empty()) {
      std::string key_text = "castlab-cpu " CASTLAB_VERSION "\n";
      {
        std::lock_guard<std::mutex> g(s.mu);
        // the whole command (CASTLAB_CXX may carry flags: -O0, -D..., another -march)
        // and its --version line
        key_text += join_words(s.cxx) + "\n" + s.compiler + "\n";
      }
      for (const auto& f : compile_flags()) key_text += f + "\n";
      key_text += "headers " + codegen::embedded_headers_hash() + "\n" + source;
      const std::string key = codegen::sha256_hex(key_text);
      if (debug_level() >= 3) {
        std::fprintf(stderr, "# castlab CPU kernel %s\n%s\n", key.c_str(), source.c_str());
        std::fflush(stderr);
      }
      std::lock_guard<std::mutex> g(s.mu);
      auto& sl = s.slots[key];
      if (!sl) {
        sl = std::make_shared<Slot>();
        sl->key = key;
        sl->source = std::move(source);
      }
      slot = sl;
    }
    auto* m = new Memo;
    m->sig = sig;
    m->slot = slot;
    prog.memo.push(m);
  }
  if (!slot) return nullptr;
  if (CpuKernelFn fn = slot->fn.load(std::memory_order_acquire)) return fn;
  std::unique_lock<std::mutex> g(s.mu);
  if (slot->state == 0) {
    slot->state = 1;
    if (mode == CpuJitMode::kSync) {
      g.unlock();
      build(s, *slot);
      return slot->fn.load(std::memory_order_acquire);
    }
    s.queue.push_back(slot);
    if (!s.worker) {
      s.worker = true;
      std::thread(worker_loop).detach();
    }
    s.cv.notify_all();
    return nullptr;
  }
  if (mode == CpuJitMode::kSync) s.cv.wait(g, [&] { return slot->state == 2; });
  return slot->fn.load(std::memory_order_acquire);
}

CpuJitStatus cpu_jit_status() {
  State& s = state();
  ensure_probed(s);
  std::lock_guard<std::mutex> g(s.mu);
  CpuJitStatus st;
  st.mode = s.mode;
  st.min_elements = s.min_elements;
  st.compiler = s.compiler;
  st.why_not = s.why_not;
  st.last_error = s.last_error;
  st.compiled = s.compiled;
  st.disk_hits = s.disk_hits;
  st.failures = s.failures;
  st.pending = static_cast<int64_t>(s.queue.size()) + s.busy;
  st.compile_seconds = s.seconds;
  st.runs = g_runs.load(std::memory_order_relaxed);
  return st;
}

CpuJitStatus cpu_jit_configure(int mode, int64_t min_elements) {
  State& s = state();
  {
    std::lock_guard<std::mutex> g(s.mu);
    if (mode > 2) throw std::invalid_argument("cpu codegen mode must be off, async or sync");
    if (mode >= 0) s.mode = static_cast<CpuJitMode>(mode);
    if (min_elements >= 0) s.min_elements = min_elements;
  }
  return cpu_jit_status();
}

void cpu_jit_count_run() { g_runs.fetch_add(1, std::memory_order_relaxed); }

void cpu_jit_wait() {
  State& s = state();
  std::unique_lock<std::mutex> g(s.mu);
  s.cv.wait(g, [&] { return s.queue.empty() && s.busy == 0; });
}

}  // namespace cl
