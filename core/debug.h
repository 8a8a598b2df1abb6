// castlab's debug level (CASTLAB_DEBUG). Python reads the environment variable (in
// python/castlab/_debug.py) and sets the level here; C++ never reads it itself.
//   1: traces, 2: also programs (both printed by Python), 3: also generated CUDA source,
//   4: also the NVRTC log and PTX of each kernel compiled.
#pragma once

namespace cl {

int debug_level();
void set_debug_level(int level);

}  // namespace cl
