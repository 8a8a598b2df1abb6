#!/usr/bin/env python3
"""Probe what torch.compile (Inductor + Triton) generates for softmax, log_softmax, HF RMSNorm
and cross-entropy over wide rows, forward and backward, on a CUDA GPU (written for torch 2.11,
Triton 3.6, H200).

Self-contained: torch only. Writes $OUT/inductor_probe.jsonl (or --out): one JSON record per
case (plus a first "env" record), each holding, for every Triton kernel Inductor generated for
that case (forward and backward graphs):

  name, graph (fwd/bwd), kind (persistent "triton_per_" / looped "triton_red_" / pointwise
  "triton_poi_"), xnumel and r0_numel read from the kernel source, a split hint, the reduction
  hint and inductor_meta counters, the config it launches with (XBLOCK, R0_BLOCK, num_warps,
  num_stages, n_regs, n_spills), every compiled candidate config, the autotuning timings when it
  autotuned (all candidates with times, so the margin is visible), opcode counts of its PTX
  (ex2/lg2/div.full/fma/shfl...), and its source text (truncated to 6000 chars).

Usage (on the GPU machine):  python3 inductor_probe.py [--jobs 12] [--deadline 75] [--full]
  --deadline  seconds after start past which no new case starts (records say "skipped").
  --jobs      worker processes (compilation is CPU bound; each has its own caches).
              Autotuning benchmarks are serialised across workers by a lock; other workers'
              kernels may still run meanwhile: use --jobs 1 for the cleanest timings.
  --only      comma list of ops to run (softmax,log_softmax,rmsnorm,ce).
  --rows/--ns/--dtypes  override the grids.
  --ptx-dump  also write full PTX of selected kernels to $OUT/inductor_ptx.jsonl.
"""
import argparse
import json
import os
import re
import sys
import tempfile
import time
import traceback

NS = [1024, 2048, 4096, 8192, 16384, 32000, 32064, 50257, 65536, 100352, 128256,
      151936, 152064, 262144]
EPS = 1e-6
MEM_TOKENS = 12  # x 10 GB of GPU memory shared by the workers
SRC_LIMIT = 6000
PTX_DUMP_CASES = {(2048, 1024), (2048, 4096), (2048, 32000), (2048, 151936), (8, 151936),
                  (8, 4096)}

# --------------------------------------------------------------------------------------
# worker state (set by _init in each worker process)
_G = {}


def _init(bench_lock, big_sem, gate, deadline, workdir):
    pid = os.getpid()
    # fresh caches per worker, set before torch/triton read them
    os.environ["TRITON_CACHE_DIR"] = os.path.join(workdir, f"triton_{pid}")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(workdir, f"inductor_{pid}")
    os.environ.setdefault("PYTHONHASHSEED", "0")
    import torch  # noqa: F401
    import torch._functorch.config as fc
    import torch._inductor.config as ic
    ic.fx_graph_cache = False
    ic.fx_graph_remote_cache = False
    ic.autotune_local_cache = False
    ic.autotune_remote_cache = False
    ic.compile_threads = 1
    try:
        fc.enable_autograd_cache = False
    except Exception:
        pass
    _G.update(bench_lock=bench_lock, big_sem=big_sem, gate=gate, deadline=deadline,
              workdir=workdir,
              bench=[], tuners=[])
    _patch_inductor()


def _cfg(cfg):
    d = {k: (int(v) if isinstance(v, (int, bool)) else str(v)) for k, v in cfg.kwargs.items()}
    d["num_warps"] = int(cfg.num_warps)
    d["num_stages"] = int(cfg.num_stages)
    return d


def _patch_inductor():
    from torch._inductor.runtime import triton_heuristics as th
    CA = th.CachingAutotuner
    orig_bench = CA.benchmark_all_configs
    orig_init = CA.__init__

    def bench(self, *a, **k):
        lock = _G.get("bench_lock")
        if lock is not None:
            lock.acquire()
        try:
            timings = orig_bench(self, *a, **k)
        finally:
            if lock is not None:
                lock.release()
        try:
            name = getattr(self.fn, "__name__", None) or self.inductor_meta.get("kernel_name")
            cands = []
            for launcher, t in timings.items():
                cands.append(dict(config=_cfg(launcher.config), ms=float(t),
                                  n_regs=getattr(launcher, "n_regs", None),
                                  n_spills=getattr(launcher, "n_spills", None)))
            cands.sort(key=lambda c: c["ms"])
            _G["bench"].append(dict(kernel=name, candidates=cands))
        except Exception as e:  # never break the run for the record
            _G["bench"].append(dict(kernel="?", error=repr(e)))
        return timings

    def init(self, *a, **k):
        orig_init(self, *a, **k)
        _G["tuners"].append(self)

    CA.benchmark_all_configs = bench
    CA.__init__ = init


# --------------------------------------------------------------------------------------
def _ops(ops, eps):
    import torch
    import torch.nn.functional as F

    def rmsnorm(x, w):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return h.to(x.dtype) * w

    def f(*args):
        outs = []
        i = 0
        for op in ops:
            if op == "softmax":
                outs.append(torch.softmax(args[i], -1))
                i += 1
            elif op == "log_softmax":
                outs.append(torch.log_softmax(args[i], -1))
                i += 1
            elif op == "rmsnorm":
                outs.append(rmsnorm(args[i], args[i + 1]))
                i += 2
            elif op == "ce":
                outs.append(F.cross_entropy(args[i], args[i + 1]))
                i += 2
        return tuple(outs)
    return f


def _inputs(ops, rows, n, dtype, train, seed=0):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    args, grads = [], []
    for op in ops:
        x = (torch.randn(rows, n, generator=g, device=dev, dtype=torch.float32) * 2.0).to(dtype)
        x.requires_grad_(train)
        args.append(x)
        if op == "rmsnorm":
            w = (1.0 + 0.1 * torch.randn(n, generator=g, device=dev)).to(dtype)
            w.requires_grad_(train)
            args.append(w)
        if op == "ce":
            t = torch.randint(0, n, (rows,), generator=g, device=dev)
            args.append(t)
            grads.append(None)
        else:
            grads.append(torch.randn(rows, n, generator=g, device=dev).to(dtype))
    return args, grads


_KSRC = re.compile(r"(\w+)\s*=\s*async_compile\.triton\(\s*'(\w+)'\s*,\s*'''(.*?)'''", re.S)
_OPC = re.compile(r"^\s*(?:@!?%?\w+\s+)?([a-z][a-z0-9_]*(?:\.[a-zA-Z0-9_]+)*)\s", re.M)


def _ptx_summary(path):
    try:
        txt = open(path).read()
    except Exception:
        return None, None
    from collections import Counter
    body = txt.split(".entry", 1)[-1]
    c = Counter(m.group(1) for m in _OPC.finditer(body))
    keep = {k: v for k, v in c.items()
            if not k.startswith(("ld.param", "mov", "cvt.u", "setp", "selp", "bra",
                                 "shl", "shr", "and", "or", "add.s", "add.u", "mul.lo",
                                 "mad.lo", "mul.wide", "mad.wide", "sub.s", "cvta", "not",
                                 "xor", "ret", "prmt"))}
    return dict(sorted(keep.items())), txt


def _ttgir_layouts(path):
    """The layout definitions (#blocked...) and the reduce signatures of the TTGIR."""
    try:
        txt = open(path).read()
    except Exception:
        return None
    lays = [ln.strip() for ln in txt.splitlines() if re.match(r"^#\w+ = #ttg\.", ln)]
    reds = [ln.strip()[:300] for ln in txt.splitlines()
            if re.match(r"^\s*\}\) : \(tensor<", ln)]
    return dict(layouts=lays[:24], reduces=reds[:16],
                num_warps=re.findall(r'"ttg.num-warps" = (\d+)', txt)[:1])


def _meta(t):
    im = getattr(t, "inductor_meta", {}) or {}
    keys = ("reduction_hint", "num_load", "num_store", "num_reduction",
            "add_persistent_rblock", "RSPLIT_SIZE", "persistent_reduction", "no_x_dim",
            "kernel_name", "mutated_arg_names")
    out = {}
    for k in keys:
        if k in im:
            v = im[k]
            out[k] = v if isinstance(v, (int, float, bool, str, type(None))) else str(v)
    return out


def _xr(src):
    d = {}
    for key in ("xnumel", "r0_numel", "ynumel"):
        m = re.search(rf"^\s*{key}\s*=\s*(\d+)\s*$", src, re.M)
        if m:
            d[key] = int(m.group(1))
    return d


def _kind(name):
    for p, k in (("triton_per_", "persistent"), ("triton_red_", "looped"),
                 ("triton_poi_", "pointwise"), ("triton_tem_", "template")):
        if name.startswith(p):
            return k
    return "other"


def _split_hint(kind, xr, rows, n):
    x, r = xr.get("xnumel"), xr.get("r0_numel")
    if kind not in ("persistent", "looped") or x is None or r is None:
        return None
    if x == rows and r == n:
        return "whole_row"
    if x % rows == 0 and x > rows and r < n and (x // rows) * r >= n:
        return f"split_stage1(split={x // rows}, block={r})"
    if x == rows and r < n:
        return f"split_stage2_or_other(r0_numel={r})"
    if r == rows and x < rows:
        return "reduce_over_rows"
    return "other"


def _mismatch(a, b):
    import torch
    if a is None or b is None:
        return None
    if a.shape != b.shape:
        return "shape"
    a = a.detach()
    b = b.detach()
    if a.dtype.is_floating_point:
        ai = a.contiguous().view(torch.int16 if a.element_size() == 2 else torch.int32)
        bi = b.contiguous().view(torch.int16 if b.element_size() == 2 else torch.int32)
        return int((ai != bi).sum().item())
    return int((a != b).sum().item())


def run_case(case):
    import torch
    ops, rows, n, dt, train = case["ops"], case["rows"], case["n"], case["dtype"], case["train"]
    rec = dict(case=case)
    if time.time() > _G["deadline"]:
        rec["skipped"] = "deadline"
        return rec
    dtype = dict(bf16=torch.bfloat16, fp16=torch.float16, fp32=torch.float32)[dt]
    # GPU memory: ~10 row-tensors per op (inputs, grads, outputs, saved, eager reference),
    # in tokens of 10 GB out of MEM_TOKENS; the gate makes taking several tokens atomic
    est = rows * n * len(ops) * 10 * (4 if dt == "fp32" else 3)
    tokens = min(MEM_TOKENS, est // 10 ** 10 + 1) if est > 2 * 10 ** 9 else 0
    sem = _G["big_sem"]
    t0 = time.time()
    if tokens:
        with _G["gate"]:
            for _ in range(tokens):
                sem.acquire()
    try:
        from torch._inductor.utils import run_and_get_code
        _G["bench"].clear()
        _G["tuners"].clear()
        torch._dynamo.reset()
        f = _ops(ops, EPS)
        args, grads = _inputs(ops, rows, n, dtype, train)
        cf = torch.compile(f, dynamic=False)

        def step():
            if train:
                outs = cf(*args)
                torch.autograd.backward(
                    list(outs), [None if g is None else g for g in grads])
                return outs
            with torch.no_grad():
                return cf(*args)

        outs, codes = run_and_get_code(step)
        torch.cuda.synchronize()
        got_grads = [a.grad.clone() if getattr(a, "grad", None) is not None else None
                     for a in args]
        # eager reference, for a mismatch count only
        for a in args:
            if getattr(a, "grad", None) is not None:
                a.grad = None
        if train:
            eo = f(*args)
            torch.autograd.backward(list(eo), [None if g is None else g for g in grads])
        else:
            with torch.no_grad():
                eo = f(*args)
        torch.cuda.synchronize()
        rec["mismatch_vs_eager"] = dict(
            outputs=[_mismatch(a, b) for a, b in zip(outs, eo)],
            grads=[_mismatch(g, a.grad if getattr(a, "grad", None) is not None else None)
                   for g, a in zip(got_grads, args)] if train else None)
        # kernel sources from the wrapper code(s): graph 0 = forward, 1 = backward
        srcs = {}
        for gi, code in enumerate(codes):
            for _var, name, src in _KSRC.findall(code):
                srcs.setdefault(name, (gi, src))
        rec["num_graphs"] = len(codes)
        rec["wrapper_calls"] = [
            re.findall(r"^\s*(\w+)\.run\(|^\s*(buf\w+ = .*\.(?:sum|amax|amin)\(dim=0\).*)$",
                       code, re.M) for code in codes]
        benches = {}
        for b in _G["bench"]:
            benches.setdefault(b.get("kernel"), []).append(b)
        kernels = []
        by_name = {}
        for t in _G["tuners"]:
            name = getattr(t.fn, "__name__", None) or t.inductor_meta.get("kernel_name")
            prev = by_name.get(name)
            if prev is None or len(getattr(t, "launchers", None) or []) == 1:
                by_name[name] = t
        for name, t in by_name.items():
            gi, src = srcs.get(name, (None, ""))
            kind = _kind(name or "")
            xr = _xr(src)
            k = dict(name=name, graph={0: "fwd", 1: "bwd"}.get(gi, gi), kind=kind, **xr,
                     split=_split_hint(kind, xr, rows, n), meta=_meta(t))
            try:
                k["size_hints"] = {str(a): int(b) for a, b in (t.size_hints or {}).items()}
            except Exception:
                pass
            launchers = getattr(t, "launchers", None) or []
            if launchers:
                L = launchers[0]
                k["chosen"] = dict(_cfg(L.config), n_regs=getattr(L, "n_regs", None),
                                   n_spills=getattr(L, "n_spills", None))
                ch = getattr(L, "cache_hash", None)
                if ch:
                    pdir = os.path.join(os.environ["TRITON_CACHE_DIR"], ch)
                    ptx = os.path.join(pdir, f"{name}.ptx")
                    if not os.path.exists(ptx) and os.path.isdir(pdir):
                        cand = [p for p in os.listdir(pdir) if p.endswith(".ptx")]
                        ptx = os.path.join(pdir, cand[0]) if cand else ptx
                    summ, txt = _ptx_summary(ptx)
                    k["ptx_ops"] = summ
                    k["ttgir"] = _ttgir_layouts(ptx[:-4] + ".ttgir")
                    if txt and case.get("ptx_dump") and (rows, n) in PTX_DUMP_CASES:
                        k["_ptx"] = txt
            k["n_launchers"] = len(launchers)
            try:
                k["compiled_configs"] = [_cfg(r.config) for r in (t.compile_results or [])]
            except Exception:
                pass
            if name in benches:
                k["autotune"] = benches[name]
            k["source"] = src[:SRC_LIMIT]
            k["source_len"] = len(src)
            kernels.append(k)
        rec["kernels"] = kernels
        rec["wrapper_call"] = [c[c.find("def call("):][:8000] for c in codes]
    except Exception as e:
        rec["error"] = repr(e)
        rec["traceback"] = traceback.format_exc()[-4000:]
    finally:
        for _ in range(tokens):
            sem.release()
        try:
            args = grads = None  # free the GPU memory now
        except Exception:
            pass
        torch.cuda.empty_cache()
    rec["seconds"] = round(time.time() - t0, 2)
    return rec


# --------------------------------------------------------------------------------------
def build_cases(a):
    ops_all = ["softmax", "log_softmax", "rmsnorm", "ce"]
    ops = [o for o in ops_all if o in a.only.split(",")]
    rows_l = [int(r) for r in a.rows.split(",")]
    ns = [int(x) for x in a.ns.split(",")] if a.ns else NS
    dts = a.dtypes.split(",")
    grid = lambda dt: [dict(ops=ops, rows=rows, n=n, dtype=dt, train=True)
                       for rows in rows_l for n in ns]
    extras = []
    if not a.no_extras:
        # mix-order reduction (RMSNorm backward) needs rows >= 4096 and rows >= 2n
        if "rmsnorm" in ops:
            for n in (1024, 4096):
                extras.append(dict(ops=["rmsnorm"], rows=8192, n=n, dtype="bf16", train=True))
        # inference (no saved activations): CE's log-softmax output not materialised
        for rows, n in ((2048, 4096), (2048, 50257), (2048, 151936), (8, 151936)):
            extras.append(dict(ops=ops, rows=rows, n=n, dtype="bf16", train=False))
    full = []
    if a.full:  # rows 1 and 64 (split reductions), forward+backward, bf16
        full = [dict(ops=ops, rows=rows, n=n, dtype="bf16", train=True)
                for rows in (1, 64) for n in ns]
    # priority order (the deadline cuts the tail): first dtype's grid, extras, other dtypes
    cases = grid(dts[0]) + extras + [c for dt in dts[1:] for c in grid(dt)] + full
    for c in cases:
        c["ptx_dump"] = bool(a.ptx_dump)
    return cases


def env_record():
    import torch
    import torch._inductor.config as ic
    rec = dict(kind="env", torch=torch.__version__, cuda=torch.version.cuda)
    try:
        import triton
        rec["triton"] = triton.__version__
    except Exception as e:
        rec["triton"] = repr(e)
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        rec.update(device=p.name, sm_count=p.multi_processor_count,
                   cc=f"{p.major}.{p.minor}",
                   regs_per_sm=getattr(p, "regs_per_multiprocessor", None),
                   max_threads_per_sm=getattr(p, "max_threads_per_multi_processor", None))
    cfg = {}
    for k in ("online_softmax", "split_reductions", "use_fast_math", "deterministic",
              "emulate_precision_casts", "max_autotune", "max_autotune_pointwise",
              "coordinate_descent_tuning", "unroll_reductions_threshold",
              "triton.multi_kernel", "triton.persistent_reductions",
              "triton.cooperative_reductions", "triton.mix_order_reduction",
              "eager_numerics.division_rounding", "eager_numerics.disable_ftz"):
        obj = ic
        try:
            for part in k.split("."):
                obj = getattr(obj, part)
            cfg[k] = obj if isinstance(obj, (int, float, bool, str, type(None))) else str(obj)
        except Exception as e:
            cfg[k] = repr(e)
    rec["inductor_config"] = cfg
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--deadline", type=float, default=75.0)
    ap.add_argument("--only", default="softmax,log_softmax,rmsnorm,ce")
    ap.add_argument("--rows", default="8,2048")
    ap.add_argument("--ns", default="")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--full", action="store_true", help="also rows 1 and 64 (bf16)")
    ap.add_argument("--no-extras", action="store_true")
    ap.add_argument("--ptx-dump", action="store_true")
    a = ap.parse_args()
    t_start = time.time()
    os.makedirs(a.out, exist_ok=True)
    out_path = os.path.join(a.out, "inductor_probe.jsonl")
    ptx_path = os.path.join(a.out, "inductor_ptx.jsonl")
    workdir = tempfile.mkdtemp(prefix="inductor_probe_")
    cases = build_cases(a)
    deadline = t_start + a.deadline

    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    bench_lock = ctx.Lock()
    big_sem = ctx.Semaphore(MEM_TOKENS)
    gate = ctx.Lock()
    done = 0
    ptx_bytes = 0
    out_bytes = 0
    part = 1
    fo = open(out_path, "w")
    with open(ptx_path, "w") if a.ptx_dump else open(os.devnull, "w") as fp:
        try:
            fo.write(json.dumps(env_record()) + "\n")
        except Exception as e:
            fo.write(json.dumps(dict(kind="env", error=repr(e))) + "\n")
        fo.flush()
        with ctx.Pool(a.jobs, initializer=_init,
                      initargs=(bench_lock, big_sem, gate, deadline, workdir)) as pool:
            for rec in pool.imap_unordered(run_case, cases):
                for k in rec.get("kernels", []):
                    ptx = k.pop("_ptx", None)
                    if ptx and ptx_bytes < 14 * 2 ** 20:
                        line = json.dumps(dict(case=rec["case"], kernel=k["name"],
                                               ptx=ptx[:60000])) + "\n"
                        ptx_bytes += len(line)
                        fp.write(line)
                        fp.flush()
                line = json.dumps(rec, default=str) + "\n"
                if out_bytes + len(line) > 14 * 2 ** 20:  # files come back only under 16 MiB
                    fo.close()
                    part += 1
                    fo = open(os.path.join(a.out, f"inductor_probe_{part}.jsonl"), "w")
                    out_bytes = 0
                fo.write(line)
                fo.flush()
                out_bytes += len(line)
                done += 1
                c = rec["case"]
                status = ("skipped" if rec.get("skipped") else
                          "ERROR " + rec["error"][:80] if rec.get("error") else
                          f"{len(rec.get('kernels', []))} kernels")
                print(f"[{time.time() - t_start:6.1f}s] {done}/{len(cases)} "
                      f"{','.join(c['ops'])} rows={c['rows']} n={c['n']} {c['dtype']} "
                      f"{'train' if c['train'] else 'infer'}: {status} "
                      f"({rec.get('seconds')}s)", flush=True)
    fo.close()
    print(f"wrote {out_path} (+{part - 1} continuation files) in "
          f"{time.time() - t_start:.1f}s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
