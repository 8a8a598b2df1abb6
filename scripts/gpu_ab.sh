#!/usr/bin/env bash
# Compare castlab builds on one GPU in one device call: benchmarks/bench_vocab.py (or the
# benchmark given by BENCH) once per build, each build a folder holding a `castlab` package
# with its own _C, so every ratio against torch eager is measured on the same card minutes
# apart. Device time is scarce and a card's figures do not carry to another card.
#
#   bash scripts/gpu_ab.sh python _ab/rowshift _ab/no_int     # folders holding castlab/
#   BENCH="benchmarks/bench_reduce.py --quick" bash scripts/gpu_ab.sh python _ab/x
#   TESTS="tests/test_reduce_cuda.py -k softmax" bash scripts/gpu_ab.sh _ab/x   # + pytest -n 14
#
# Build each variant on the CPU machine for the device's Python (3.12):
#   git worktree add /tmp/v1 BRANCH && cmake -S /tmp/v1 -B /tmp/v1/build -DCASTLAB_INPLACE=ON \
#     -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=python3.12 && cmake --build /tmp/v1/build
#   mkdir -p _ab/v1 && cp -r /tmp/v1/python/castlab _ab/v1/
# and carry each folder (run's `carry`: _ab/v1; _ab/ is git-ignored, so it travels only so).
# Output: one block per build; logs under $OUT (default ./gpu_ab_out).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_ab_out}"
mkdir -p "$OUT"
BENCH="${BENCH:-benchmarks/bench_vocab.py}"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 CASTLAB_CACHE_DIR="${CASTLAB_CACHE_DIR:-/tmp/castlab_kernel_cache}"
[ $# -ge 1 ] || { echo "usage: $0 FOLDER [FOLDER ...] (each holding castlab/)" >&2; exit 2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || exit 1
rc=0
for dir in "$@"; do
  name=$(echo "$dir" | tr '/' '_')
  case "$dir" in /*) path="$dir" ;; *) path="$PWD/$dir" ;; esac
  echo "== $dir"
  if ! PYTHONPATH="$path" $PY -c 'import castlab._C, castlab; print(castlab.__file__)'; then
    echo "   $dir: castlab does not import (its _C built for this Python?)"; rc=1; continue
  fi
  # shellcheck disable=SC2086  # BENCH may carry arguments
  PYTHONPATH="$path" $PY $BENCH > "$OUT/bench_$name.txt" 2>&1 || rc=1
  grep -vE "^\s*$" "$OUT/bench_$name.txt" | grep -E "^#|castlab|rror" | head -40
  if [ -n "${TESTS:-}" ]; then  # the same build's bits: pytest over TESTS
    # shellcheck disable=SC2086
    PYTHONPATH="$path" $PY -m pytest -q -n 14 -p no:cacheprovider $TESTS > "$OUT/tests_$name.txt" 2>&1 || rc=1
    tail -3 "$OUT/tests_$name.txt"
  fi
done
exit $rc
