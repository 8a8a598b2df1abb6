// The CUDA executor: runs a Program as one generated kernel on castlab's stream of the
// operands' device (asynchronously), and copies tensors between devices.
#include <algorithm>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "core/cuda/driver.h"
#include "ops/cuda/codegen.h"
#include "ops/program.h"

namespace cl {

void set_cuda_runner(std::function<void(const Program&, const std::vector<Tensor>&,
                                        const std::vector<Tensor>&)> f);

namespace cuda {

namespace {

constexpr int kThreads = 256;

struct Iter {
  std::vector<int64_t> shape;
  std::vector<std::vector<int64_t>> strides;
};

// Same collapsing as the CPU executor's make_iter: drop size-1 dimensions, merge a
// dimension into the next when it is contiguous with it in every operand.
Iter make_iter(const Shape& shape, const std::vector<const Tensor*>& ops) {
  Iter it;
  std::vector<int64_t> sh;
  std::vector<std::vector<int64_t>> st(ops.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    sh.push_back(shape[d]);
    for (size_t k = 0; k < ops.size(); ++k) st[k].push_back(ops[k]->strides()[d]);
  }
  if (sh.empty()) {
    sh.push_back(1);
    for (auto& s : st) s.push_back(0);
  }
  it.shape.push_back(sh[0]);
  for (size_t k = 0; k < ops.size(); ++k) it.strides.push_back({st[k][0]});
  for (size_t d = 1; d < sh.size(); ++d) {
    bool merge = true;
    for (size_t k = 0; k < ops.size(); ++k)
      if (it.strides[k].back() != st[k][d] * sh[d]) {
        merge = false;
        break;
      }
    if (merge) {
      it.shape.back() *= sh[d];
      for (size_t k = 0; k < ops.size(); ++k) it.strides[k].back() = st[k][d];
    } else {
      it.shape.push_back(sh[d]);
      for (size_t k = 0; k < ops.size(); ++k) it.strides[k].push_back(st[k][d]);
    }
  }
  return it;
}

template <typename T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

std::mutex g_mu;
std::unordered_map<std::string, CompiledKernel> g_fast;  // program + layout -> kernel

void check_same_device(const std::vector<const Tensor*>& ops, Device* dev) {
  *dev = ops[0]->device();
  for (const Tensor* t : ops) {
    if (t->device() != *dev)
      throw std::invalid_argument("expected all tensors on " + dev->str() + ", but one is on " +
                                  t->device().str());
  }
  if (dev->type != DeviceType::CUDA)
    throw std::invalid_argument("CUDA executor got a tensor on " + dev->str());
}

}  // namespace

void run_program_cuda(const Program& prog, const std::vector<Tensor>& inputs,
                      const std::vector<Tensor>& outputs) {
  if (outputs.empty()) return;
  if (outputs.size() != prog.outputs.size())
    throw std::invalid_argument("program expects " + std::to_string(prog.outputs.size()) +
                                " outputs");
  const Shape& shape = outputs[0].shape();
  std::vector<const Tensor*> ops;
  for (const auto& t : outputs) {
    if (t.shape() != shape) throw std::invalid_argument("program outputs differ in shape");
    if (t.readonly()) throw std::invalid_argument("cannot write to a read-only tensor");
    ops.push_back(&t);
  }
  for (const auto& t : inputs) {
    if (t.shape() != shape)
      throw std::invalid_argument("program input of shape " + shape_str(t.shape()) +
                                  " does not match output shape " + shape_str(shape));
    ops.push_back(&t);
  }
  Device dev;
  check_same_device(ops, &dev);
  for (const auto& in : prog.code) {
    if (in.op == kOpLoad && (in.aux < 0 || in.aux >= static_cast<int>(inputs.size())))
      throw std::invalid_argument("program loads a missing input");
    if (in.op == kOpLoad && in.dtype != inputs[in.aux].dtype())
      throw std::invalid_argument("program input dtype mismatch");
  }
  const int64_t numel = numel_of(shape);
  if (numel == 0) return;
  set_device(dev.index);

  const Iter it = make_iter(shape, ops);
  const int nops = static_cast<int>(ops.size());
  const int nd = static_cast<int>(it.shape.size());

  KernelLayout L;
  L.n_out = static_cast<int>(outputs.size());
  L.nd = nd;
  int min_isz = 8;
  for (const Tensor* t : ops) {
    L.dtypes.push_back(static_cast<uint8_t>(t->dtype()));
    min_isz = std::min<int>(min_isz, static_cast<int>(t->itemsize()));
  }
  bool contig = nd == 1;
  for (int k = 0; k < nops && contig; ++k)
    if (it.strides[k][0] != 1) contig = false;
  L.contig = contig;
  int64_t max_off = numel;
  for (int k = 0; k < nops; ++k) {
    int64_t o = 0;
    for (int d = 0; d < nd; ++d) o += (it.shape[d] - 1) * it.strides[k][d];
    max_off = std::max(max_off, o + 1);
  }
  L.idx32 = max_off < (int64_t(1) << 31) - (int64_t(1) << 26);

  // Vector width: 16-byte accesses for the narrowest operand where alignment allows.
  int vec = std::min(8, 16 / std::max(1, min_isz));
  auto ok_for = [&](int v) {
    if (v <= 1) return true;
    if (!contig && it.shape[nd - 1] % v != 0) return false;
    for (int k = 0; k < nops; ++k) {
      const int64_t inner = it.strides[k][nd - 1];
      if (inner == 0 && k >= L.n_out && !contig) continue;  // broadcast along the vector
      if (inner != 1) return false;
      const int64_t isz = ops[k]->itemsize();
      const int64_t align = std::min<int64_t>(16, v * isz);
      if (reinterpret_cast<uintptr_t>(ops[k]->data_ptr()) % align != 0) return false;
      for (int d = 0; d < nd - 1; ++d)
        if (it.strides[k][d] % v != 0) return false;
    }
    return true;
  };
  while (vec > 1 && !ok_for(vec)) vec /= 2;
  L.vec = vec;

  // Fast lookup: the program's instructions and outputs plus the layout.
  std::string key;
  key.reserve(32 * (prog.code.size() + 4));
  put(key, dev.index);
  for (const Instr& in : prog.code) {
    put(key, in.op); put(key, in.f64); put(key, in.var); put(key, in.dtype);
    put(key, in.mode); put(key, in.saturate);
    put(key, in.dst); put(key, in.a); put(key, in.b); put(key, in.c); put(key, in.aux);
    put(key, in.imm);
  }
  put(key, prog.n_regs);
  for (const OutputSpec& o : prog.outputs) {
    put(key, o.reg); put(key, o.mode); put(key, o.saturate); put(key, o.salt);
  }
  key.append(reinterpret_cast<const char*>(L.dtypes.data()), L.dtypes.size());
  put(key, L.n_out); put(key, L.nd); put(key, L.contig); put(key, L.vec); put(key, L.idx32);

  CompiledKernel kern;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto f = g_fast.find(key);
    if (f != g_fast.end()) kern = f->second;
  }
  if (!kern.fn) {
    const GeneratedKernel g = generate_kernel(prog, L);
    kern = get_kernel(dev.index, g.name, g.source);
    std::lock_guard<std::mutex> lk(g_mu);
    g_fast.emplace(key, kern);
  }

  // Parameter block (see codegen.h): ptr[nops], shape[nd], stride[nops][nd], numel, seed, rbase.
  uint64_t buf[512];
  const size_t nwords = param_bytes(L) / 8;
  if (nwords > 512) throw std::invalid_argument("CUDA executor: too many operands or dimensions");
  size_t w = 0;
  for (int k = 0; k < nops; ++k) buf[w++] = reinterpret_cast<uintptr_t>(ops[k]->data_ptr());
  for (int d = 0; d < nd; ++d) buf[w++] = static_cast<uint64_t>(it.shape[d]);
  for (int k = 0; k < nops; ++k)
    for (int d = 0; d < nd; ++d) buf[w++] = static_cast<uint64_t>(it.strides[k][d]);
  buf[w++] = static_cast<uint64_t>(numel);
  buf[w++] = prog.seed;
  buf[w++] = static_cast<uint64_t>(outputs[0].offset());

  const int64_t lanes = contig ? (numel + vec - 1) / vec : numel / vec;
  // One vector per thread (as Triton's pointwise kernels): many short blocks hide memory
  // latency best; the grid-stride loop only matters past 2^30 blocks.
  const int64_t max_blocks = int64_t(1) << 30;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((lanes + kThreads - 1) / kThreads, max_blocks));
  void* args[] = {buf};
  const DriverApi& drv = driver();
  CUresult r = drv.cuLaunchKernel(kern.fn, static_cast<unsigned>(blocks), 1, 1, kThreads, 1, 1, 0,
                                  stream(dev.index), args, nullptr);
  note_launch(dev.index, kern.name.c_str());
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("CUDA error launching " + kern.name + ": " + error_string(r));
}

// Copy src into dst (same shape and dtype, both contiguous; any pair of devices).
void copy_tensor(const Tensor& src, const Tensor& dst) {
  if (src.shape() != dst.shape()) throw std::invalid_argument("copy: shapes differ");
  if (src.dtype() != dst.dtype()) throw std::invalid_argument("copy: dtypes differ");
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
}

void register_cuda_runner() {
  static std::once_flag once;
  std::call_once(once, [] { set_cuda_runner(run_program_cuda); });
}

}  // namespace cuda
}  // namespace cl
