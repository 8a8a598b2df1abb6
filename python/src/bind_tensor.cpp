#include <pybind11/functional.h>

#include "core/checked.h"
#include "core/parallel.h"
#include "python/src/bindings.h"

using cl::Shape;
using cl::Tensor;

std::shared_ptr<cl::Storage> storage_owned_by(py::object owner, void* data, size_t nbytes,
                                              cl::Device device, bool readonly) {
  auto s = std::make_shared<cl::Storage>();
  s->data = data;
  s->nbytes = nbytes;
  s->device = device;
  s->readonly = readonly;
  auto* held = new py::object(std::move(owner));
  s->deleter = [held](void*) {
    if (!Py_IsInitialized()) return;  // interpreter gone: leak rather than crash
    py::gil_scoped_acquire gil;
    delete held;
  };
  return s;
}

namespace {

cl::Device parse_device(const std::string& s) { return cl::Device::parse(s); }

py::tuple to_tuple(const Shape& s) {
  py::tuple t(s.size());
  for (size_t i = 0; i < s.size(); ++i) t[i] = s[i];
  return t;
}

}  // namespace

void bind_tensor(py::module_& m) {
  m.def("itemsize",
        [](const std::string& name) { return cl::itemsize(cl::dtype_from_name(name)); });
  m.def("num_threads", &cl::num_threads);
  m.def("cpu_empty_cache", &cl::cpu_empty_cache, "return cached host memory blocks to the OS");
  m.def("set_num_threads", &cl::set_num_threads, py::call_guard<py::gil_scoped_release>());
  m.def("broadcast_shapes",
        [](const Shape& a, const Shape& b) { return cl::broadcast_shapes(a, b); });

  py::class_<Tensor>(m, "Tensor", py::dynamic_attr())
      .def_property_readonly("shape", [](const Tensor& t) { return to_tuple(t.shape()); })
      .def_property_readonly("_strides", [](const Tensor& t) { return to_tuple(t.strides()); })
      .def_property_readonly("_offset", &Tensor::offset)
      .def_property_readonly(
          "_dtype_name",
          [](const Tensor& t) { return std::string(cl::dtype_info(t.dtype()).name); })
      .def_property_readonly("_device_str", [](const Tensor& t) { return t.device().str(); })
      .def_property_readonly("_device_type",
                             [](const Tensor& t) { return static_cast<int>(t.device().type); })
      .def_property_readonly("_device_index", [](const Tensor& t) { return t.device().index; })
      .def_property_readonly("ndim", &Tensor::ndim)
      .def("dim", &Tensor::ndim)
      .def("numel", &Tensor::numel)
      .def_property_readonly("itemsize", &Tensor::itemsize)
      .def("data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); })
      .def_property_readonly(
          "_storage_ptr",
          [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.storage()->data); })
      .def_property_readonly("_storage_nbytes", [](const Tensor& t) { return t.storage()->nbytes; })
      .def_property_readonly("readonly", &Tensor::readonly)
      .def("is_contiguous", &Tensor::is_contiguous)
      .def("_slice", &Tensor::slice)
      .def("_select", &Tensor::select)
      .def("_permute", &Tensor::permute)
      .def("_transpose", &Tensor::transpose)
      .def("_unsqueeze", &Tensor::unsqueeze)
      .def("_squeeze", &Tensor::squeeze)
      .def("_expand", &Tensor::expand)
      .def("_view_or_none",
           [](const Tensor& t, const Shape& s) -> py::object {
             Tensor v = t.view_or_null(s);
             if (!v.defined()) return py::none();
             return py::cast(v);
           })
      .def("_infer_shape", &Tensor::infer_shape)
      .def("_same_storage",
           [](const Tensor& a, const Tensor& b) { return a.storage() == b.storage(); })
      .def("_bits", [](const Tensor& t, int64_t elem) {
        // raw bits of one element of a CPU tensor (elem: offset in elements from data_ptr)
        if (t.device().type != cl::DeviceType::CPU)
          throw std::invalid_argument("_bits needs a CPU tensor");
        // elem must name an element of the storage: data_ptr() + elem lies inside it
        const int64_t cap = static_cast<int64_t>(t.storage()->nbytes) / t.itemsize();
        if (elem < -t.offset() || elem >= cap - t.offset())
          throw std::out_of_range(
              "_bits: element " + std::to_string(elem) + " is outside the storage (valid: [" +
              std::to_string(-t.offset()) + ", " + std::to_string(cap - t.offset()) + "))");
        const char* p = static_cast<const char*>(t.data_ptr()) + elem * t.itemsize();
        uint64_t v = 0;
        std::memcpy(&v, p, t.itemsize());
        return v;
      });

  m.def("may_overlap", &cl::may_overlap,
        "do two tensors' memory ranges intersect? (by address: also across NumPy/DLPack "
        "imports of one buffer)");
  m.def("same_elements", &cl::same_elements,
        "are two tensors the same elements in the same order (same address, strides)?");
  m.def("has_internal_overlap", &cl::has_internal_overlap,
        "do two indices of the tensor reach the same memory (e.g. an expanded view)?");
  m.def("empty", [](const Shape& shape, const std::string& dtype, const std::string& device) {
    return Tensor::empty(shape, cl::dtype_from_name(dtype), parse_device(device));
  });
  m.def(
      "from_pointer",
      [](uintptr_t ptr, const Shape& shape, const Shape& strides, const std::string& dtype,
         py::object owner, bool readonly, const std::string& device) {
        const auto code = cl::dtype_from_name(dtype);
        const int64_t isz = cl::itemsize(code);
        // Span of memory the view touches (strides may be negative): base the storage at
        // the lowest address so every element is inside it.
        if (shape.size() != strides.size())
          throw std::invalid_argument("from_pointer: shape and strides differ in length");
        for (int64_t s : shape)
          if (s < 0)
            throw std::invalid_argument("from_pointer: negative dimension in shape " +
                                        cl::shape_str(shape));
        cl::numel_of(shape, "from_pointer");
        int64_t lo = 0, hi = 0;
        const bool empty = !cl::strided_extent(shape, strides, &lo, &hi);
        // (hi - lo + 1) * isz bytes from ptr + lo * isz, all of it addressable
        int64_t span = 0, lo_bytes = 0;
        if (!empty && (!cl::span_bytes(lo, hi, isz, &span) || !cl::mul_ok(lo, isz, &lo_bytes) ||
                       (lo_bytes < 0 && static_cast<uint64_t>(-lo_bytes) > ptr) ||
                       static_cast<uint64_t>(span) > UINTPTR_MAX - (ptr + lo_bytes)))
          throw std::invalid_argument("from_pointer: the view spans more memory than exists");
        char* base = empty ? reinterpret_cast<char*>(ptr)
                           : reinterpret_cast<char*>(static_cast<uintptr_t>(ptr + lo_bytes));
        const size_t nbytes = static_cast<size_t>(span);
        auto storage = storage_owned_by(std::move(owner), base, empty ? 0 : nbytes,
                                        parse_device(device), readonly);
        return Tensor(storage, shape, strides, -lo, code);
      },
      py::arg("ptr"), py::arg("shape"), py::arg("strides"), py::arg("dtype"), py::arg("owner"),
      py::arg("readonly") = false, py::arg("device") = "cpu");
}
