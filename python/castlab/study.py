"""A/B precision studies: the same chains under several policies and math variants,
each compared with the fp64 golden reference.

>>> import castlab as cl
>>> df = cl.study.run(chains=["swiglu"], dtypes=["bfloat16"], shapes={"swiglu": (256, 512)})
>>> df[["policy", "math", "correctly_rounded", "rel_rmse"]]          # doctest: +SKIP

With ``grad=True`` each chain's backward (its vector-Jacobian product for a random
cotangent) is studied too: one row per gradient, compared with the fp64 policy's
gradient, marked by the columns ``pass`` ("forward"/"backward") and ``output``.

With ``attribute=True`` each configuration's differences are attributed to named factors
(``castlab.numerics.attribute``): the second policy against the first, and each extra
preset against the first preset; ``attribution_table(df)`` is the table of factor sets,
``df.attrs["attribution_verdicts"]`` the one-line verdicts.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import cuda, numerics
from ._creation import rand, randn, tensor
from ._device import as_device
from ._dtype import as_dtype, float64
from ._jit import JitFunction, _arg_names, jit
from .ops import cat, chunk, gelu, reshape, silu, stack
from .policy import Policy, as_math, as_policy

__all__ = ["Chain", "CHAINS", "run", "DEFAULT", "QUICK", "row_columns", "check_shape",
           "check_scale", "MAX_NUMEL", "ATTRIBUTION_COLUMNS", "attribution_table"]

# The largest input a study generates (elements). Inputs are made in fp64 and the
# study keeps several results of the same size, so this is already tens of GB.
MAX_NUMEL = 1 << 31


# ---------------------------------------------------------------- built-in chains

def _swiglu(x):
    a, b = chunk(x, 2, dim=-1)
    return silu(a) * b


def _geglu(x):
    a, b = chunk(x, 2, dim=-1)
    return gelu(a) * b


def _rope(x, cos, sin):
    # Hugging Face rotate_half layout: cat(-x2, x1) with cos/sin broadcast over batch/heads.
    x1, x2 = chunk(x, 2, dim=-1)
    return x * cos + cat([-x2, x1], dim=-1) * sin


def _rope_interleaved(x, cos, sin):
    # GPT-J / Meta layout: pairs (x[2i], x[2i+1]) rotate together.
    shp = x.shape
    xp = reshape(x, *shp[:-1], shp[-1] // 2, 2)
    x0, x1 = xp[..., 0], xp[..., 1]
    out = stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)
    return reshape(out, *shp)


def _rope_tables(seq: int, dim: int, base: float = 10000.0):
    """cos/sin as Hugging Face builds them: fp32 inverse frequencies, fp32 angles."""
    import numpy as np

    inv = (1.0 / (base ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))).astype(np.float32)
    t = np.arange(seq, dtype=np.float32)
    freqs = np.outer(t, inv).astype(np.float32)
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


def _gen(kind: str, shape, seed: int, scale: float, dt, device):
    if kind == "normal":
        t = randn(*shape, seed=seed, dtype=float64, device="cpu")
    elif kind == "uniform":
        t = rand(*shape, seed=seed, dtype=float64, device="cpu")
    else:
        raise ValueError(f"unknown input generator {kind!r}; valid: normal, uniform")
    if scale != 1.0:
        t = t * float(scale)
    return t.astype(dt).to(device)


def _swiglu_inputs(shape, dt, seed, kind, scale, device):
    return (_gen(kind, shape, seed, scale, dt, device),)


def _rope_inputs(shape, dt, seed, kind, scale, device, interleaved=False):
    import numpy as np

    b, h, s, d = shape
    x = _gen(kind, shape, seed, scale, dt, device)
    cos, sin = _rope_tables(s, d)
    if not interleaved:
        cos = np.concatenate([cos, cos], axis=-1)
        sin = np.concatenate([sin, sin], axis=-1)
    return (x, tensor(cos).astype(dt).to(device), tensor(sin).astype(dt).to(device))


def _halves(grads: tuple) -> dict:
    """SwiGLU/GeGLU: the gradient of x = [a, b] as the gradients of its halves a and b."""
    (dx,) = grads
    h = dx.shape[-1] // 2
    return {"da": dx[..., :h], "db": dx[..., h:]}


@dataclasses.dataclass
class Chain:
    """A named chain of ops and how to make its inputs.

    For ``study.run(grad=True)``: `grad_argnums` are the inputs differentiated (None: the
    floating-point inputs with the most elements; smaller ones are taken to be broadcast,
    e.g. RoPE's cos/sin, whose gradients are sums castlab cannot form yet), and
    `grad_parts` turns the tuple of gradients into named results (None: ``d<argument>``).
    """

    name: str
    fn: Callable
    make_inputs: Callable      # (shape, dtype, seed, kind, scale, device) -> tuple of tensors
    default_shape: tuple
    quick_shape: tuple
    description: str = ""
    grad_argnums: tuple | None = None
    grad_parts: Callable | None = None   # (tuple of gradients) -> {name: tensor}


CHAINS: dict[str, Chain] = {
    # gradients: SwiGLU/GeGLU of x, reported as its halves da and db; RoPE of x only
    # (cos/sin are broadcast over batch and heads: their gradients are reductions)
    "swiglu": Chain("swiglu", _swiglu, _swiglu_inputs, (2048, 2048), (256, 512),
                    "a, b = chunk(x, 2, -1); silu(a) * b", (0,), _halves),
    "geglu": Chain("geglu", _geglu, _swiglu_inputs, (2048, 2048), (256, 512),
                   "a, b = chunk(x, 2, -1); gelu(a) * b", (0,), _halves),
    "rope": Chain("rope", _rope, _rope_inputs, (1, 8, 1024, 128), (1, 2, 128, 64),
                  "x*cos + cat(-x2, x1)*sin (HF rotate_half), cos/sin [S, D] broadcast", (0,)),
    "rope_interleaved": Chain(
        "rope_interleaved", _rope_interleaved,
        lambda *a: _rope_inputs(*a, interleaved=True), (1, 8, 1024, 128), (1, 2, 128, 64),
        "GPT-J/Meta pairs: (x0*cos - x1*sin, x0*sin + x1*cos) interleaved", (0,)),
}

# The default study: every dtype, eager vs fused vs fp64, and SwiGLU's formula presets.
DEFAULT = {
    "chains": ["swiglu", "rope"],
    "dtypes": ["bfloat16", "float16", "float32"],
    "policies": ["eager", "fused"],
    "presets": ["torch_eager"],
    "extra_presets": {"swiglu": ["inductor", "nvfuser", "transformer_engine"]},
    "rounding": ["nearest"],
    "seeds": [0],
    "input": "normal",
    "scale": 1.0,
}
QUICK = dict(DEFAULT, dtypes=["bfloat16", "float16"])


def _shape_form(ch: Chain) -> str:
    return f"{ch.name}=" + "x".join(str(d) for d in ch.default_shape)


def check_shape(chain: str, shape: Any) -> tuple:
    """Validate a study shape for a built-in chain; return it as a tuple of ints.

    Raises ValueError (TypeError for a non-sequence) naming the chain, the expected
    form (e.g. ``swiglu=1024x2048``) and what is wrong.
    """
    if chain not in CHAINS:
        raise ValueError(f"unknown chain {chain!r} in shapes; valid: " + ", ".join(CHAINS))
    ch = CHAINS[chain]
    form = _shape_form(ch)
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        raise TypeError(f"shape for {chain} must be a sequence of {len(ch.default_shape)} "
                        f"positive integers (e.g. {form}), got {shape!r}")
    dims = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int):
            try:
                import numpy as np
                ok = isinstance(d, np.integer)
            except ImportError:  # pragma: no cover
                ok = False
            if not ok:
                raise TypeError(f"shape for {chain}: dimensions must be integers, got {d!r} "
                                f"(expected e.g. {form})")
        dims.append(int(d))
    if len(dims) != len(ch.default_shape):
        raise ValueError(f"shape for {chain} must have {len(ch.default_shape)} dimensions "
                         f"(e.g. {form}), got {len(dims)}: {tuple(dims)}")
    if any(d <= 0 for d in dims):
        raise ValueError(f"shape for {chain}: every dimension must be positive "
                         f"(e.g. {form}), got {tuple(dims)}")
    if dims[-1] % 2:
        raise ValueError(f"shape for {chain}: the last dimension must be even (the chain splits "
                         f"it in halves; e.g. {form}), got {dims[-1]}")
    n = 1
    for d in dims:
        n *= d
    if n > MAX_NUMEL:
        raise ValueError(f"shape for {chain}: {tuple(dims)} has {n} elements, too large for a "
                         f"study (the limit is {MAX_NUMEL})")
    return tuple(dims)


def check_scale(scale: Any) -> float:
    """The input scale: a positive finite number (ValueError/TypeError otherwise)."""
    import math

    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        try:
            import numpy as np
            ok = isinstance(scale, (np.integer, np.floating))
        except ImportError:  # pragma: no cover
            ok = False
        if not ok:
            raise TypeError(f"scale must be a positive finite number, got {scale!r}")
    v = float(scale)
    if not math.isfinite(v) or v <= 0.0:
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    return v


def row_columns(grad: bool = False) -> list[str]:
    """The columns of a study's rows; with `grad`, also ``pass`` ("forward" or
    "backward") and ``output`` ("y" for the chain's result, "da", "dx", ... for a
    gradient)."""
    cols = ["chain", "dtype", "shape", "input", "scale", "seed", "math", "policy", "rounding",
            "device", "numel", "correctly_rounded", "max_ulp", "mean_ulp", "rel_rmse", "rmse",
            "max_abs_err", "max_rel_err", "mismatch_vs_eager", "same_vs_eager"]
    return cols[:1] + ["pass", "output"] + cols[1:] if grad else cols


# Cotangents are drawn like the inputs (same generator, scale 1) from this seed ^ the
# input seed, so they differ from every input stream.
COTANGENT_SEED_MIX = 0x9E3779B97F4A7C15


def _device_default() -> str:
    try:
        return "cuda" if cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001  (no CUDA support compiled or loadable)
        return "cpu"


def _policy_with_rounding(p: str | Policy, rounding: str, seed: int) -> Policy:
    pol = as_policy(p)
    if rounding == "nearest":
        return pol
    return dataclasses.replace(pol, name=pol.name, rounding=rounding, seed=seed)


def run(chains: Sequence[str | Callable] = ("swiglu", "rope"),
        dtypes: Sequence[Any] = ("bfloat16", "float16", "float32"),
        shapes: dict | Sequence | None = None,
        policies: Sequence[Any] = ("eager", "fused"),
        presets: Sequence[Any] = ("torch_eager",),
        rounding: Sequence[str] = ("nearest",),
        seeds: Sequence[int] = (0,),
        device: str | None = None,
        ref: Any = "fp64",
        inputs: str | dict = "normal",
        scale: float = 1.0,
        extra_presets: dict | None = None,
        quick: bool = False,
        progress: bool | Callable = False,
        on_row: Callable | None = None,
        grad: bool = False,
        attribute: bool = False):
    """Run a study and return a pandas DataFrame, one row per configuration and policy.

    Each row compares one result with the fp64 reference (correctly-rounded fraction,
    max/mean ulp error, relative RMSE, ...) and with the eager result of the same
    configuration (mismatch fraction, PyTorch's ``same()`` verdict).

    Args:
        chains: built-in chain names (``castlab.study.CHAINS``) or functions of tensors.
        dtypes: storage dtypes of the inputs.
        shapes: a shape per chain name (dict), or one shape for all chains.
        policies: policy names or ``castlab.Policy`` objects.
        presets: math presets (or ``castlab.Math``) to run every policy under.
        rounding: downcast rounding modes ("nearest", "toward_zero", "stochastic").
        seeds: input seeds (and stochastic-rounding seeds).
        device: "cpu" or "cuda" (default: the GPU when there is one).
        inputs: "normal", "uniform", or a dict {chain name: tuple of tensors} to study
            real activations (e.g. passed in from PyTorch).
        scale: multiplies generated inputs.
        extra_presets: {chain: [presets]} run under "fused" only, side by side.
        quick: small shapes.
        progress: show a progress bar (True) or call progress(i, n, label).
        on_row: called with each finished row (a dict), e.g. to stream to a CSV.
        grad: also study the chains' gradients. Each chain's backward
            (``backward_fn``, with respect to ``Chain.grad_argnums``: SwiGLU/GeGLU's x,
            reported as its halves ``da`` and ``db``; RoPE's x, not cos/sin) runs for a
            random cotangent (drawn like the inputs, seed ``seed ^ COTANGENT_SEED_MIX``)
            under every preset, policy and rounding mode (not `extra_presets`), and each
            gradient is compared with the fp64 policy's gradient as the forward results
            are with the fp64 forward. Rows gain the columns ``pass`` ("forward" or
            "backward") and ``output`` ("y", or the gradient's name).
        attribute: also attribute the forward results' differing bits to named factors
            (``castlab.numerics.attribute``) for each chain, dtype and seed: the second
            policy against the first (under the first preset and rounding mode), and each
            of the chain's `extra_presets` against the first preset (under "fused"). The
            returned DataFrame's rows are the same; its ``attrs["attribution"]`` holds one
            dict per factor set of each pair, with the keys ``ATTRIBUTION_COLUMNS``
            (chain, dtype, seed, A, B, factors, elements, toward, away, tie, equal, nan,
            suspicious; ``attribution_table(df)`` makes it a DataFrame), and
            ``attrs["attribution_verdicts"]`` one dict per pair (chain, dtype, seed, A, B,
            differ, unexplained, verdict). Plain lists, so that the attrs survive
            ``pd.concat`` of several studies and serialize to JSON.

    >>> df = run(chains=["swiglu"], dtypes=["bfloat16"], quick=True)   # doctest: +SKIP
    """
    import pandas as pd

    scale = check_scale(scale)
    if isinstance(shapes, dict):
        shapes = {k: check_shape(k, v) for k, v in shapes.items()}
    elif shapes is not None:
        for c in chains:
            if isinstance(c, str):
                check_shape(c, shapes)
    if seeds is None or isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence):
        raise TypeError(f"seeds must be a sequence of integers, got {seeds!r}")
    for sd in seeds:
        if isinstance(sd, bool) or not isinstance(sd, int):
            raise TypeError(f"seeds must be integers, got {sd!r}")
        if not 0 <= sd < 2**64:
            raise ValueError(f"seed {sd} is out of range: seeds are integers in [0, 2**64)")
    if device is not None:
        if not isinstance(device, str):
            raise TypeError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
        as_device(device)  # ValueError naming the device for 'tpu', 'cudax', ...
    device = device or _device_default()
    extra_presets = extra_presets or {}
    chain_objs = []
    for c in chains:
        if callable(c):
            chain_objs.append(Chain(getattr(c, "__name__", "fn"), c, None, (), ()))
            continue
        if c not in CHAINS:
            raise ValueError(f"unknown chain {c!r}; valid: " + ", ".join(CHAINS))
        chain_objs.append(CHAINS[c])
    dts = [as_dtype(d) for d in dtypes]
    for d in dts:
        if not d.is_floating_point:
            raise ValueError(f"dtype {d} is not a floating-point dtype")
    pols = [as_policy(p) for p in policies]
    maths = [as_math(m) for m in presets]
    for r in rounding:
        Policy(rounding=r)  # validates
    ref_policy = as_policy(ref)

    jobs = []
    for ch in chain_objs:
        for dt in dts:
            for seed in seeds:
                jobs.append((ch, dt, seed))
    rows: list = []
    att_rows: list = []
    verdicts: list = []
    total = len(jobs)
    for ji, (ch, dt, seed) in enumerate(jobs):
        label = f"{ch.name} {dt.name} seed={seed}"
        if progress is True:
            _bar(ji, total, label)
        elif callable(progress):
            progress(ji, total, label)
        if isinstance(inputs, dict):
            if ch.name not in inputs:
                raise ValueError(f"inputs has no tensors for chain {ch.name!r}")
            args = tuple(inputs[ch.name])
            args = tuple(a.astype(dt).to(device) for a in args)
            shape = tuple(args[0].shape)
            kind = "tensor"
        else:
            if ch.make_inputs is None:
                raise ValueError(f"chain {ch.name!r} is a function: pass inputs={{...}}")
            if isinstance(shapes, dict):
                shape = tuple(shapes.get(ch.name, ch.quick_shape if quick else ch.default_shape))
            elif shapes is not None:
                shape = tuple(shapes)
            else:
                shape = ch.quick_shape if quick else ch.default_shape
            args = ch.make_inputs(shape, dt, seed, inputs, scale, device)
            kind = inputs
        fn = ch.fn if isinstance(ch.fn, JitFunction) else jit(ch.fn)
        reference = fn.run(*args, policy=ref_policy)
        runs = []  # (math, policy, rounding, result)
        for m in maths:
            for p in pols:
                for r in rounding:
                    pol = _policy_with_rounding(p, r, seed)
                    runs.append((m, pol, r, fn.run(*args, policy=pol, math=m)))
        extras = []
        for mname in extra_presets.get(ch.name, []):
            m = as_math(mname)
            if any(x[0] == m for x in runs):
                continue
            extras.append(m)
            runs.append((m, Policy.fused(), "nearest", fn.run(*args, policy="fused", math=m)))
        common = {"chain": ch.name, "dtype": dt.name, "shape": "x".join(str(s) for s in shape),
                  "input": kind, "scale": scale, "seed": seed}
        if grad:
            common.update({"pass": "forward", "output": "y"})
        new_rows = _compare_rows(runs, reference, common, device)
        if grad:
            new_rows += _grad_rows(ch, fn, args, reference, dt, seed, kind, device, maths,
                                   pols, rounding, ref_policy, common)
        for row in new_rows:
            rows.append(row)
            if on_row is not None:
                on_row(row)
        if attribute:
            for a, b in _attribution_pairs(pols, maths, rounding[0], seed, extras):
                r, v = _attribution(fn, args, a, b, common)
                att_rows += r
                verdicts.append(v)
    if progress is True:
        _bar(total, total, "done")
        sys.stderr.write("\n")
    df = pd.DataFrame(rows, columns=row_columns(grad))
    if attribute:
        df.attrs["attribution"] = att_rows
        df.attrs["attribution_verdicts"] = verdicts
    return df


#: The columns of ``run(attribute=True).attrs["attribution"]``: one row per factor set of
#: one attributed pair (A, B) of one chain, dtype and seed; the verdict columns count the
#: differing elements where B is nearer the fp64 value than A ("toward"), farther
#: ("away"), A and B straddle a midpoint ("tie"), equally far ("equal"), or a NaN.
ATTRIBUTION_COLUMNS = ["chain", "dtype", "seed", "A", "B", "factors", "elements", "toward",
                       "away", "tie", "equal", "nan", "suspicious"]

def attribution_table(df):
    """The attribution of a ``run(..., attribute=True)`` study as a DataFrame: one row per
    factor set of each attributed pair, columns ``ATTRIBUTION_COLUMNS``."""
    import pandas as pd

    if "attribution" not in df.attrs:
        raise ValueError("this study has no attribution: run it with attribute=True")
    return pd.DataFrame(df.attrs["attribution"], columns=ATTRIBUTION_COLUMNS)


# Attribution.summary()'s columns under their names in the study's table
_SUMMARY_COLUMNS = {"toward fp64": "toward", "away from fp64": "away", "tie at midpoint": "tie",
                    "equally far": "equal", "NaN": "nan"}


def _attribution_pairs(pols: list, maths: list, rounding: str, seed: int,
                       extra: list) -> list:
    """The (A, B) configurations a study attributes: the second policy against the first
    (first preset and rounding mode), then each extra preset against the first preset
    (fused, nearest, as the study runs them)."""
    pairs = []
    if len(pols) >= 2:
        pa, pb = (_policy_with_rounding(p, rounding, seed) for p in pols[:2])
        pairs.append(((pa, maths[0]), (pb, maths[0])))
    for m in extra:
        pairs.append(((Policy.fused(), maths[0]), (Policy.fused(), m)))
    return pairs


def _attribution(fn: JitFunction, args: tuple, a: tuple, b: tuple, common: dict) -> tuple:
    """The summary rows and the verdict of one attributed pair."""
    key = {"chain": common["chain"], "dtype": common["dtype"], "seed": common["seed"],
           "A": f"{a[0].describe()}/{a[1].name}", "B": f"{b[0].describe()}/{b[1].name}"}
    try:
        att = numerics.attribute(fn, args, a=a, b=b)
    except ValueError as e:  # nothing to attribute (no factor differs, or the dtypes do)
        return [], dict(key, differ=0, unexplained=0, verdict=f"not attributed: {e}")
    table = att.summary().rename(columns=_SUMMARY_COLUMNS)
    rows = [dict(key, **{c: r[c] for c in ATTRIBUTION_COLUMNS[5:]})
            for r in table.to_dict("records")]
    return rows, dict(key, differ=len(att.indices), unexplained=att.unexplained,
                      verdict=att.verdict)


def _compare_rows(runs: list, reference, common: dict, device: str) -> list:
    """One row per run (math, policy, rounding, result), compared with `reference`
    and with the first eager run."""
    base = next((x for x in runs if x[1].name == "eager"), runs[0])
    ordered = [base] + [x for x in runs if x is not base]
    names = [f"{x[0].name}/{x[1].describe()}" for x in ordered]
    cmp = numerics.compare(*[x[3] for x in ordered], ref=reference, names=names)
    metrics = cmp.to_dict()
    rows = []
    for i, (m, pol, r, res) in enumerate(ordered):
        row = dict(common, math=m.name, policy=pol.name, rounding=r, device=device)
        row.update(_metrics_of(metrics, names[i], res.numel()))
        rows.append(row)
    return rows


def _grad_argnums(ch: Chain, args: tuple) -> tuple:
    if ch.grad_argnums is not None:
        return tuple(ch.grad_argnums)
    fl = [i for i, a in enumerate(args) if a.dtype.is_floating_point]
    most = max((args[i].numel() for i in fl), default=0)
    return tuple(i for i in fl if args[i].numel() == most)


def _grad_parts(ch: Chain, fn: JitFunction, argnums: tuple, grads: Any) -> dict:
    grads = tuple(grads) if isinstance(grads, (tuple, list)) else (grads,)
    if ch.grad_parts is not None:
        return ch.grad_parts(grads)
    names = _arg_names(fn.fn, max(argnums) + 1)
    return {f"d{names[i]}": g for i, g in zip(argnums, grads)}


def _grad_rows(ch: Chain, fn: JitFunction, args: tuple, out, dt, seed: int, kind: str,
               device: str, maths: list, pols: list, rounding: Sequence[str], ref_policy,
               common: dict) -> list:
    """The backward rows of one configuration: every gradient of the chain under each
    math x policy x rounding, compared with the fp64 policy's gradient."""
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    cseed = seed ^ COTANGENT_SEED_MIX
    gen = kind if kind in ("normal", "uniform") else "normal"
    cots = tuple(_gen(gen, tuple(o.shape), (cseed + k) % 2**64, 1.0, dt, device)
                 for k, o in enumerate(outs))
    argnums = _grad_argnums(ch, args)
    bwd = fn.backward_fn(nargs=len(args), argnums=argnums)
    ref = _grad_parts(ch, fn, argnums, bwd.run(*args, *cots, policy=ref_policy))
    runs = []
    for m in maths:
        for p in pols:
            for r in rounding:
                pol = _policy_with_rounding(p, r, seed)
                runs.append((m, pol, r, _grad_parts(ch, fn, argnums,
                                                    bwd.run(*args, *cots, policy=pol, math=m))))
    rows = []
    for name, gref in ref.items():
        c = dict(common, output=name)
        c["pass"] = "backward"
        rows += _compare_rows([(m, pol, r, parts[name]) for m, pol, r, parts in runs], gref,
                              c, device)
    return rows


def _metrics_of(d: dict, name: str, numel: int) -> dict:
    """Pick one result's study metrics out of ``Comparison.to_dict()``."""
    r = d[name]
    same = r.get("same")
    return {
        "numel": numel,
        "correctly_rounded": r["correctly_rounded"],
        "max_ulp": r["max_ulp_error"],
        "mean_ulp": r["mean_ulp_error"],
        "rel_rmse": r["rel_rmse"],
        "rmse": r["rmse"],
        "max_abs_err": r["max_abs_error"],
        "max_rel_err": r["max_rel_error"],
        "mismatch_vs_eager": r["mismatch_fraction"],
        "same_vs_eager": True if same is None else bool(same),  # the baseline passes itself
    }


def _bar(i: int, n: int, label: str) -> None:
    width = 28
    fill = int(width * i / max(n, 1))
    sys.stderr.write(f"\r[{'#' * fill}{' ' * (width - fill)}] {i}/{n} {label:<40.40}")
    sys.stderr.flush()


def __dir__() -> list:
    """The public API only (not the helpers this module imports)."""
    return sorted(__all__)
