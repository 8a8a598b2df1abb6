// The CUDA executor: runs a Program as one generated kernel on castlab's stream of the
// operands' device (asynchronously), and copies tensors between devices.
#include "ops/cuda/executor.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "core/checked.h"
#include "core/cuda/driver.h"
#include "ops/cuda/codegen.h"
#include "ops/cuda/kernel_cache.h"
#include "ops/program.h"

namespace cl {

namespace cuda {

namespace {

// Vectors per lane of a contiguous kernel: two (twice the independent work in flight)
// when the program costs at least 4 instructions per byte it moves, else one; compute-bound
// kernels gain, memory-bound ones would lose (benchmarks/RESULTS.md, design notes).
int contig_unroll(const Program& prog, int bytes_per_element) {
  int cost = 0;
  for (const Instr& in : prog.code) cost += instr_cost(in.op, in.var, in.mode);
  return cost >= 4 * bytes_per_element ? 2 : 1;
}

// The parameter block's capacity in 64-bit words (launch_program_cuda).
constexpr size_t kMaxParamWords = 512;

// Operand k's footprint in bytes: its element size times its extents along the
// dimensions (from `first` on) where its stride is nonzero (a broadcast dimension adds
// nothing).
int64_t footprint(const Iter& it, int k, int64_t itemsize, int first = 0) {
  int64_t foot = itemsize;
  for (int d = first; d < it.nd; ++d)
    if (it.stride(k, d) != 0) foot *= it.shape[d];
  return foot;
}

// The broadcast walk (heads inside the position, order_for_broadcast) over operands larger
// than twice the L2: every head's rows are in flight at once, each 256-byte row far from the
// next one read, and RoPE stays 4-6% below a copy even with its cos/sin loads left out.
// Tiles restore long runs: the last non-broadcast dimension s (positions) splits into
// s_out x s_in, s_in the largest power of two dividing s whose positions hold at most a sixth
// of the L2 of the broadcast inputs, and the last broadcast dimension h (heads) into
// h_out x h_in, h_in the divisor of h nearest 8; the walk is
// [.., s_out, .., h_out, s_in, h_in, inner]. A head's s_in positions then stream as one run,
// a block's lanes still share each cos/sin vector over h_in heads, and the tile of cos/sin
// stays in L2 (evict-last) for the h_out passes. H200, castlab fused, % of a 1 GiB copy
// (benchmarks/RESULTS.md, 2026-12-03): RoPE [1, 32, 65536, 128] 93.7 -> 95.7%,
// [1, 32, 16384, 128] 95.9 -> 97.2%, [1, 32, 8192, 128] 92.7 -> 94.5%, Hugging Face's
// q/k 94.2 -> 95.2%. Tile sizes from hand-written kernels at RoPE 256M: 8 heads and 16,384
// positions 95.9%; 4 or 16 heads 94.8-95.7%; 32,768 positions or more 84.6-93.4%.
void tile_for_locality(Iter* it, int first_b, int nops, int n_out, const Tensor* const* ops,
                       int64_t l2, std::vector<int64_t>* scratch) {
  const int nd = it->nd;
  const int sd = first_b - 1, hd = nd - 2;
  const int64_t S = it->shape[sd], H = it->shape[hd];
  // bytes of the broadcast inputs per position
  int64_t per_pos = 0;
  for (int k = n_out; k < nops; ++k) {
    bool bc = false;
    for (int d = sd + 1; d < nd; ++d) bc = bc || it->stride(k, d) == 0;
    if (bc) per_pos += footprint(*it, k, ops[k]->itemsize(), sd + 1);
  }
  if (per_pos == 0) return;
  // s_in: the largest power of two dividing S within the cap (no divisor search per call)
  const int64_t cap = std::max<int64_t>(1, l2 / 6 / per_pos);
  int64_t s_in = S & -S;
  while (s_in > cap) s_in >>= 1;
  // h_in: a divisor above 15 is farther from 8 than 1 is
  int64_t h_in = H;
  for (int64_t c = 1; c <= std::min<int64_t>(H, 15); ++c)
    if (H % c == 0 && std::llabs(c - 8) < std::llabs(h_in - 8)) h_in = c;
  if (s_in == 1 || h_in == H) return;
  // two more dimensions must still fit a run-time layout's parameter block
  if (param_words(nops, nd + 2, false, false, true) > kMaxParamWords) return;
  // new dims: [0 .. sd-1], s_out, [sd+1 .. hd-1], h_out, s_in, h_in, inner
  const int nn = nd + 2;
  scratch->assign(it->shape.begin(), it->shape.end());
  scratch->insert(scratch->end(), it->st.begin(), it->st.end());
  const int64_t* osh = scratch->data();
  const int64_t* ost = osh + nd;
  it->nd = nn;
  it->shape.resize(static_cast<size_t>(nn));
  it->st.resize(static_cast<size_t>(nn) * nops);
  // (source dim, extent, stride multiplier) of each new dim
  auto put_dim = [&](int nd_at, int src, int64_t extent, int64_t mul) {
    it->shape[nd_at] = extent;
    for (int k = 0; k < nops; ++k)
      it->st[static_cast<size_t>(k) * nn + nd_at] = ost[k * nd + src] * mul;
  };
  int w = 0;
  for (int d = 0; d < sd; ++d) put_dim(w++, d, osh[d], 1);
  put_dim(w++, sd, S / s_in, s_in);
  for (int d = sd + 1; d < hd; ++d) put_dim(w++, d, osh[d], 1);
  put_dim(w++, hd, H / h_in, h_in);
  put_dim(w++, sd, s_in, 1);
  put_dim(w++, hd, h_in, 1);
  put_dim(w++, nd - 1, osh[nd - 1], 1);
}

// Iteration order of the outer dimensions (n-D kernels): dimensions along which a large
// input is broadcast are walked innermost (but for the vector dimension, which must span
// a 128-byte line per operand), so lanes reading the same broadcast element run together
// and hit L2 (RoPE; benchmarks/RESULTS.md, design notes). Operands over twice the L2
// (`l2` bytes) walk in tiles besides (tile_for_locality). Offsets and random-stream
// indices are unchanged: only the order differs.
void order_for_broadcast(Iter* it, const Tensor* const* ops, int nops, int n_out, int64_t l2,
                         std::vector<int64_t>* scratch) {
  const int nd = it->nd;
  if (nd < 3 || nd - 1 > 64) return;
  const int64_t inner = it->shape[nd - 1];
  for (int k = 0; k < nops; ++k) {
    if (it->stride(k, nd - 1) != 1) return;
    if (inner * ops[k]->itemsize() < 128) return;
  }
  // broadcast outer dims (stride 0 in some input, nonzero in every output)
  uint64_t bmask = 0;
  int64_t bytes = 0, total = 0;
  for (int k = 0; k < n_out; ++k) total += footprint(*it, k, ops[k]->itemsize());
  for (int k = n_out; k < nops; ++k) {
    const int64_t foot = footprint(*it, k, ops[k]->itemsize());
    total += foot;
    uint64_t m = 0;
    for (int d = 0; d < nd - 1; ++d)
      if (it->stride(k, d) == 0) m |= uint64_t(1) << d;
    if (m == 0) continue;
    bmask |= m;
    bytes += foot;
  }
  if (bmask == 0 || bytes < (int64_t(2) << 20)) return;
  for (int d = 0; d < nd - 1; ++d)
    if (bmask >> d & 1)
      for (int k = 0; k < n_out; ++k)
        if (it->stride(k, d) == 0) return;
  // stable partition: non-broadcast outer dims, broadcast outer dims, inner dim
  int perm[64 + 1];
  int p = 0;
  for (int d = 0; d < nd - 1; ++d)
    if (!(bmask >> d & 1)) perm[p++] = d;
  const int first_b = p;
  for (int d = 0; d < nd - 1; ++d)
    if (bmask >> d & 1) perm[p++] = d;
  perm[p++] = nd - 1;
  bool identity = true;
  for (int d = 0; d < nd; ++d) identity = identity && perm[d] == d;
  if (identity || first_b == 0) return;
  scratch->assign(it->shape.begin(), it->shape.end());
  scratch->insert(scratch->end(), it->st.begin(), it->st.end());
  const int64_t* osh = scratch->data();
  const int64_t* ost = osh + nd;
  for (int d = 0; d < nd; ++d) {
    it->shape[d] = osh[perm[d]];
    for (int k = 0; k < nops; ++k) it->st[static_cast<size_t>(k) * nd + d] = ost[k * nd + perm[d]];
  }
  if (total > 2 * l2) tile_for_locality(it, first_b, nops, n_out, ops, l2, scratch);
}

// KernelLayout::evict_first_reads for a static layout: where an input is broadcast along
// an outer dimension (its loads evict-last) and the operands' footprints together exceed
// the L2 but fit in twice its size, the other inputs load evict-first. Measured on the
// H200 (benchmarks/RESULTS.md, 2026-12-03): RoPE at 16M elements (69 MB) 93.5% -> 98.4%
// of a 1 GiB copy's bandwidth, its outputs staying in L2 (ncu: 11.2 -> 6.7 MB written to
// DRAM during the kernel); at 32M (135 MB), 64M and 256M the same loads cost 3-4%, and
// on Hugging Face's k half (42 MB, inside the L2, after the q half) 1%.
bool evict_first_reads(const Iter& it, const Tensor* const* ops, int nops, int n_out, int dev) {
  bool bcast = false;
  int64_t bytes = 0;
  for (int k = 0; k < nops; ++k) {
    bytes += footprint(it, k, ops[k]->itemsize());
    if (k >= n_out)
      for (int d = 0; d + 1 < it.nd; ++d)
        if (it.stride(k, d) == 0 && it.shape[d] > 1) bcast = true;
  }
  const int64_t l2 = l2_cache_bytes(dev);
  return bcast && bytes > l2 && bytes <= 2 * l2;
}

template <typename T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// A compiled kernel and how it is launched.
struct Launchable {
  CompiledKernel kern;
  int unroll = 1;    // vectors per lane (KernelLayout::unroll)
  bool pdl = false;  // launched with programmatic stream serialization (pdl_on)
};

// program + layout -> kernel. Never destroyed (kernel names are handed out as pointers).
std::mutex g_mu;
auto* g_fast = new std::unordered_map<std::string, Launchable>();

// The layout part of a launch, compared bytewise against the Program's memo.
constexpr int kMemoOps = 29;
struct LaunchKey {
  int32_t dev = 0;
  uint8_t nops = 0, n_out = 0, nd = 0, contig = 0, vec = 0, idx32 = 0, stat = 0;
  uint8_t dtypes[kMemoOps] = {};
};
static_assert(sizeof(LaunchKey) == 40, "LaunchKey has no padding");
constexpr int kMemoMax = 16;  // entries per Program (past that: the global map)

// n-D launches of at least this many elements get a kernel specialised to their
// collapsed shape and strides (compile-time constants: the index decomposition divides
// by constants). Large launches are shape-stable in practice (a model's layers); small
// and eager-varied ones keep the runtime-shape kernel so they don't compile per shape.
// 2^18: RoPE on 1M elements (two n-D halves of 512K) ran 10% slower than torch.compile
// with the runtime layout and level with it static (benchmarks/RESULTS.md, 2026-12-02).
constexpr int64_t kStaticNumel = int64_t(1) << 18;
// A smaller n-D launch gets the specialised kernel too once its Program has launched
// kStaticAfter times with one layout (a loop over fixed shapes: decode steps, a jit
// function called again and again), compiled then. Programs launched a few times, or
// over many layouts, keep sharing the runtime-shape kernel. RoPE on 64K elements (two
// [32, 16, 64] halves): 2.27 us a call with the runtime layout, 2.00 us specialised,
// torch.compile 1.92-1.95 (benchmarks/RESULTS.md, 2026-12-02).
constexpr uint32_t kStaticAfter = 16;

struct KernelMemo : ExecMemo::Entry {
  LaunchKey key;
  // shape[nd] then strides[nops * nd]: a static kernel's layout; for a runtime-shape
  // kernel, the layout of its first launch, whose launches it counts
  std::vector<int64_t> dims;
  const Launchable* kern = nullptr;
  mutable std::atomic<uint32_t> launches{0};
};

bool same_dims(const std::vector<int64_t>& dims, const Iter& it) {
  const size_t nd = it.shape.size();
  return dims.size() == nd + it.st.size() &&
         std::equal(it.shape.begin(), it.shape.end(), dims.begin()) &&
         std::equal(it.st.begin(), it.st.end(), dims.begin() + static_cast<std::ptrdiff_t>(nd));
}

const KernelMemo* find_memo(const Program& prog, const LaunchKey& key, const Iter& it, int* count) {
  int n = 0;
  for (ExecMemo::Entry* e = prog.memo.head(); e; e = e->next, ++n) {
    const auto* m = static_cast<const KernelMemo*>(e);
    if (std::memcmp(&m->key, &key, sizeof key) == 0 && (!key.stat || same_dims(m->dims, it)))
      return m;
  }
  *count = n;
  return nullptr;
}

void check_same_device(const Tensor* const* ops, int nops, Device* dev) {
  *dev = ops[0]->device();
  for (int k = 0; k < nops; ++k) {
    if (ops[k]->device() != *dev)
      throw std::invalid_argument("expected all tensors on " + dev->str() + ", but one is on " +
                                  ops[k]->device().str());
  }
  if (dev->type != DeviceType::CUDA)
    throw std::invalid_argument("CUDA executor got a tensor on " + dev->str());
}

struct Scratch {
  std::vector<const Tensor*> ops;
  Iter it;
  std::vector<int64_t> tmp;
};

}  // namespace

// Whether device `dev`'s elementwise kernels are launched with programmatic stream
// serialization (programmatic dependent launch): a kernel is then scheduled as soon as the
// blocks of the one before it in the stream have exited, and waits in its first
// instruction (cl_pdl_enter, ops/cuda/prelude.cuh) until that one has completed, so
// back-to-back kernels do not each pay the whole launch latency (benchmarks/RESULTS.md).
// Only where the kernels are compiled for sm_90 or later (the wait is compiled in only
// there) and the driver has cuLaunchKernelEx; CASTLAB_CUDA_PDL=0 turns it off.
bool pdl_on(int dev) {
  static const bool env_off = [] {
    const char* e = std::getenv("CASTLAB_CUDA_PDL");
    return e && std::strcmp(e, "0") == 0;
  }();
  constexpr int kDevs = 64;                    // as the driver layer (core/cuda/driver.cpp)
  static std::atomic<int> cached[kDevs] = {};  // 0 unknown, 1 off, 2 on
  if (env_off || !driver().cuLaunchKernelEx || dev < 0 || dev >= kDevs) return false;
  int c = cached[dev].load(std::memory_order_relaxed);
  if (c == 0) {
    int major = 0, minor = 0;
    compute_capability(dev, &major, &minor);
    bool ptx_only = false;
    const std::string arch = nvrtc_arch(major * 10 + minor, &ptx_only);
    const size_t digits = arch.find_first_of("0123456789");
    const int cc = digits == std::string::npos ? 0 : std::atoi(arch.c_str() + digits);
    c = cc >= 90 ? 2 : 1;
    cached[dev].store(c, std::memory_order_relaxed);
  }
  return c == 2;
}

void launch_program_cuda(const Program& prog, const Tensor* const* inputs, int n_in,
                         const Tensor* const* outputs, int n_out) {
  if (n_out == 0) return;
  if (n_out != static_cast<int>(prog.outputs.size()))
    throw std::invalid_argument("program expects " + std::to_string(prog.outputs.size()) +
                                " outputs");
  thread_local Scratch S;
  const Shape& shape = outputs[0]->shape();
  auto& ops = S.ops;
  gather_operands(prog, inputs, n_in, outputs, n_out, &ops);
  const int nops = static_cast<int>(ops.size());
  Device dev;
  check_same_device(ops.data(), nops, &dev);
  const int64_t numel = numel_of(shape);
  if (numel == 0) {
    check_loads(prog, inputs, n_in);  // same validation as a real launch
    return;
  }
  const CUstream stream_ = launch_stream(dev.index);

  Iter& it = S.it;
  collapse_dims(shape, ops.data(), nops, &it, &S.tmp);
  order_for_broadcast(&it, ops.data(), nops, n_out, l2_cache_bytes(dev.index), &S.tmp);
  const int nd = it.nd;

  int min_isz = 8;
  for (int k = 0; k < nops; ++k)
    min_isz = std::min<int>(min_isz, static_cast<int>(ops[k]->itemsize()));
  bool contig = nd == 1;
  for (int k = 0; k < nops && contig; ++k)
    if (it.stride(k, 0) != 1) contig = false;
  // The largest element offset any operand reaches (each operand's view lies inside its
  // storage, so these sums fit; checked all the same).
  int64_t max_off = numel;
  for (int k = 0; k < nops; ++k) {
    int64_t o = 0, e = 0;
    for (int d = 0; d < nd; ++d)
      if (!mul_ok(it.shape[d] - 1, it.stride(k, d), &e) || !add_ok(o, e, &o))
        throw std::invalid_argument("CUDA executor: operand offsets do not fit in 64 bits");
    max_off = std::max(max_off, o < INT64_MAX ? o + 1 : o);
  }
  const bool idx32 = max_off < (int64_t(1) << 31) - (int64_t(1) << 26);

  // Vector width: 16-byte accesses for the narrowest operand where alignment allows,
  // transcendental programs included (a cap at 4 measured slower: RESULTS.md).
  int vec = std::min(8, 16 / std::max(1, min_isz));
  auto ok_for = [&](int v) {
    if (v <= 1) return true;
    if (!contig && it.shape[nd - 1] % v != 0) return false;
    for (int k = 0; k < nops; ++k) {
      const int64_t inner = it.stride(k, nd - 1);
      if (inner == 0 && k >= n_out && !contig) continue;  // broadcast along the vector
      if (inner != 1) return false;
      const int64_t isz = ops[k]->itemsize();
      const int64_t align = std::min<int64_t>(16, v * isz);
      if (reinterpret_cast<uintptr_t>(ops[k]->data_ptr()) % align != 0) return false;
      for (int d = 0; d < nd - 1; ++d)
        if (it.stride(k, d) % v != 0) return false;
    }
    return true;
  };
  while (vec > 1 && !ok_for(vec)) vec /= 2;
  // An n-D launch of fewer blocks than multiprocessors takes half-width vectors, for twice
  // the blocks: most of the GPU would wait otherwise (RoPE's [32, 16, 64] halves at 64K
  // elements: 32 blocks; benchmarks/RESULTS.md).
  if (!contig && vec == 8 &&
      numel / vec < int64_t(multiprocessor_count(dev.index)) * kThreadsPerBlock)
    vec = 4;
  bool stat = !contig && numel >= kStaticNumel;

  // The kernel: from the Program's memo (no hashing of the instructions), else from the
  // global map keyed by the instructions and the layout, else generated and compiled.
  LaunchKey lk;
  const bool memo_ok = nops <= kMemoOps && nd < 256;
  const Launchable* kern = nullptr;
  int memo_count = 0;
  if (memo_ok) {
    lk.dev = dev.index;
    lk.nops = static_cast<uint8_t>(nops);
    lk.n_out = static_cast<uint8_t>(n_out);
    lk.nd = static_cast<uint8_t>(nd);
    lk.contig = contig;
    lk.vec = static_cast<uint8_t>(vec);
    lk.idx32 = idx32;
    lk.stat = stat;
    for (int k = 0; k < nops; ++k) lk.dtypes[k] = static_cast<uint8_t>(ops[k]->dtype());
    const KernelMemo* m = nullptr;
    if (!contig && !stat) {  // specialised already (kStaticAfter)?
      lk.stat = 1;
      m = find_memo(prog, lk, it, &memo_count);
      stat = m != nullptr;
      lk.stat = stat;
    }
    if (!m) {
      m = find_memo(prog, lk, it, &memo_count);
      if (m && !contig && !stat && same_dims(m->dims, it) &&
          m->launches.fetch_add(1, std::memory_order_relaxed) + 1 == kStaticAfter) {
        stat = true;  // this launch compiles the specialised kernel
        lk.stat = 1;
        m = nullptr;
      }
    }
    if (m) kern = m->kern;
  }
  if (!kern) {
    // Validation (a memo hit implies it: same operand count and dtypes as a launch
    // that passed it).
    check_loads(prog, inputs, n_in);
    KernelLayout L;
    L.n_out = n_out;
    L.nd = nd;
    for (int k = 0; k < nops; ++k) L.dtypes.push_back(static_cast<uint8_t>(ops[k]->dtype()));
    L.contig = contig;
    L.vec = vec;
    if (contig) {
      int bytes_per_element = 0;
      for (int k = 0; k < nops; ++k) bytes_per_element += static_cast<int>(ops[k]->itemsize());
      L.unroll = contig_unroll(prog, bytes_per_element);
    }
    L.idx32 = idx32;
    if (stat) {
      L.shape = it.shape;
      L.strides = it.st;
      L.evict_first_reads = evict_first_reads(it, ops.data(), nops, n_out, dev.index);
    }
    std::string key;
    key.reserve(32 * (prog.code.size() + 4));
    put(key, dev.index);
    prog.serialize(&key);
    key.append(reinterpret_cast<const char*>(L.dtypes.data()), L.dtypes.size());
    put(key, L.n_out);
    put(key, L.nd);
    put(key, L.contig);
    put(key, L.vec);
    put(key, L.unroll);
    put(key, L.idx32);
    put(key, stat);
    put(key, L.evict_first_reads);
    for (int64_t x : L.shape) put(key, x);
    for (int64_t x : L.strides) put(key, x);
    {
      std::lock_guard<std::mutex> lk2(g_mu);
      auto f = g_fast->find(key);
      if (f != g_fast->end()) kern = &f->second;
    }
    if (!kern) {
      const GeneratedKernel g = generate_kernel(prog, L);
      Launchable c{get_kernel(dev.index, g.name, g.source), L.unroll, pdl_on(dev.index)};
      std::lock_guard<std::mutex> lk2(g_mu);
      kern = &g_fast->emplace(key, std::move(c)).first->second;  // first one wins
    }
    if (memo_ok && memo_count < kMemoMax) {
      auto* m = new KernelMemo;
      m->key = lk;
      if (!contig) {
        m->dims = it.shape;
        m->dims.insert(m->dims.end(), it.st.begin(), it.st.end());
      }
      m->kern = kern;
      m->launches.store(1, std::memory_order_relaxed);  // this one
      prog.memo.push(m);
    }
  }

  // Parameter block (see codegen.h): ptr[nops], then for runtime-shape n-D kernels
  // shape[nd] and stride[nops][nd], then numel, seed, rbase, and div[nd] where the kernel
  // divides by magic numbers.
  const bool magic = magic_division(contig, stat, idx32, nd);
  const bool layout = params_have_layout(contig, stat);
  uint64_t buf[kMaxParamWords];
  const size_t nwords = param_words(nops, nd, contig, stat, idx32);
  if (nwords > kMaxParamWords)
    throw std::invalid_argument("CUDA executor: too many operands or dimensions");
  size_t w = 0;
  for (int k = 0; k < nops; ++k) buf[w++] = reinterpret_cast<uintptr_t>(ops[k]->data_ptr());
  if (layout) {
    for (int d = 0; d < nd; ++d) buf[w++] = static_cast<uint64_t>(it.shape[d]);
    for (int k = 0; k < nops; ++k)
      for (int d = 0; d < nd; ++d) buf[w++] = static_cast<uint64_t>(it.stride(k, d));
  }
  buf[w++] = static_cast<uint64_t>(numel);
  buf[w++] = prog.seed;
  buf[w++] = static_cast<uint64_t>(outputs[0]->offset());
  if (magic)
    for (int d = 0; d < nd; ++d) buf[w++] = division_magic(static_cast<uint32_t>(it.shape[d]));
  if (w != nwords) throw std::logic_error("CUDA executor: parameter block length mismatch");

  // Rounding up as numel / vec + (remainder != 0): no intermediate can overflow.
  const int64_t lanes = contig ? numel / vec + (numel % vec != 0) : numel / vec;
  // Every lane launched (the kernel has no grid-stride loop).
  const int64_t per_block = int64_t(kThreadsPerBlock) * kern->unroll;
  const int64_t blocks = std::max<int64_t>(1, lanes / per_block + (lanes % per_block != 0));
  if (blocks > int64_t(0x7FFFFFFF))
    throw std::invalid_argument("CUDA executor: " + std::to_string(numel) +
                                " elements need more thread blocks than a launch allows");
  void* args[] = {buf};
  CUresult r = CUDA_SUCCESS;
  if (kern->pdl) {
    CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig cfg{};
    cfg.gridDimX = static_cast<unsigned>(blocks);
    cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = kThreadsPerBlock;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = stream_;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    r = driver().cuLaunchKernelEx(&cfg, kern->kern.fn, args, nullptr);
  }
  // Plainly, or again plainly where the driver refused the attribute (invalid value, not
  // supported: the kernel's wait is then a no-op, and a plain launch is always ordered).
  if (!kern->pdl || r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_NOT_SUPPORTED)
    r = driver().cuLaunchKernel(kern->kern.fn, static_cast<unsigned>(blocks), 1, 1,
                                kThreadsPerBlock, 1, 1, 0, stream_, args, nullptr);
  note_launch(dev.index, kern->kern.name.c_str());
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("CUDA error launching " + kern->kern.name + ": " + error_string(r));
}

void run_program_cuda(const Program& prog, const std::vector<Tensor>& inputs,
                      const std::vector<Tensor>& outputs) {
  if (outputs.empty()) return;
  const int n_in = static_cast<int>(inputs.size()), n_out = static_cast<int>(outputs.size());
  constexpr int kSmall = 16;
  const Tensor* small[2 * kSmall];
  std::vector<const Tensor*> big;
  const Tensor** in_p = small;
  const Tensor** out_p = small + kSmall;
  if (n_in > kSmall || n_out > kSmall) {
    big.resize(static_cast<size_t>(n_in) + n_out);
    in_p = big.data();
    out_p = big.data() + n_in;
  }
  for (int k = 0; k < n_in; ++k) in_p[k] = &inputs[k];
  for (int k = 0; k < n_out; ++k) out_p[k] = &outputs[k];
  launch_program_cuda(prog, in_p, n_in, out_p, n_out);
}

// Copy src into dst (same shape and dtype, both contiguous; any pair of devices).
void copy_tensor(const Tensor& src, const Tensor& dst) {
  if (src.shape() != dst.shape()) throw std::invalid_argument("copy: shapes differ");
  if (src.dtype() != dst.dtype()) throw std::invalid_argument("copy: dtypes differ");
  if (src.numel() == 0) return;  // an empty view's strides need not be contiguous
  if (!src.is_contiguous() || !dst.is_contiguous())
    throw std::invalid_argument("copy: both tensors must be contiguous");
  if (dst.readonly()) throw std::invalid_argument("cannot write to a read-only tensor");
  const size_t n = static_cast<size_t>(src.numel() * src.itemsize());
  if (n == 0) return;
  const Device sd = src.device(), dd = dst.device();
  const CUdeviceptr sp = reinterpret_cast<uintptr_t>(src.data_ptr());
  const CUdeviceptr dp = reinterpret_cast<uintptr_t>(dst.data_ptr());
  if (sd.type == DeviceType::CPU && dd.type == DeviceType::CPU) {
    std::memmove(dst.data_ptr(), src.data_ptr(), n);
    return;
  }
  const DriverApi& drv = driver();
  if (sd.type == DeviceType::CPU) {  // host -> device: returns once the source is staged
    set_device(dd.index);
    check(drv.cuMemcpyHtoDAsync(dp, src.data_ptr(), n, stream(dd.index)), "cuMemcpyHtoDAsync");
    return;
  }
  if (dd.type == DeviceType::CPU) {  // device -> host: waits for castlab's work, then copies
    set_device(sd.index);
    check(drv.cuMemcpyDtoHAsync(dst.data_ptr(), sp, n, stream(sd.index)), "cuMemcpyDtoHAsync");
    synchronize(sd.index);
    return;
  }
  if (sd.index == dd.index) {
    set_device(dd.index);
    check(drv.cuMemcpyDtoDAsync(dp, sp, n, stream(dd.index)), "cuMemcpyDtoDAsync");
    return;
  }
  synchronize(sd.index);
  set_device(dd.index);
  check(drv.cuMemcpyPeerAsync(dp, context(dd.index), sp, context(sd.index), n, stream(dd.index)),
        "cuMemcpyPeerAsync");
  // The source's stream waits for the copy: a source block freed after this call goes back
  // to its device's free list, and the next kernel there must not overwrite it mid-copy.
  CUevent ev = nullptr;
  check(drv.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  check(drv.cuEventRecord(ev, stream(dd.index)), "cuEventRecord");
  set_device(sd.index);
  check(drv.cuStreamWaitEvent(stream(sd.index), ev, 0), "cuStreamWaitEvent");
  check(drv.cuEventDestroy(ev), "cuEventDestroy");
}

}  // namespace cuda
}  // namespace cl
