#include "core/debug.h"
#include "python/src/bindings.h"

#ifndef CASTLAB_VERSION
#define CASTLAB_VERSION "0.0.0"
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() = "castlab's C++ core";
  m.attr("__version__") = CASTLAB_VERSION;
  static py::exception<cl::buffer_error> buffer_exc(m, "_BufferError", PyExc_BufferError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const cl::type_error& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const cl::buffer_error& e) {
      PyErr_SetString(PyExc_BufferError, e.what());
    }
  });
  bind_tensor(m);
  bind_program(m);
  bind_plan(m);
  bind_dlpack(m);
  bind_cuda(m);
  bind_exhaustive(m);
  bind_compare(m);
  // CASTLAB_DEBUG, read by Python (castlab._debug) and passed here: C++ prints generated
  // CUDA source from level 3 and the NVRTC log and PTX from level 4.
  m.def("_set_debug_level", &cl::set_debug_level, py::arg("level"));
  m.def("_debug_level", &cl::debug_level);
}
