#!/usr/bin/env bash
# On a machine with two (or more) GPUs: a 64-cell study grid serially and on a Dask
# LocalCluster with one worker per GPU; checks that the rows are equal and prints the
# time ratio. Usage: bash scripts/dask_gpu_check.sh [wheel folder for dask, if offline]
set -eu
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ $# -ge 1 ] && ! $PY -c 'import distributed' 2>/dev/null; then
  $PY -m pip install -q --no-index --find-links "$1" "dask[distributed]"
fi
if [ ! -f python/castlab/_C*.so ] || [ "${REBUILD:-1}" = 1 ]; then
  cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DCASTLAB_INPLACE=ON \
      -DPython_EXECUTABLE="$(command -v $PY)" > /dev/null
  cmake --build build/gpu -j"$(nproc)" > /dev/null
fi
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
$PY - <<'PYEOF'
import time
import castlab as cl
from castlab import study

n = cl.cuda.device_count()
kw = dict(chains=["swiglu", "rope"], dtypes=["bfloat16", "float16"], seeds=list(range(16)),
          device="cuda", grad=True)
study.run(**dict(kw, seeds=[0]))  # warm: kernels compiled and cached
t = time.perf_counter(); serial = study.run(**kw); ts = time.perf_counter() - t
t = time.perf_counter(); dask = study.run(**kw, workers=n); td = time.perf_counter() - t
cells = 2 * 2 * 16
print(f"{cells}-cell grid on {n} GPUs: serial {ts:.2f} s, Dask {n} workers {td:.2f} s, "
      f"ratio {td / ts:.2f}; rows equal: {serial.equals(dask)}")
assert serial.equals(dask)
PYEOF
