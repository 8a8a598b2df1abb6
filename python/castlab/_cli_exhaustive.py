"""``castlab exhaustive`` (every input of a chain, :func:`castlab.numerics.exhaustive`) and
``castlab bounds`` (proven error bounds of the kernel-library presets and unary ops)."""

from __future__ import annotations

import argparse
import csv
import inspect
import json
import math
import os
import sys
from typing import Any

from . import cuda, numerics, ops, presets, testing
from ._cli_config import _resolve_chain
from ._cli_files import _check_out, _refuse_old_results
from ._cli_parser import _UNARY, CLIError, _Run
from ._device import as_device
from ._progress import bar as _bar
from .policy import as_math
from .presets import libraries


def _swiglu2(a, b):
    return ops.silu(a) * b


def _geglu2(a, b):
    return ops.gelu(a) * b


#: Chains of separate inputs for ``castlab exhaustive`` (besides every unary op by name).
EXHAUSTIVE_CHAINS = {"swiglu": _swiglu2, "geglu": _geglu2}


#: The files ``castlab exhaustive`` writes into --out (the first two are its results).
EXHAUSTIVE_FILES = ("exhaustive.json", "exhaustive.csv", "run.json")


def _exhaustive_fn(spec: str) -> Any:
    if spec in EXHAUSTIVE_CHAINS:
        return EXHAUSTIVE_CHAINS[spec]
    if spec in _UNARY:
        return getattr(ops, spec)
    if ":" in spec:
        return _resolve_chain(spec, "").fn
    raise CLIError(f"unknown chain {spec!r}; valid: " + ", ".join(list(EXHAUSTIVE_CHAINS) + _UNARY)
                   + ", or pkg.module:function")


def _cuda_ok() -> bool:
    try:
        return bool(cuda.is_available())
    except Exception:  # noqa: BLE001  (no CUDA support compiled or loadable)
        return False


def _fn_arity(fn: Any) -> int:
    try:
        ps = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    return sum(1 for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               and p.default is p.empty) or 1


def _one(args: argparse.Namespace, dest: str, flag: str, default: Any, what: str) -> Any:
    """The one value of a list option that takes one value in this command."""
    v = getattr(args, dest)
    if v is None:
        return default
    v = list(dict.fromkeys(v))
    if len(v) != 1:
        raise CLIError(f"{flag}: castlab exhaustive runs one {what} at a time, got "
                       + ", ".join(map(str, v)) + f" (run it once per {what})")
    return v[0]


def _secs(x: float) -> str:
    return f"{x:.1f}" if x < 10 else f"{x:.0f}"


def _exhaustive_progress(stream: Any = None):
    """progress(done, n, seconds) for numerics.exhaustive: the estimate once measured,
    then a bar with the running rate and the time left (on stderr)."""
    said, last = [False], [0]

    def show(done: int, n: int, seconds: float) -> None:
        rate = done / seconds if seconds > 0 else 0.0
        if not said[0]:
            said[0] = True
            if 0 < done < n and rate > 0:
                print(f"castlab exhaustive: {n} inputs, about {_secs(n / rate)} s at "
                      f"{rate:.3g} inputs/s (measured on the first {done})",
                      file=stream or sys.stderr, flush=True)
            elif done == 0:
                print(f"castlab exhaustive: {n} inputs in one GPU kernel",
                      file=stream or sys.stderr, flush=True)
        if done >= n:
            label = f"{rate:.3g} inputs/s, {_secs(seconds)} s" if rate else "done"
        else:
            label = (f"{rate:.3g} inputs/s, about {_secs((n - done) / rate)} s left" if rate
                     else "starting")
        _bar(done, n, label, stream=stream, prev=last[0])
        last[0] = done
    return show


def _device_arg(requested: str | None):
    """--device as a Device: the GPU when there is one and none was named; a GPU that
    cannot be used is a CLIError naming why."""
    device = requested or ("cuda" if _cuda_ok() else "cpu")
    try:
        dev = as_device(device)
    except (TypeError, ValueError) as e:
        raise CLIError(f"--device {device!r}: {e}") from None
    if dev.is_cuda and not _cuda_ok():
        raise CLIError(f"--device {device}: no usable GPU ({cuda.unavailable_reason()})")
    return dev


def cmd_exhaustive(args: argparse.Namespace) -> int:
    fn = _exhaustive_fn(args.chain)
    maths = list(dict.fromkeys(args.math or ["torch_eager"]))
    pols = list(dict.fromkeys(args.policy or ["eager", "fused"]))
    dtype = _one(args, "dtype", "--dtype", "bfloat16", "dtype")
    seed = _one(args, "seed", "--seed", 0, "seed")
    if args.sample is not None and args.sample <= 0:
        raise CLIError(f"--sample must be positive, got {args.sample}")
    try:
        as_math(args.ref_math)
    except (TypeError, ValueError) as e:
        raise CLIError(f"--ref-math {args.ref_math!r}: {e}") from None
    dev = _device_arg(args.device)
    if args.stop is not None and args.stop <= args.start:
        raise CLIError(f"--start/--stop: the index range [{args.start}, {args.stop}) is empty "
                       "(--stop must be greater than --start)")
    E = numerics.Enumeration
    first = E.finite(dtype) if args.values == "finite" else E.all(dtype)
    n_in = _fn_arity(fn)
    if args.sample and n_in == 1:
        raise CLIError(f"--sample samples the second and later inputs; {args.chain} has one "
                       "input (restrict it with --start/--stop instead)")
    rest = [E.sample(dtype, args.sample, seed=seed + k, finite=args.values == "finite")
            if args.sample else first for k in range(n_in - 1)]
    total = math.prod(len(x) for x in [first, *rest])
    if args.start >= total or (args.stop is not None and args.stop > total):
        raise CLIError(f"--start/--stop: the index range [{args.start}, "
                       f"{total if args.stop is None else args.stop}) lies outside the {total} "
                       f"inputs of {args.chain} (indices 0 to {total - 1})")
    # the folder before the run, not after
    _refuse_old_results(args.out, EXHAUSTIVE_FILES[:2], args.overwrite)
    _check_out(args.out, EXHAUSTIVE_FILES)
    config = {"chain": args.chain, "dtype": dtype, "math": maths, "policy": pols,
              "values": args.values, "sample": args.sample, "seed": seed, "start": args.start,
              "stop": args.stop, "first_k": args.first_k, "ref_math": args.ref_math,
              "allow_long": args.allow_long, "max_seconds": args.max_seconds,
              "device": str(dev), "out": args.out, "overwrite": args.overwrite,
              "progress": not args.no_progress}
    run = _Run("exhaustive", str(dev), args.device, config, [seed], args.out)
    with run:
        try:
            res = numerics.exhaustive(
                fn, [first, *rest], [(p, m) for p in pols for m in maths],
                ref_math=args.ref_math, first_k=args.first_k, start=args.start, stop=args.stop,
                allow_long=args.allow_long, max_seconds=args.max_seconds, device=str(dev),
                progress=None if args.no_progress else _exhaustive_progress())
        except numerics.ExhaustiveTooLong as e:  # the message names the CLI's flags
            raise CLIError(
                f"exhaustive: {e.n} inputs would take about {e.estimate:.0f} s on this CPU "
                f"({e.rate:.3g} inputs/s measured on the first {e.measured}), more than "
                f"--max-seconds {e.max_seconds:g}; pass --allow-long (or a larger "
                "--max-seconds), a smaller range (--start/--stop)"
                + (", a sampled second input (--sample N)" if n_in > 1 else "")
                + " or --device cuda on a GPU") from None
        print(res)
        res.to_json(os.path.join(args.out, "exhaustive.json"))
        res.to_csv(os.path.join(args.out, "exhaustive.csv"))
        run.extra["inputs"] = res.n
    print(f"wrote {os.path.join(args.out, 'exhaustive.json')}, exhaustive.csv and run.json")
    return 0


#: The files ``castlab bounds`` writes into --out (the first two are its results).
BOUNDS_FILES = ("bounds.json", "bounds.csv", "run.json")


def _bounds_subjects(chains: list, libs: list) -> list:
    """(chain, subject) pairs: each library's preset of each preset op; a one-argument op
    as itself."""
    out = []
    for ch in chains:
        if ch in presets.ROW_OPS:
            raise CLIError(f"{ch}: castlab bounds enumerates the inputs of elementwise ops, "
                           "one element at a time; RMSNorm reduces whole rows, so it has no "
                           "such input space (compare its presets with castlab study "
                           "--libraries all --chains rms_norm)")
        if ch in presets.OPS:
            have = [lib for lib in libs if ch in presets.library(lib).presets]
            if not have:
                raise CLIError(f"{ch}: none of the libraries {', '.join(libs)} has a preset "
                               f"of it (castlab.presets.coverage: "
                               f"{', '.join(presets.coverage()[ch])})")
            out += [(ch, presets.library(lib)[ch]) for lib in have]
        elif ch in testing.unary_ops():
            out.append((ch, ch))
        else:
            raise CLIError(f"unknown chain {ch!r}; valid: " + ", ".join(
                [o for o in presets.OPS if o not in presets.ROW_OPS] + testing.unary_ops()))
    return out


def cmd_bounds(args: argparse.Namespace) -> int:
    chains = list(dict.fromkeys(args.chains or ["swiglu", "rope"]))
    dtypes = list(dict.fromkeys(args.dtype or ["bfloat16"]))
    libs = list(dict.fromkeys(args.libraries or ["all"]))
    libs = libraries() if "all" in libs else libs
    against = list(dict.fromkeys(args.against or list(testing.DEFAULT_AGAINST)))
    dev = _device_arg(args.device)
    subjects = _bounds_subjects(chains, libs)
    _refuse_old_results(args.out, BOUNDS_FILES[:2], args.overwrite)
    _check_out(args.out, BOUNDS_FILES)
    config = {"chains": chains, "dtype": dtypes, "libraries": libs, "against": against,
              "values": args.values, "sample": args.sample, "seed": args.seed,
              "device": str(dev), "cache": not args.no_cache, "out": args.out,
              "overwrite": args.overwrite}
    results = []
    run = _Run("bounds", str(dev), args.device, config, [args.seed], args.out)
    with run:
        for d in dtypes:
            for ch, subj in subjects:
                refs = [a for a in against
                        if not (isinstance(subj, presets.OpPreset) and a in libraries()
                                and ch not in presets.library(a).presets)]
                try:
                    r = testing.bounds(subj, d, refs, device=str(dev), values=args.values,
                                       sample=args.sample, seed=args.seed,
                                       cache=not args.no_cache)
                except (TypeError, ValueError) as e:
                    raise CLIError(f"bounds {ch} {d}: {e}") from None
                results.append(r)
                print(r, flush=True)
        rows = [dict(zip(testing.Bounds.headers(), row)) for r in results
                for row in r.table_rows()]
        with open(os.path.join(args.out, "bounds.json"), "w") as f:
            json.dump([r.to_dict() for r in results], f, indent=1)
        with open(os.path.join(args.out, "bounds.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=testing.Bounds.headers())
            w.writeheader()
            w.writerows(rows)
        run.extra["bounds"] = len(results)
    print(f"wrote {os.path.join(args.out, 'bounds.json')}, bounds.csv and run.json")
    return 0
