#!/usr/bin/env bash
# Named GPU checks inside one device call, each cut at the time the call has left, every
# log packed into one file ($OUT/all.tgz: a device call returns a handful of files).
# scripts/gpu_check.sh is the whole check (build, every CUDA test, every benchmark); this is
# for a session that must spend a short device budget on a few named pieces.
#
# Usage: DEADLINE_S=560 bash scripts/gpu_steps.sh STEP...
#   testing      benchmarks/bench_testing_cuda.py (issue 54: kernel / castlab split)
#   cold         benchmarks/bench_cold_compile.py --no-serial (issue 53: 20 s goal)
#   bounds16     castlab bounds rope --dtype fp16 for unsloth, flash_attn, vllm, apex
#   vocab        benchmarks/bench_vocab.py and --fuse (issue 49)
#   reduce       benchmarks/bench_reduce.py
#   bench        benchmarks/bench_cuda.py
#   backward     benchmarks/bench_backward.py
#   stacks       benchmarks/bench_stacks.py --device cuda
#   stacks24     the same on issue 52's size (24 layers, hidden 896, vocabulary 151,936,
#                512 tokens), the pairs liger:vllm, liger:hf_eager and vllm:torch_compile
#   widths       benchmarks/bench_widths.py (issue 49's table: every width against torch
#                eager and torch.compile); widths_bwd: the same with --backward
#                (WIDTHS_ONLY=rmsnorm,softmax: those cases only)
#   cprof        scripts/compile_profile.py (the longest NVRTC runs of a cold library study)
#   online       Inductor's online softmax against torch.compile (softmax at every width,
#                log_softmax and cross-entropy over a vocabulary, the label-smoothed loss's
#                contraction: tests/test_reduce_cuda.py; ~1-5 min on 8 workers)
#   rowk         the register row kernel and reductions of columns against the CPU
#   onlinek      Inductor's online softmax sum in the looped register kernel against the
#                separate steps and the CPU (fused by default since it passed, 2026-12-08)
#   bwdsweep     the softmax backward sweep (every length, eager order, fused and separate)
#   stack32k     the torch_compile stack on a Qwen2 with a 32,000 vocabulary (issue 52)
#   bwdprof      scripts/bwd_profile.py (the kernels of each backward, eager and fused)
#   rmsprof      scripts/bwd_profile.py on HF RMSNorm [16384, 4096], both gradients
#   t:FILE[,FILE...][:MARK]   pytest -m MARK (default "cuda and not slow") on the files
#                (PYTEST_EXTRA: more pytest arguments, e.g. "-k rms_norm -x --tb=short")
# CASTLAB_PREBUILT=1 uses a carried _C (see gpu_check.sh); otherwise the build runs first.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_steps_out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
START=$(date +%s)
DEADLINE=$((START + ${DEADLINE_S:-560}))
export PYTHONUNBUFFERED=1
export CASTLAB_CACHE_DIR="${CASTLAB_CACHE_DIR:-/tmp/castlab_kernel_cache}"
export CASTLAB_GPU_REPORT="$OUT/report.jsonl"
left() { echo $((DEADLINE - $(date +%s))); }
pack() { tar -czf "$OUT/all.tgz" -C "$OUT" --exclude all.tgz . 2>/dev/null; }
trap pack EXIT

{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  $PY -c 'import torch; print("torch", torch.__version__)'; } > "$OUT/env.txt" 2>&1
if [ "${CASTLAB_PREBUILT:-0}" = 1 ] && PYTHONPATH="$PWD/python" $PY -c 'import castlab._C' 2>"$OUT/prebuilt.log"; then
  echo "build: skipped (carried _C)"
else
  t0=$(date +%s)
  cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DCASTLAB_INPLACE=ON \
    -DPython_EXECUTABLE="$(command -v $PY)" > "$OUT/build.log" 2>&1 &&
    cmake --build build/gpu -j"$(nproc)" >> "$OUT/build.log" 2>&1 || { echo BUILD FAILED; tail -30 "$OUT/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
fi
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
if ls wheels/liger_kernel-*.whl > /dev/null 2>&1; then
  $PY -m pip install --no-deps --no-index wheels/liger_kernel-*.whl > "$OUT/pip_wheels.log" 2>&1 || tail -3 "$OUT/pip_wheels.log"
fi

step() {  # step NAME COMMAND...: run with the time left, log to $OUT/NAME.log
  local name=$1; shift
  local t=$(( $(left) - 10 )) t0 rc
  if [ "$t" -lt 15 ]; then echo "== $name: no time left, skipped"; return; fi
  t0=$(date +%s)
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1; rc=$?
  echo "== $name: rc $rc, $(( $(date +%s) - t0 )) s"
  tail -n "${TAIL:-25}" "$OUT/$name.log"
}

t() {  # t FILES K NAME: pytest -k K on FILES, its short summary at the end of NAME.log
  # (SIGINT at the deadline: pytest still prints which tests failed so far)
  local tl=$(( $(left) - 15 ))
  if [ "$tl" -lt 15 ]; then echo "== $3: no time left, skipped"; return; fi
  TAIL=40 step "$3" timeout -s INT "$tl" $PY -m pytest -q -p no:cacheprovider -W ignore \
    -n "${CASTLAB_TEST_JOBS:-8}" -rfEx --tb=short --show-capture=no $1 -k "$2"
}

for s in "$@"; do
  case "$s" in
    testing) step testing $PY benchmarks/bench_testing_cuda.py --json "$OUT/bench_testing.json" ;;
    cold) step cold $PY benchmarks/bench_cold_compile.py --no-serial --json "$OUT/bench_cold.json" ;;
    bounds16) step bounds16 $PY -m castlab bounds rope --dtype fp16 --device cuda \
                --libraries unsloth flash_attn vllm apex --out "$OUT/bounds16" ;;
    vocab) step vocab $PY benchmarks/bench_vocab.py --json "$OUT/vocab.json"
           step vocab_fuse $PY benchmarks/bench_vocab.py --fuse --json "$OUT/vocab_fuse.json" ;;
    reduce) step reduce $PY benchmarks/bench_reduce.py --json "$OUT/bench_reduce.json" ;;
    bench) step bench $PY benchmarks/bench_cuda.py --json "$OUT/bench.json" ;;
    backward) step backward $PY benchmarks/bench_backward.py --json "$OUT/bench_backward.json" ;;
    cprof) step cprof $PY scripts/compile_profile.py --out "$OUT/cprof" ;;
    online) t "tests/test_reduce_cuda.py" "inductor_softmax or vocabulary or label_smoothing_loss" online ;;
    rowk) t "tests/test_reduce_cuda.py" "row_kernel_equals or many_rows or columns" rowk ;;
    onlinek) t "tests/test_reduce_cuda.py" "online_softmax_row_kernel or (row_kernel_equals and triton)" onlinek ;;
    bwdsweep) t "tests/test_reduce_sweep_cuda.py" "backward" bwdsweep ;;
    stack32k) t "tests/test_stacks_cuda.py" "vocabulary" stack32k ;;
    bwdprof) step bwdprof $PY scripts/bwd_profile.py ;;
    rmsprof) TAIL=80 step rmsprof $PY scripts/bwd_profile.py --only rmsnorm --rows 16384 --n 4096 --argnums 0,1 ;;
    stacks) step stacks $PY benchmarks/bench_stacks.py --device cuda --json "$OUT/stacks.json" ;;
    stacks24) step stacks24 $PY benchmarks/bench_stacks.py --device cuda --layers 24 --hidden 896 \
                --vocab 151936 --tokens 512 --pairs liger:vllm,liger:hf_eager,vllm:torch_compile \
                --json "$OUT/stacks24.json" ;;
    widths) step widths $PY benchmarks/bench_widths.py ${WIDTHS_ONLY:+--only $WIDTHS_ONLY} \
              --json "$OUT/widths.json" ;;
    widths_bwd) step widths_bwd $PY benchmarks/bench_widths.py --backward \
                  ${WIDTHS_ONLY:+--only $WIDTHS_ONLY} --json "$OUT/widths_bwd.json" ;;
    t:*)
      spec=${s#t:}; files=${spec%%:*}; mark="cuda and not slow"
      [ "$spec" != "$files" ] && mark=${spec#*:}
      # shellcheck disable=SC2086
      TAIL=40 step "tests_$(echo "$files" | tr ',/' '__' | cut -c1-60)" $PY -m pytest -m "$mark" ${files//,/ } \
        -v -rfEx -p no:cacheprovider -n "${CASTLAB_TEST_JOBS:-8}" --durations=10 ${PYTEST_EXTRA:-} ;;
    *) echo "unknown step $s" ;;
  esac
done
echo "total: $(( $(date +%s) - START )) s"
