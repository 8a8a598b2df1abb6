"""One cell of a study run (here or on a Dask worker): its results under every policy,
preset and rounding mode, compared with the fp64 reference into rows, with the gradients'
rows and the attribution of the differences."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from . import numerics
from ._jit import JitFunction, _arg_names, jit
from ._study_cells import COTANGENT_SEED_MIX, _jsonable, _make_args, _policy_with_rounding
from ._study_chains import Chain, _gen
from .policy import Policy
from .sweep import worker_device

_JITS: dict = {}  # a chain's function -> its castlab.jit (traces and plans kept per process)


def _jit_of(fn: Callable) -> JitFunction:
    if isinstance(fn, JitFunction):
        return fn
    j = _JITS.get(fn)
    if j is None:
        j = _JITS[fn] = jit(fn)
        while len(_JITS) > 64:  # the functions of recent studies, not every one ever run
            _JITS.pop(next(iter(_JITS)))
    return j


def _cell_common(ch: Chain, dt, made: tuple, scale: float, seed_label) -> dict:
    _, shape_s, input_s = made
    return {"chain": ch.name, "dtype": dt.name, "shape": shape_s, "input": input_s,
            "scale": scale, "seed": seed_label}


def _cell_key_dict(spec: dict, common: dict) -> dict:
    maths = spec["maths"]
    return dict(common, **spec["settings"],
                extra_presets=[m.name for m in spec["extras"] if m not in maths])


def _run_cell_at(pos_spec: tuple) -> dict:
    """A Dask worker's cell: on the worker's own device (castlab.sweep.worker_device)."""
    spec = pos_spec[1]
    if isinstance(spec, bytes):  # (a chain from path/file.py, pickled by value)
        import cloudpickle

        spec = cloudpickle.loads(spec)
    return _run_cell(spec, worker_device(spec["device"]))


def _run_cell(spec: dict, on_device: str | None = None) -> dict:
    """One cell of a study (a chain, dtype and seed under every policy, preset and
    rounding mode): its record {"key", "rows", "attribution", "verdicts"}. The same
    function runs in this process and on Dask workers, so both give the same rows."""
    ch, dt, seed = spec["chain"], spec["dtype"], spec["seed"]
    maths, pols, rounding = spec["maths"], spec["pols"], spec["rounding"]
    device = on_device or spec["device"]
    made = spec.get("made")
    if made is None or on_device not in (None, spec["device"]):
        made = _make_args(ch, spec["shape"], dt, seed, spec["kind"], spec["scale"], device)
    args = made[0]
    common = _cell_common(ch, dt, made, spec["scale"], spec["seed_label"])
    key = _cell_key_dict(spec, common)
    # what was computed: the inputs' dtypes (a pinned or file input keeps its own) and,
    # per row, the output's (its metrics are in the output's format)
    common["input_dtypes"] = ",".join(a.dtype.name for a in args)
    fn = _jit_of(ch.fn)
    reference = fn.run(*args, policy=spec["ref"])
    configs, extra_configs = _cell_configs(spec)
    # (math, policy, rounding, result)
    runs = [(m, pol, r, fn.run(*args, policy=pol, math=m)) for m, pol, r in configs]
    runs += [(m, pol, r, fn.run(*args, policy="fused", math=m)) for m, pol, r in extra_configs]
    extras = [m for m, _, _ in extra_configs]
    base = _baseline(runs, maths[0] if maths else None,
                     lambda m, fn=fn, args=args: fn.run(*args, policy="eager", math=m))
    if spec["grad"]:
        common.update({"pass": "forward", "output": "y"})
    # rows name the study's device ("cuda"), not the worker's GPU ("cuda:1")
    new_rows = _compare_rows(runs, reference, common, spec["device"], base)
    if spec["grad"]:
        new_rows += _grad_rows(ch, fn, args, reference, dt, seed, spec["kind"],
                               spec["device"], maths, pols, rounding, spec["ref"], common)
    new_att, new_verdicts = [], []
    if spec["attribute"]:
        for a, b in _attribution_pairs(pols, maths, rounding[0], seed, extras):
            r, v = _attribution(fn, args, a, b, common)
            new_att += r
            new_verdicts.append(v)
    return {"key": key, "rows": [_jsonable(r) for r in new_rows],
            "attribution": _jsonable(new_att), "verdicts": _jsonable(new_verdicts)}


def _cell_configs(spec: dict) -> tuple:
    """The (math, policy, rounding) a cell runs: every preset, policy and rounding mode of
    the study, then (fused, nearest) each extra preset not among them."""
    seed = spec["seed"]
    configs = [(m, _policy_with_rounding(p, r, seed), r)
               for m in spec["maths"] for p in spec["pols"] for r in spec["rounding"]]
    extra: list = []
    for m in spec["extras"]:
        if not any(x[0] == m for x in configs + extra):
            extra.append((m, Policy.fused(), "nearest"))
    return configs, extra


def _cell_warm_runs(spec: dict) -> list:
    """The (jit function, args, policy, math) of a cell's forward runs (reference, each
    configuration, the eager baseline), for castlab._jit.warm; none for a cell whose
    inputs are made where it runs (a Dask worker)."""
    made = spec.get("made")
    if made is None:
        return []
    fn, args = _jit_of(spec["chain"].fn), made[0]
    configs, extra = _cell_configs(spec)
    runs = [(fn, args, spec["ref"], fn.math)]
    runs += [(fn, args, pol, m) for m, pol, _ in configs + extra]
    if spec["maths"]:
        runs.append((fn, args, Policy.eager(), spec["maths"][0]))
    return runs


def _warn_other_output_dtype(chain: str, dt: str, out: str, args: tuple | None = None,
                             too: bool = False, stacklevel: int = 3) -> None:
    """Say when a chain's result is not in the study dtype (an input pinned to float32, or
    a float32 file, promotes it): its rows then carry the output's dtype and their ulp and
    rounding figures are in that format. Before the study runs for its first dtype
    (naming the inputs that differ), and for each other dtype when its first cell comes
    in (`too`). `stacklevel` is warnings.warn's, counted from here."""
    if out == dt:
        return
    pinned = [f"input {k} is {a.dtype.name}" for k, a in enumerate(args or ())
              if a.dtype.name != dt]
    warnings.warn(
        f"chain {chain!r}: in the {dt} study{' too' if too else ''} its result is {out}"
        + (f" ({', '.join(pinned)})" if pinned else "")
        + f": its rows say output_dtype={out}, and their ulp and correctly-rounded "
        f"figures are in {out}", UserWarning, stacklevel=stacklevel)


def _baseline(runs: list, math0, run_eager: Callable):
    """The run `mismatch_vs_eager` compares with: eager, nearest, under the first preset;
    run here (and not reported) when the study has none."""
    for x in runs:
        if x[1].name == "eager" and x[2] == "nearest" and x[0] == math0:
            return x
    if math0 is None:
        return None
    return (math0, Policy.eager(), "nearest", run_eager(math0))


#: The columns of ``run(attribute=True).attrs["attribution"]``: one row per factor set of
#: one attributed pair (A, B) of one chain, dtype and seed; the verdict columns count the
#: differing elements where B is nearer the fp64 value than A ("toward"), farther
#: ("away"), A and B straddle a midpoint ("tie"), equally far ("equal"), or a NaN.
ATTRIBUTION_COLUMNS = ["chain", "dtype", "seed", "A", "B", "factors", "elements", "toward",
                       "away", "tie", "equal", "nan", "suspicious"]


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


def _compare_rows(runs: list, reference, common: dict, device: str, base=None) -> list:
    """One row per run (math, policy, rounding, result), in the order of `runs`, compared
    with `reference` and with `base` (a run of `runs`, or one run only for the
    comparison; default the first run)."""
    if base is None:
        base = runs[0]
    hidden = not any(x is base for x in runs)
    ordered = [base] + [x for x in runs if x is not base]
    names = [f"{x[0].name}/{x[1].describe()}" for x in ordered]
    if hidden:
        names[0] = "(eager baseline)"
    cmp = numerics.compare(*[x[3] for x in ordered], ref=reference, names=names)
    metrics = cmp.to_dict()
    name_of = {id(x): n for x, n in zip(ordered, names)}
    rows = []
    for x in runs:
        m, pol, r, res = x
        row = dict(common, math=m.name, policy=pol.name, rounding=r, device=device,
                   output_dtype=res.dtype.name)
        row.update(_metrics_of(metrics, name_of[id(x)], res.numel()))
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
    base = _baseline(runs, maths[0] if maths else None,
                     lambda m: _grad_parts(ch, fn, argnums,
                                           bwd.run(*args, *cots, policy="eager", math=m)))
    rows = []
    for name, gref in ref.items():
        c = dict(common, output=name)
        c["pass"] = "backward"
        part = [(m, pol, r, parts[name]) for m, pol, r, parts in runs]
        bi = next((i for i, x in enumerate(runs) if x is base), None)
        pbase = part[bi] if bi is not None else (base[0], base[1], base[2], base[3][name])
        rows += _compare_rows(part, gref, c, device, pbase)
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
        # PyTorch's tolerance-based accuracy check (torch._dynamo.utils.same()) against
        # eager; mismatch_vs_eager is the bitwise comparison
        "torch_same_vs_eager": True if same is None else bool(same),  # the baseline passes itself
        # under cancellation max_ulp (ulps of the tiny exact value) explodes; this stays
        # meaningful: the worst error in ulps of the largest exact magnitude
        "max_ulp_at_scale": r["max_ulp_error_at_scale"],
        "worst_index": "" if r.get("worst_index") is None else str(tuple(r["worst_index"])),
    }
