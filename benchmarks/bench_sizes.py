"""Issue 21: castlab's fused SwiGLU and RoPE against torch.compile at every size, on a GPU.

    python benchmarks/bench_sizes.py [--json out.json] [--quick]

For SwiGLU (silu(a) * b, bf16) and RoPE (x*cos + rotate_half(x)*sin, bf16, x [1, 32, s,
128] with cos/sin [s, 128] broadcast over the heads) at 64K, 1M, 16M and 256M elements,
and Hugging Face's layout (q [4, 28, 4096, 128] and k [4, 4, 4096, 128] in one graph,
cos/sin [4, 4096, 128] broadcast over the heads, as ``apply_rotary_pos_emb`` gets them):

* ``dev ms``: kernel time per call by CUDA events, the launches queued behind a sleep
  kernel so they run back to back (bench_cuda.device_ms); the median of three rounds in
  which castlab and torch.compile take turns, so neither gains from going first or last;
* ``wall us``: a host clock around many calls and one synchronisation at the end: what a
  loop of calls costs, launch-bound at small sizes;
* ``/copy``: the bytes each call must move over ``dev ms``, as a fraction of the
  device-to-device copy bandwidth measured in the same run (a 1 GiB copy);
* ``/copy@size``: the same against a copy that moves the same number of bytes (reads
  half, writes half), timed the same way: the bandwidth a kernel of this size can reach,
  its launch and its tail included;
* ``rot ms``: ``dev ms`` with fresh inputs every call: the calls take their inputs in turn
  from copies that together hold at least four times the L2 cache (at most 16 copies, so
  64K elements stay L2-resident), as the layers of a model would; ``dev ms`` calls on the
  same tensors, which can find some of them still in L2 from the call before;
* ``floor``: the same two clocks around an empty kernel (``torch.cuda._sleep(0)``), and
  the host clock around the replay of a CUDA graph holding that one kernel (what a graph
  launch costs in place of a kernel launch).

Ratios ``compile/castlab`` > 1: castlab faster.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cuda import device_ms, gbps, rope_c, rope_t, stream_of_castlab, to_cl  # noqa: E402

import castlab as cl  # noqa: E402
import castlab.cuda as clcuda  # noqa: E402


def wall_us(fn, iters: int) -> float:
    """Host clock around `iters` calls and one synchronisation, per call (best of 5)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    clcuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        clcuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / iters * 1e6)
    return best


def _rope_hf_t(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return rope_t(q, cos, sin), rope_t(k, cos, sin)


def _rope_hf_c(q, k, cos, sin):
    cos, sin = cl.unsqueeze(cos, 1), cl.unsqueeze(sin, 1)
    return rope_c(q, cos, sin), rope_c(k, cos, sin)


def _cases(quick: bool):
    sizes = [1 << 16, 1 << 20, 1 << 24] + ([] if quick else [1 << 28])
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", generator=g).to(torch.bfloat16)

    for n in sizes:
        ta, tb = rnd(n), rnd(n)
        yield (f"swiglu {n >> 10}K", (ta, tb), lambda a, b: F.silu(a) * b,
               lambda a, b: cl.silu(a) * b, 3 * n * 2)
        del ta, tb
        s = n // (32 * 128)
        tx, tc, ts = rnd(1, 32, s, 128), rnd(s, 128), rnd(s, 128)
        yield (f"rope {n >> 10}K", (tx, tc, ts), rope_t, rope_c,
               2 * tx.numel() * 2 + 2 * tc.numel() * 2)
        del tx, tc, ts
    q, k = rnd(4, 28, 4096, 128), rnd(4, 4, 4096, 128)
    c, s_ = rnd(4, 4096, 128), rnd(4, 4096, 128)
    yield ("rope HF q+k", (q, k, c, s_), _rope_hf_t, _rope_hf_c,
           2 * (q.numel() + k.numel()) * 2 + 2 * c.numel() * 2)


def _copy_bandwidth(ts) -> float:
    src = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    return gbps(2 * src.numel() * 2, device_ms(lambda: dst.copy_(src), ts, iters=10))


def _copy_ms(nbytes: int, ts, iters: int) -> float:
    """Device ms of a copy moving `nbytes` in all (half read, half written)."""
    src = torch.empty(nbytes // 4, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    return device_ms(lambda: dst.copy_(src), ts, iters=iters)


def _rotating(fn, sets):
    """A call of `fn` on the next argument tuple of `sets`, in turn."""
    nxt = itertools.cycle(sets).__next__
    return lambda: fn(*nxt())


def _measure(name, targs, tfn, cfn, nbytes, copy_bw, ts, cs) -> dict:
    """castlab fused (inductor math) and torch.compile on one case; prints two rows."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    nsets = max(2, min(16, -(-4 * l2 // nbytes)))
    tsets = [targs] + [tuple(t.clone() for t in targs) for _ in range(nsets - 1)]
    csets = [tuple(to_cl(t) for t in ta) for ta in tsets]
    jf = cl.jit(cfn, policy="fused", math="inductor")
    torch._dynamo.reset()
    comp = torch.compile(tfn, dynamic=False)
    comp(*targs)
    iters = 2000 if nbytes < (64 << 20) else 50
    same_ms = _copy_ms(nbytes, ts, min(iters, 200))
    r: dict = {"bytes": nbytes, "copy_same_size_ms": same_ms}
    r["rotated_sets"] = nsets
    impls = {"castlab fused": (jf, csets, cs), "torch.compile": (comp, tsets, ts)}
    runs: dict = {k: {"same": [], "rot": []} for k in impls}
    for _ in range(3):  # the two tools in turn, three rounds: no order or drift bias
        for impl, (fn, sets, st) in impls.items():
            n = min(iters, 200)
            runs[impl]["same"].append(device_ms(functools.partial(fn, *sets[0]), st, n, reps=3))
            runs[impl]["rot"].append(device_ms(_rotating(fn, sets), st, n, reps=3))
    for impl, (fn, sets, _st) in impls.items():
        dms, rot = (statistics.median(runs[impl][k]) for k in ("same", "rot"))
        r[impl] = {"dev_ms": dms, "of_copy": gbps(nbytes, dms) / copy_bw,
                   "of_copy_same_size": same_ms / dms, "rotated_dev_ms": rot,
                   "wall_us": wall_us(functools.partial(fn, *sets[0]), iters)}
    c, t = r["castlab fused"], r["torch.compile"]
    for impl in ("castlab fused", "torch.compile"):
        x = r[impl]
        ratios = (f"{t['dev_ms'] / c['dev_ms']:8.2f} {t['rotated_dev_ms'] / c['rotated_dev_ms']:8.2f}"
                  f" {t['wall_us'] / c['wall_us']:8.2f}" if impl == "castlab fused" else "")
        print(f"{name:14} {impl:14} {x['dev_ms']:9.4f} {x['of_copy']:7.1%} "
              f"{x['of_copy_same_size']:11.1%} {x['rotated_dev_ms']:9.4f} {x['wall_us']:9.1f} "
              f"{ratios}")
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="no 256M case")
    a = ap.parse_args()
    assert clcuda.is_available(), clcuda.info()
    ts, cs = torch.cuda.current_stream(), stream_of_castlab()
    res: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    copy_bw = _copy_bandwidth(ts)
    floor = {"dev_ms": device_ms(lambda: torch.cuda._sleep(0), ts, iters=200),
             "wall_us": wall_us(lambda: torch.cuda._sleep(0), 2000)}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.cuda._sleep(0)
    floor["graph_replay_wall_us"] = wall_us(graph.replay, 2000)
    res["copy_GBps"], res["empty_kernel"] = copy_bw, floor
    print(f"# {res['device']}, torch {torch.__version__}; copy {copy_bw:.0f} GB/s; empty "
          f"kernel: {floor['dev_ms'] * 1e3:.2f} us on the device, {floor['wall_us']:.2f} us "
          f"a call in a host loop, {floor['graph_replay_wall_us']:.2f} us as a CUDA graph "
          "replay")
    print(f"{'case':14} {'impl':14} {'dev ms':>9} {'/copy':>7} {'/copy@size':>11} {'rot ms':>9} "
          f"{'wall us':>9} {'c/cl dev':>8} {'c/cl rot':>8} {'c/cl wall':>8}")
    for name, targs, tfn, cfn, nbytes in _cases(a.quick):
        res[name] = _measure(name, targs, tfn, cfn, nbytes, copy_bw, ts, cs)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
