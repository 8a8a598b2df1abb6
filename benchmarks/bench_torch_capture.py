"""Speed of castlab.torch (issue 17): capture time of a Qwen2.5-0.5B-shaped HF Qwen2
(random init, bf16), a captured forward under each policy as a ratio to PyTorch's eager
forward of the same model, and the time of castlab.torch.drift.

    python benchmarks/bench_torch_capture.py                      # CPU, 2 layers, seq 32
    python benchmarks/bench_torch_capture.py --device cuda --layers 24 --seq 512 \\
        --vocab 151936 --drift none --json out.json               # the issue's GPU figures

Times are the median of `--repeat` rounds after one warm-up call of each run (which
traces, lowers and, on a GPU, compiles the kernels), the runs taking turns within a round;
GPU times are synchronised. Ratios < 1.5 are the issue's target for every policy, the fp64
policy's against the same model in fp64 (`model.double()`, PyTorch eager: the fp64 policy
runs the external nodes, matmuls included, in fp64); drift over 24 layers at sequence 512 should take under a minute
on the H200 (`--drift none`: per-node errors only; `rounding`: also each node's share of
the output error, one rerun of the rest of the model per castlab node, much longer).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch

import castlab.torch as ct


def _model(layers: int, vocab: int, device: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=896, num_attention_heads=14, num_key_value_heads=2,
                      intermediate_size=4864, vocab_size=vocab, num_hidden_layers=layers,
                      max_position_embeddings=4096)
    cfg._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(cfg).to(torch.bfloat16).to(device).eval()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _interleaved(runs: dict, repeat: int, device: str) -> dict:
    """Median seconds of each run: one warm-up call each, then `repeat` rounds that call
    every run once in turn (so a drift of the machine's clocks or load over the
    measurement reaches all runs alike)."""
    for f in runs.values():
        f()
    _sync(device)
    ts: dict = {k: [] for k in runs}
    for _ in range(repeat):
        for k, f in runs.items():
            t0 = time.perf_counter()
            f()
            _sync(device)
            ts[k].append(time.perf_counter() - t0)
    return {k: (statistics.median(v), min(v), max(v)) for k, v in ts.items()}


def _breakdown(cm, ids, kw, repeat: int, device: str, policy: str, math: str) -> dict:
    """Host time of each step castlab takes per region of a forward under policy/math
    (median over `repeat` forwards, in microseconds per region): reading its inputs from
    the run's values, importing them (DLPack, stream order), the jit call (of which the
    plan's C++ run: allocation, launches or CPU kernels), exporting the outputs. The
    regions are run one after another on the values of one full forward; a GPU is
    synchronised only after each forward, as in a real run."""
    from castlab._dlpack import from_torch_region, to_torch_region
    from castlab.policy import as_math, as_policy
    from castlab.torch._program import _no_grad_view

    pol, mth = as_policy(policy), as_math(math)
    with torch.no_grad():
        env = cm.execute(cm._flat_inputs((ids,), kw), pol, mth).env
    regs = [s for s in cm.segments if s.kind == "region"]
    names = ("gather", "import", "jit.run", "plan.run", "export")
    per: dict = {k: [] for k in names}
    for _ in range(repeat + 1):
        acc = dict.fromkeys(names, 0.0)
        streams: dict = {}  # as execute: PyTorch's current stream read once a forward
        for seg in regs:
            t0 = time.perf_counter()
            ins = [_no_grad_view(env[n.name]) for n in seg.inputs]
            t1 = time.perf_counter()
            xs = from_torch_region(ins, [n.name not in cm._user for n in seg.inputs], streams)
            t2 = time.perf_counter()
            outs = seg.jit.run(*xs, policy=pol, math=mth)
            t3 = time.perf_counter()
            to_torch_region(outs if isinstance(outs, (list, tuple)) else [outs], streams)
            t4 = time.perf_counter()
            tr, cap = seg.jit._traced(list(xs))
            plan = tr.plans[(pol, mth)]
            t5 = time.perf_counter()
            plan.run(list(xs) + cap)
            t6 = time.perf_counter()
            for k, v in zip(names, (t1 - t0, t2 - t1, t3 - t2, t6 - t5, t4 - t3)):
                acc[k] += v
        _sync(device)
        for k in names:
            per[k].append(acc[k] / len(regs) * 1e6)
    out = {k: statistics.median(v[1:]) for k, v in per.items()}
    print(f"host time per region ({len(regs)} regions, {policy}/{math}), microseconds: "
          + "  ".join(f"{k} {v:.1f}" for k, v in out.items()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=151936 // 16)
    ap.add_argument("--repeat", type=int, default=11)
    ap.add_argument("--drift", default="none", choices=["skip", "none", "rounding"])
    ap.add_argument("--breakdown", action="store_true",
                    help="also the host time of each step of a castlab region, per region")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    m = _model(a.layers, a.vocab, a.device)
    ids = torch.randint(0, a.vocab, (1, a.seq), device=a.device)
    kw = {"use_cache": False}
    res: dict = {"device": a.device, "layers": a.layers, "seq": a.seq, "vocab": a.vocab}
    t0 = time.perf_counter()
    cm = ct.capture(m, ids, kwargs=kw)
    res["capture_s"] = time.perf_counter() - t0
    print(f"capture: {res['capture_s']:.2f} s  ({cm})")
    m64 = copy.deepcopy(m).double()
    runs = {"torch eager (bf16)": lambda: m(ids, **kw),
            "torch eager (fp64)": lambda: m64(ids, **kw)}
    for pol, mth in (("eager", "torch_eager"), ("fused", "inductor"), ("fp64", "torch_eager")):
        runs[f"castlab {pol}/{mth}"] = (
            lambda pol=pol, mth=mth: cm.run(ids, kwargs=kw, policy=pol, math=mth))
    with torch.no_grad():
        times = _interleaved(runs, a.repeat, a.device)
    base, base64 = times["torch eager (bf16)"][0], times["torch eager (fp64)"][0]
    res["torch_eager_s"], res["torch_eager_fp64_s"] = base, base64
    print(f"{'run':<26} {'median s':>10} {'min s':>8} {'max s':>8} {'x torch eager':>14} "
          f"{'x torch fp64':>13}")
    for name, (t, lo, hi) in times.items():
        res[name] = {"median_s": t, "min_s": lo, "max_s": hi}
        r64 = f"{t / base64:>13.2f}" if "fp64" in name else ""
        print(f"{name:<26} {t:>10.4f} {lo:>8.4f} {hi:>8.4f} {t / base:>14.2f} {r64}")
    if a.breakdown:
        for pol, mth in (("eager", "torch_eager"), ("fused", "inductor")):
            res[f"breakdown_{pol}_us_per_region"] = _breakdown(cm, ids, kw, a.repeat, a.device,
                                                               pol, mth)
    if a.drift != "skip":
        t0 = time.perf_counter()
        ct.drift(cm, (ids,), a="eager", b="fused/inductor", kwargs=kw,
                 contributions=None if a.drift == "none" else a.drift)
        _sync(a.device)
        res[f"drift_{a.drift}_s"] = time.perf_counter() - t0
        print(f"drift (contributions={a.drift}): {res[f'drift_{a.drift}_s']:.1f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
