// Temporary until the DLPack, math-library and CUDA binding files land.
#include "python/src/bindings.h"
void bind_mathlib(py::module_&) {}
