// castlab._C's CUDA functions (used by python/castlab/cuda.py). Nothing here touches the
// driver until called, so importing castlab works without a GPU or CUDA libraries.
#include <unistd.h>

#include <stdexcept>

#include "core/cuda/driver.h"
#include "ops/cuda/codegen.h"
#include "ops/cuda/executor.h"
#include "ops/cuda/kernel_cache.h"
#include "ops/cuda/kernels.h"
#include "ops/index.h"
#include "ops/loss.h"
#include "ops/reduce.h"
#include "python/src/bindings.h"

namespace cu = cl::cuda;

namespace {

py::dict memory_stats_dict(int device) {
  const cu::MemoryStats s = cu::memory_stats(device);
  py::dict d;
  d["allocated_bytes"] = s.allocated;
  d["reserved_bytes"] = s.reserved;
  d["peak_allocated_bytes"] = s.peak_allocated;
  d["num_allocs"] = s.num_allocs;
  d["num_device_allocs"] = s.num_device_allocs;
  d["cache_hits"] = s.cache_hits;
  d["num_frees"] = s.num_frees;
  d["num_ooms"] = s.num_ooms;
  return d;
}

// The fixed kernels' sources and names, and the SM count (no driver call but the last).
void bind_kernel_sources(py::module_& m) {
  m.def(
      "_reduce_kernel_source",
      [](bool f64, int order) { return cl::cuda::reduce_kernel_source(f64, order); },
      py::arg("f64"), py::arg("order"),
      "the CUDA source of the reduce kernel of one ReduceOrder (float or double rows)");
  m.def(
      "_reduce_kernel_name",
      [](bool f64, int order) { return cl::cuda::reduce_kernel_name(f64, order); }, py::arg("f64"),
      py::arg("order"), "the name of that kernel (cl_reduce_f32_o<order>)");
  m.def(
      "_colred_kernel_source", [](bool f64) { return cl::cuda::colred_kernel_source(f64); },
      py::arg("f64"), "the CUDA source of a triton-order reduction of columns (two passes)");
  m.def(
      "_index_kernel_source", [] { return cl::cuda::index_kernel_source(); },
      "the CUDA source of the index steps (gather, scatter_add, check)");
  m.def(
      "_nll_kernel_source", [](bool f64) { return cl::cuda::nll_kernel_source(f64); },
      "the CUDA source of the nll_loss step (float or double values)");
  m.def(
      "cuda_sm_count", [](int index) { return cu::multiprocessor_count(index); },
      "streaming multiprocessors of CUDA device `index`", py::call_guard<py::gil_scoped_release>());
}

// The driver: initialisation, device info, synchronisation, memory, streams, copies.
void bind_device(py::module_& m) {
  m.def(
      "_cuda_init",
      [](const std::vector<std::string>& nvrtc_candidates) {
        py::gil_scoped_release nogil;
        cu::set_nvrtc_candidates(nvrtc_candidates);
      },
      py::arg("nvrtc_candidates") = std::vector<std::string>{});
  m.def("_cuda_info", [] {
    py::dict info;
    info["available"] = cu::is_available();
    if (!cu::is_available()) {
      info["reason"] = cu::unavailable_reason();
      return info;
    }
    const cu::DriverApi& d = cu::driver();
    int ver = 0;
    d.cuDriverGetVersion(&ver);
    info["driver_version"] = std::to_string(ver / 1000) + "." + std::to_string((ver % 1000) / 10);
    py::list devs;
    for (int i = 0; i < cu::device_count(); ++i) {
      cu::CUdevice dev;
      cu::check(d.cuDeviceGet(&dev, i), "cuDeviceGet");
      char name[256] = {0};
      d.cuDeviceGetName(name, sizeof name - 1, dev);
      int maj = 0, mnr = 0, sms = 0;
      d.cuDeviceGetAttribute(&maj, cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
      d.cuDeviceGetAttribute(&mnr, cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
      d.cuDeviceGetAttribute(&sms, cu::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
      size_t total = 0;
      d.cuDeviceTotalMem(&total, dev);
      py::dict di;
      di["index"] = i;
      di["name"] = std::string(name);
      di["compute_capability"] = py::make_tuple(maj, mnr);
      di["total_memory"] = total;
      di["multiprocessors"] = sms;
      devs.append(di);
    }
    info["devices"] = devs;
    try {
      int a = 0, b = 0;
      cu::nvrtc_version(&a, &b);
      info["nvrtc_version"] = std::to_string(a) + "." + std::to_string(b);
      info["nvrtc_path"] = cu::nvrtc_path();
    } catch (const std::exception& e) {
      info["nvrtc_version"] = py::none();
      info["nvrtc_error"] = std::string(e.what());
    }
    info["kernel_cache_dir"] = cu::cache_dir();
    return info;
  });
  m.def(
      "_cuda_synchronize",
      [](int device) {
        py::gil_scoped_release nogil;
        cu::synchronize(device);
      },
      py::arg("device") = -1);
  m.def("_cuda_memory_stats", &memory_stats_dict, py::arg("device") = 0);
  m.def("_cuda_empty_cache", [] {
    py::gil_scoped_release nogil;
    cu::empty_cache();
  });
  m.def(
      "_cuda_stream_ptr",
      [](int device) { return reinterpret_cast<uintptr_t>(cu::stream(device)); },
      py::arg("device") = 0);
  m.def(
      "_cuda_pdl", [](int device) { return cu::pdl_on(device); },
      "whether elementwise kernels on `device` launch with programmatic stream serialization",
      py::arg("device") = 0);
  m.def("_cuda_copy", [](const cl::Tensor& src, const cl::Tensor& dst) {
    py::gil_scoped_release nogil;
    cu::copy_tensor(src, dst);
  });
  // The consumer's stream waits for everything castlab has queued on `device` so far.
  m.def(
      "_cuda_stream_wait_for",
      [](uintptr_t consumer, int device) {
        py::gil_scoped_release nogil;
        cu::other_stream_wait(consumer, device);
      },
      py::arg("consumer_stream"), py::arg("device") = 0);
  // castlab's stream on `device` waits for the producer stream's work queued so far.
  m.def(
      "_cuda_wait_on_stream",
      [](uintptr_t producer, int device) {
        py::gil_scoped_release nogil;
        cu::stream_wait_for(producer, device);
      },
      py::arg("producer_stream"), py::arg("device") = 0);
}

// Kernel compiles: the built-in kernels, precompiles, the cache's counters and log, generated
// sources, NVRTC checks.
void bind_compile(py::module_& m) {
  // The kernels whose sources are fixed (the comparison's, the reductions', the index and
  // loss kernels): (name, source) pairs for _cuda_precompile, in no particular order.
  m.def("_cuda_builtin_kernels", [] {
    std::vector<std::pair<std::string, std::string>> k;
    for (const char* n : {"cl_compare_leaves", "cl_compare_tree", "cl_near_ties", "cl_tie_split",
                          "cl_ulp_error", "cl_ulp_diff"})
      k.emplace_back(n, cu::kCompareSource);
    for (bool f64 : {false, true}) {
      for (int o = 0; o < cl::kOrdCount; ++o)
        if (cu::reduce_kernel_order(o) == o)
          k.emplace_back(cu::reduce_kernel_name(f64, o), cu::reduce_kernel_source(f64, o));
      k.emplace_back(f64 ? "cl_nll_f64" : "cl_nll_f32", cu::nll_kernel_source(f64));
      k.emplace_back(cu::colred_kernel_name(f64), cu::colred_kernel_source(f64));
    }
    for (const char* n : {"cl_gather", "cl_index_check", "cl_scatter_add", "cl_zero"})
      k.emplace_back(n, cu::index_kernel_source());
    return k;
  });
  // Compiles (or loads from the disk cache) each (name, source) for `device` on `threads`
  // threads, as get_kernel would on first use; the first failure is raised after all ran.
  m.def(
      "_cuda_precompile",
      [](int device, const std::vector<std::pair<std::string, std::string>>& kernels, int threads) {
        py::gil_scoped_release nogil;
        cu::precompile(device, kernels, threads);
      },
      py::arg("device"), py::arg("kernels"), py::arg("threads"));
  m.def("_cuda_kernel_cache_stats", [] {
    const cu::CacheStats s = cu::cache_stats();
    py::dict d;
    d["memory_hits"] = s.memory_hits;
    d["module_hits"] = s.module_hits;
    d["disk_hits"] = s.disk_hits;
    d["compiles"] = s.compiles;
    d["disk_rejects"] = s.disk_rejects;
    d["compile_seconds"] = s.compile_seconds;
    return d;
  });
  m.def("_cuda_compile_log", [] {
    py::list out;
    for (const cu::CompileRecord& r : cu::compile_log()) {
      py::dict d;
      d["name"] = r.name;
      d["source_chars"] = r.source_chars;
      d["start"] = r.start;
      d["end"] = r.end;
      d["ok"] = r.ok;
      out.append(d);
    }
    return out;
  });
  // The source the code generator writes for a program on given operands (debugging and
  // tests; needs no GPU).
  // unroll, shape, strides and evict_first_reads are optional (KernelLayout's fields of the
  // same names: the contiguous path's vectors per lane, an n-D kernel's static layout and
  // its load policy).
  m.def(
      "_cuda_generate",
      [](const cl::Program& p, const std::vector<uint8_t>& dtypes, int n_out, int nd, bool contig,
         int vec, bool idx32, int unroll, const std::vector<int64_t>& shape,
         const std::vector<int64_t>& strides, bool evict_first_reads) {
        auto bad = [](const std::string& msg) {
          throw std::invalid_argument("_cuda_generate: " + msg);
        };
        if (n_out < 1 || static_cast<size_t>(n_out) > dtypes.size())
          bad("n_out must be in [1, len(dtypes)] (got " + std::to_string(n_out) + ")");
        if (nd < 0 || nd > 64) bad("nd must be in [0, 64] (got " + std::to_string(nd) + ")");
        if (vec < 1 || vec > 16 || (vec & (vec - 1)) != 0)
          bad("vec must be 1, 2, 4, 8 or 16 (got " + std::to_string(vec) + ")");
        if (unroll < 1 || unroll > 64)
          bad("unroll must be in [1, 64] (got " + std::to_string(unroll) + ")");
        cu::KernelLayout L;
        L.dtypes = dtypes;
        L.n_out = n_out;
        L.nd = nd;
        L.contig = contig;
        L.vec = vec;
        L.idx32 = idx32;
        L.unroll = unroll;
        L.shape = shape;
        L.strides = strides;
        L.evict_first_reads = evict_first_reads;
        const cu::GeneratedKernel g = cu::generate_kernel(p, L);
        return py::make_tuple(g.name, g.source);
      },
      py::arg("program"), py::arg("dtypes"), py::arg("n_out"), py::arg("nd"), py::arg("contig"),
      py::arg("vec"), py::arg("idx32"), py::arg("unroll") = 1,
      py::arg("shape") = std::vector<int64_t>{}, py::arg("strides") = std::vector<int64_t>{},
      py::arg("evict_first_reads") = false);
  // NVRTC alone (no driver, no GPU): where it was found, its version and architectures.
  // Raises with advice when NVRTC cannot be loaded.
  m.def("_nvrtc_info", [] {
    py::dict info;
    int a = 0, b = 0;
    cu::nvrtc_version(&a, &b);
    info["version"] = py::make_tuple(a, b);
    info["path"] = cu::nvrtc_path();
    info["archs"] = cu::nvrtc_supported_archs();
    return info;
  });
  // Compiles generated source for `arch` ("sm_90", "compute_90") exactly as the kernel
  // cache would (same options, same embedded headers) and drops the result: (ok, log).
  m.def(
      "_nvrtc_compile_check",
      [](const std::string& source, const std::string& arch, const std::string& name) {
        cu::NvrtcCheck c;
        {
          py::gil_scoped_release nogil;
          c = cu::nvrtc_compile_check(source, arch, name);
        }
        return py::make_tuple(c.ok, c.log);
      },
      py::arg("source"), py::arg("arch"), py::arg("name") = "castlab_check");
  // The same compile, returning what NVRTC produced (bytes; RuntimeError with the log on
  // failure): tests compare the images of concurrent and serial compiles.
  m.def(
      "_nvrtc_compile_image",
      [](const std::string& source, const std::string& arch, const std::string& name) {
        cu::NvrtcCheck c;
        {
          py::gil_scoped_release nogil;
          c = cu::nvrtc_compile_check(source, arch, name, true);
        }
        if (!c.ok) throw std::runtime_error(c.log);
        return py::bytes(c.image);
      },
      py::arg("source"), py::arg("arch"), py::arg("name") = "castlab_check");
  m.def("_nvrtc_options", &cu::nvrtc_options_for_arch, py::arg("arch"));
}

// The disk kernel cache's file handling.
void bind_disk_cache(py::module_& m) {
  // The disk kernel cache's file handling, for tests (no GPU needed). Each call opens
  // (creating 0700) `dir` as the cache would; a refused folder raises RuntimeError with why.
  struct CacheDir {
    int fd;
    explicit CacheDir(const std::string& dir) {
      std::string why;
      fd = cu::disk::open_dir(dir, &why);
      if (fd < 0) throw std::runtime_error("kernel cache folder refused: " + why);
    }
    ~CacheDir() { close(fd); }
  };
  m.def("_kernel_cache_dir", &cu::cache_dir);
  m.def("_kernel_cache_max_entry_bytes", [] { return cu::disk::kMaxEntryBytes; });
  m.def(
      "_kernel_cache_check_dir",
      [](const std::string& dir) {
        std::string why;
        const int fd = cu::disk::open_dir(dir, &why);
        if (fd < 0) return why;
        close(fd);
        return std::string("ok");
      },
      py::arg("dir"));
  m.def(
      "_kernel_cache_store",
      [](const std::string& dir, const std::string& key, const std::string& kind,
         const py::bytes& payload) {
        const std::string data = payload;
        py::gil_scoped_release nogil;
        CacheDir d(dir);
        return cu::disk::store(d.fd, key, kind, data);
      },
      py::arg("dir"), py::arg("key"), py::arg("kind"), py::arg("payload"));
  m.def(
      "_kernel_cache_load",
      [](const std::string& dir, const std::string& key) {
        std::string status, kind, payload;
        {
          py::gil_scoped_release nogil;
          CacheDir d(dir);
          status = cu::disk::load(d.fd, key, &kind, &payload);
        }
        return py::make_tuple(status, kind, py::bytes(payload));
      },
      py::arg("dir"), py::arg("key"));
  m.def(
      "_kernel_cache_clean",
      [](const std::string& dir, int max_age_s) {
        py::gil_scoped_release nogil;
        CacheDir d(dir);
        return cu::disk::clean_temps(d.fd, max_age_s);
      },
      py::arg("dir"), py::arg("max_age_s") = cu::disk::kStaleTempSeconds);
}
}  // namespace

void bind_cuda(py::module_& m) {
  cu::register_cuda_allocator();
  cu::register_cuda_runner();

  m.def(
      "_cuda_is_available", [] { return cu::is_available(); },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "_cuda_device_count", [] { return cu::device_count(); },
      py::call_guard<py::gil_scoped_release>());
  bind_kernel_sources(m);
  bind_device(m);
  bind_compile(m);
  bind_disk_cache(m);
}
