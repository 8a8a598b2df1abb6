// Each binding file registers its part of castlab._C.
#pragma once
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "core/tensor.h"

namespace py = pybind11;

void bind_tensor(py::module_& m);
void bind_program(py::module_& m);
void bind_plan(py::module_& m);
void bind_dlpack(py::module_& m);
void bind_cuda(py::module_& m);
void bind_exhaustive(py::module_& m);
void bind_compare(py::module_& m);

// Storage for memory owned by a Python object (NumPy array, DLPack producer): the
// object is released, under the GIL, when the last castlab view of it dies.
std::shared_ptr<cl::Storage> storage_owned_by(py::object owner, void* data, size_t nbytes,
                                              cl::Device device, bool readonly);
