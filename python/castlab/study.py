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

Chains come from anywhere: a built-in name (``CHAINS``), ``"pkg.module:function"`` or
``"path/file.py:function"`` (any ``cl.jit``-able function), a function, or a ``Chain``.
Their inputs are generated or read from files per input (``Input``: shape, dtype,
distribution, scale, or a ``.npy``/``.pt``/``.safetensors`` file)::

    run(chains=[chain("mymodel.norms:rms_scale",
                      inputs=[Input(shape=(64, 4096)), Input(shape=(64, 1), dtype="float32")])])

One row per (chain, shape, input, scale, dtype, seed, [pass, output], math, policy,
rounding). Chains whose inputs are all fixed (files, tensors) run once, with
``seed="fixed"`` (unless a rounding mode is stochastic: the seeds seed it). ``on_cell``
receives each finished cell (one chain, shape, input, dtype and seed: all its rows) and
``done=`` takes such records back, so that an interrupted study resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from . import cuda
from ._device import as_device
from ._dtype import as_dtype
from ._jit import warm
from ._progress import bar as _bar
from ._study_cells import CELL_KEYS as CELL_KEYS
from ._study_cells import COTANGENT_SEED_MIX as COTANGENT_SEED_MIX
from ._study_cells import (
    FIXED_SEED,
    GRID_KEYS,
    RENAMED_COLUMNS,
    CellFailed,
    _cells_for_workers,
    _check_chain_shape,
    _check_one_output,
    _check_seed,
    _device_default,
    _fixed_inputs,
    _is_builtin,
    _make_args,
    _unique,
    cell_key,
    input_names,
    upgrade_record,
)
from ._study_cells import _jsonable as _jsonable
from ._study_chains import CHAINS, DEFAULT, MAX_NUMEL, QUICK, Chain
from ._study_inputs import (
    DISTRIBUTIONS,
    Input,
    _one_line,
    chain,
    check_scale,
    check_shape,
    load_input_file,
    row_columns,
)
from ._study_inputs import _check_dims as _check_dims
from ._study_library import LIBRARY_COLUMNS, LIBRARY_DTYPES, libraries, library_inputs
from ._study_rows import (
    ATTRIBUTION_COLUMNS,
    _cell_common,
    _cell_key_dict,
    _cell_warm_runs,
    _jit_of,
    _run_cell,
    _run_cell_at,
    _warn_other_output_dtype,
)
from .policy import Policy, as_math, as_policy
from .sweep import CellFailure, run_cells

__all__ = ["Chain", "CHAINS", "run", "DEFAULT", "QUICK", "row_columns", "check_shape",
           "check_scale", "MAX_NUMEL", "ATTRIBUTION_COLUMNS", "attribution_table", "Input",
           "chain", "load_input_file", "DISTRIBUTIONS", "GRID_KEYS", "cell_key", "libraries",
           "library_inputs", "LIBRARY_COLUMNS", "LIBRARY_DTYPES", "input_names", "upgrade_record",
           "RENAMED_COLUMNS"]


def run(chains: Sequence[str | Callable | Chain] = ("swiglu", "rope"),
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
        attribute: bool = False,
        on_cell: Callable | None = None,
        done: Any = None,
        workers: int | None = None,
        scheduler: str | None = None):
    """Run a study and return a pandas DataFrame, one row per configuration and policy.

    Each row compares one result with the fp64 reference (correctly-rounded fraction,
    max/mean ulp error, relative RMSE, ...) and with the eager result of the same
    configuration (mismatch fraction, PyTorch's ``same()`` verdict): the eager policy
    under the first preset, rounding to nearest, run for the comparison when `policies`
    has no eager.

    Args:
        chains: built-in chain names (``castlab.study.CHAINS``), ``"pkg.module:function"``
            or ``"path/file.py:function"`` specs, functions of tensors, or ``Chain``\\ s
            (``chain(spec, inputs=[Input(...), ...])``).
        dtypes: storage dtypes of the inputs (an ``Input`` may pin its own).
        shapes: a shape per chain name (dict), or one shape for all chains. A function
            chain without input specs gets inputs of its shape, one per parameter.
        policies: policy names or ``castlab.Policy`` objects.
        presets: math presets (or ``castlab.Math``) to run every policy under.
        rounding: downcast rounding modes ("nearest", "toward_zero", "stochastic").
        seeds: input seeds (and stochastic-rounding seeds). A chain whose inputs are all
            fixed (files, tensors) runs once, labelled ``seed="fixed"``, unless a rounding
            mode is stochastic.
        device: "cpu" or "cuda" (default: the GPU when there is one).
        inputs: "normal", "uniform", or a dict {chain name: tuple of tensors or
            ``Input``\\ s} to study real activations (e.g. passed in from PyTorch;
            tensors are cast to the study dtype, ``Input(tensor=t, dtype=...)`` pins one).
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
        on_cell: called with each finished cell, a JSON-serialisable dict: "key" (the
            cell's ``CELL_KEYS`` and the settings its rows depend on), "rows",
            "attribution", "verdicts".
        done: such records of an earlier, interrupted run of this study: cells whose key
            is among them are not run again; their rows are returned as recorded (and not
            passed to `on_row` or `on_cell`).
        workers: run the cells on a Dask ``distributed`` LocalCluster of this many worker
            processes (on "cuda": one GPU per worker, ``cuda:k`` for worker k); results
            stream back to `on_row`/`on_cell` as cells finish, a failed cell is retried
            once, and the rows equal a serial run's, bit for bit.

    A cell that fails (its chain raises; on workers: after its retry) ends the study with
    ``CellFailed`` (a ValueError naming the cell and the error), in this process at once,
    on workers once the other cells have finished; the finished cells have been passed
    to `on_row`/`on_cell` (give their records as `done` to run the rest).
        scheduler: the address of an existing Dask cluster ("tcp://host:8786") to send
            the cells to instead (its workers need castlab and the chains' functions).

    >>> df = run(chains=["swiglu"], dtypes=["bfloat16"], quick=True)   # doctest: +SKIP
    """
    import pandas as pd

    st = _study(chains, dtypes, shapes, policies, presets, rounding, seeds, device, ref, inputs,
                scale, extra_presets, quick, grad, attribute, done, workers, scheduler)
    jobs = _jobs(st)
    first_args, promoted_said = _trace_first(st, jobs)
    cells, records = _pending_cells(st, jobs, first_args)
    collect = _Collector(st, len(jobs), len(cells), records, promoted_said, on_row, on_cell,
                         progress)
    if st.here:
        _warm_cells(st, cells)
        _run_here(cells, collect)
    else:
        _run_on_workers(st, cells, collect)
    collect.raise_failures()
    rows, att_rows, verdicts = _gathered(records)
    if progress is True:
        _bar(len(jobs), len(jobs), "done")
    df = pd.DataFrame(rows, columns=row_columns(grad))
    if attribute:
        df.attrs["attribution"] = att_rows
        df.attrs["attribution_verdicts"] = verdicts
    return df


# ---------------------------------------------------------------- run()'s steps

@dataclasses.dataclass
class _Study:
    """run()'s arguments, checked and normalised once: what the study's cells share."""
    chains: list            # Chain objects, one per name
    shapes: Any             # {chain name: shape}, one shape for every chain, or None
    dtypes: list
    policies: list
    maths: list
    rounding: list
    seeds: list
    ref: Policy
    device: str
    kind: str               # the input generator: "normal" or "uniform"
    scale: float
    extra_presets: dict
    quick: bool
    grad: bool
    attribute: bool
    workers: int | None
    scheduler: str | None
    settings: dict          # the settings each cell's key holds
    done: dict              # {cell key: record} of an earlier run of the study

    @property
    def here(self) -> bool:
        """Whether the cells run in this process (not on Dask workers)."""
        return self.workers is None and self.scheduler is None

    def shape_of(self, ch: Chain):
        if isinstance(self.shapes, dict):
            if ch.name in self.shapes:
                return tuple(self.shapes[ch.name])
        elif self.shapes is not None:
            return tuple(self.shapes)
        if _is_builtin(ch):
            return ch.quick_shape if self.quick else ch.default_shape
        return None


def _study(chains, dtypes, shapes, policies, presets, rounding, seeds, device, ref, inputs,
           scale, extra_presets, quick, grad, attribute, done, workers, scheduler) -> _Study:
    """run()'s arguments checked (a TypeError or ValueError naming the bad one) into a
    _Study."""
    scale = check_scale(scale)
    _check_flags(seeds, quick, grad, attribute, workers, scheduler)
    if device is not None:
        if not isinstance(device, str):
            raise TypeError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
        as_device(device)  # ValueError naming the device for 'tpu', 'cudax', ...
    device = device or _device_default()
    extra_presets = extra_presets or {}
    kind = _input_kind(inputs)
    chain_objs = _chain_objects(chains, inputs)
    shapes = _checked_shapes(shapes, chain_objs)
    dts = _unique([as_dtype(d) for d in dtypes], lambda d: d.name)
    for d in dts:
        if not d.is_floating_point:
            raise ValueError(f"dtype {d} is not a floating-point dtype")
    pols = _unique([as_policy(p) for p in policies], lambda p: p.describe())
    maths = _unique([as_math(m) for m in presets], lambda m: m)
    rounding = _unique(list(rounding), lambda r: r)
    for r in rounding:
        Policy(rounding=r)  # validates
    seeds = _unique(list(seeds), lambda s: s)
    ref_policy = as_policy(ref)
    settings = {"device": device, "policies": [p.describe() for p in pols],
                "presets": [m.name for m in maths], "rounding": list(rounding),
                "ref": ref_policy.describe(), "grad": bool(grad), "attribute": bool(attribute)}
    done_map = {}
    for rec in done or ():
        rec = upgrade_record(rec)
        k = rec["key"]
        done_map[k if isinstance(k, str) else cell_key(k)] = rec
    return _Study(chain_objs, shapes, dts, pols, maths, rounding, seeds, ref_policy, device,
                  kind, scale, extra_presets, quick, bool(grad), bool(attribute), workers,
                  scheduler, settings, done_map)


def _check_flags(seeds, quick, grad, attribute, workers, scheduler) -> None:
    """The seeds, the True/False switches and the Dask settings of run()."""
    if seeds is None or isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence):
        raise TypeError(f"seeds must be a sequence of integers, got {seeds!r}")
    for sd in seeds:
        _check_seed(sd)
    for what, v in (("quick", quick), ("grad", grad), ("attribute", attribute)):
        if not isinstance(v, bool):
            raise TypeError(f"{what} must be True or False, got {v!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 0):
        raise ValueError(f"workers must be an int >= 0, got {workers!r}")
    if scheduler is not None and not isinstance(scheduler, str):
        raise TypeError(f"scheduler must be a Dask scheduler address (a string such as "
                        f"'tcp://host:8786'), got {scheduler!r}")


def _input_kind(inputs: Any) -> str:
    """The generator of run()'s inputs: `inputs` itself, or "normal" for a dict of tensors."""
    if isinstance(inputs, str):
        if inputs not in DISTRIBUTIONS:
            raise ValueError(f"unknown input generator {inputs!r}; valid: "
                             + ", ".join(DISTRIBUTIONS))
        return inputs
    if isinstance(inputs, dict):
        return "normal"
    raise TypeError(f"inputs must be 'normal', 'uniform' or a dict {{chain: tensors}}, "
                    f"got {type(inputs).__name__}")


def _chain_objects(chains: Sequence, inputs: Any) -> list:
    """run()'s chains as Chains (with the tensors of a dict `inputs`), one per name."""
    chain_objs: list = []
    for c in chains:
        ch = chain(c)
        if isinstance(inputs, dict):
            if ch.name in inputs:
                ch = chain(ch, inputs=list(inputs[ch.name]))
            elif ch.inputs is None:
                raise ValueError(f"inputs has no tensors for chain {ch.name!r}")
        if any(o.name == ch.name and o is not ch and o != ch for o in chain_objs):
            raise ValueError(f"two different chains are named {ch.name!r}: name one")
        chain_objs.append(ch)
    return _unique(chain_objs, lambda ch: ch.name)


def _checked_shapes(shapes: Any, chain_objs: list) -> Any:
    """run()'s `shapes` checked: a dict with each shape checked, or as given."""
    by_name = {ch.name: ch for ch in chain_objs}
    if isinstance(shapes, dict):
        checked = {}
        for k, v in shapes.items():
            if k in by_name:
                checked[k] = _check_chain_shape(by_name[k], v)
            else:
                checked[k] = check_shape(k, v)  # a built-in not studied, or unknown: raises
        return checked
    if shapes is not None:
        for ch in chain_objs:
            _check_chain_shape(ch, shapes)
    return shapes


def _jobs(st: _Study) -> list:
    """The study's (chain, dtype, seed label) combinations, in the order of its rows."""
    jobs = []
    for ch in st.chains:
        fixed = _fixed_inputs(ch) and "stochastic" not in st.rounding
        for dt in st.dtypes:
            for seed in ([FIXED_SEED] if fixed and st.seeds else st.seeds):
                jobs.append((ch, dt, seed))
    return jobs


def _trace_first(st: _Study, jobs: list) -> tuple:
    """Chains that are not built in: make the first cell's inputs and trace them now, so
    that a bad file or an untraceable function fails before the study starts. Returns
    ({(chain, dtype, seed label): made args}, {(chain, dtype) warned about})."""
    fns = {ch.name: _jit_of(ch.fn) for ch in st.chains}
    first_args: dict = {}
    promoted_said: set = set()  # (chain, study dtype) whose promotion was warned about
    for ch in st.chains:
        if _is_builtin(ch) and ch.inputs is None:
            continue
        job = next((j for j in jobs if j[0] is ch), None)
        if job is None:
            continue
        sd = st.seeds[0] if job[2] == FIXED_SEED else job[2]
        made = _make_args(ch, st.shape_of(ch), job[1], sd, st.kind, st.scale, st.device)
        try:
            tr = fns[ch.name].graph(*made[0])
        except (Exception, SystemExit) as e:  # noqa: BLE001  (whatever the user's function raises)
            raise ValueError(f"chain {ch.name!r} cannot be traced by castlab.jit "
                             f"({type(e).__name__}: {_one_line(e)})") from None
        _check_one_output(ch, tr)
        # (the other dtypes are not traced here: a trace calls the user's function, and
        # the study's cells would then see what that call changed; their rows say it)
        _warn_other_output_dtype(ch.name, job[1].name, tr.outputs[0].dtype.name, made[0],
                                 stacklevel=4)
        promoted_said.add((ch.name, job[1].name))
        first_args[(ch.name, job[1].name, job[2])] = made
    return first_args, promoted_said


def _pending_cells(st: _Study, jobs: list, first_args: dict) -> tuple:
    """([(job position, cell spec)] of the cells still to run, {job position: record} of
    those `done` holds)."""
    cells: list = []
    records: dict = {}
    for ji, (ch, dt, seed_label) in enumerate(jobs):
        seed = st.seeds[0] if seed_label == FIXED_SEED else seed_label
        spec = {"chain": ch, "dtype": dt, "seed_label": seed_label, "seed": seed,
                "shape": st.shape_of(ch), "kind": st.kind, "scale": st.scale,
                "device": st.device, "maths": st.maths, "pols": st.policies,
                "rounding": st.rounding, "ref": st.ref,
                "extras": [as_math(m) for m in st.extra_presets.get(ch.name, [])],
                "grad": st.grad, "attribute": st.attribute, "settings": st.settings}
        made = first_args.pop((ch.name, dt.name, seed_label), None)
        if made is None and st.here:
            made = _make_args(ch, spec["shape"], dt, seed, st.kind, st.scale, st.device)
        if made is not None:
            common = _cell_common(ch, dt, made, st.scale, seed_label)
            kstr = cell_key(_cell_key_dict(spec, common))
            if kstr in st.done:
                records[ji] = st.done[kstr]
                continue
            if st.here:
                spec["made"] = made  # (tensors stay in this process)
        cells.append((ji, spec))
    return cells, records


class _Collector:
    """Takes each finished cell's record (or its failure) as it comes in: keeps it, warns
    once of a result in another dtype, and passes its rows to `on_row`, the record to
    `on_cell` and the count to the progress bar."""

    def __init__(self, st: _Study, total: int, pending: int, records: dict,
                 promoted_said: set, on_row, on_cell, progress):
        self.st, self.total, self.skipped = st, total, total - pending
        self.records, self.promoted_said = records, promoted_said
        self.on_row, self.on_cell, self.progress = on_row, on_cell, progress
        self.finished = 0
        self.failures: list = []

    def __call__(self, pos_spec: tuple, rec: Any) -> None:
        ji, spec = pos_spec
        self.finished += 1
        if isinstance(rec, CellFailure):
            self.failures.append(f"cell {spec['chain'].name} {spec['dtype'].name} "
                                 f"seed={spec['seed_label']} failed: {rec.error}")
            return
        if spec.get("made") is None and cell_key(rec["key"]) in self.st.done:
            self.records[ji] = self.st.done[cell_key(rec["key"])]
            return
        self.records[ji] = rec
        for row in rec["rows"]:
            said = (row.get("chain"), row.get("dtype"))
            if row.get("output_dtype") not in (None, row.get("dtype")) and \
                    said not in self.promoted_said:
                self.promoted_said.add(said)
                _warn_other_output_dtype(said[0], said[1], row["output_dtype"], too=True,
                                         stacklevel=4)
            if self.on_row is not None:
                self.on_row(row)
        if self.on_cell is not None:
            self.on_cell(rec)
        if self.progress is True:
            _bar(self.finished + self.skipped, self.total, f"{spec['chain'].name} "
                 f"{spec['dtype'].name} seed={spec['seed_label']}")
        elif callable(self.progress):
            self.progress(self.finished + self.skipped, self.total, spec["chain"].name)

    def raise_failures(self) -> None:
        """CellFailed naming the first failed cell, if one failed."""
        if self.failures:
            more = (f" (and {len(self.failures) - 1} more cell(s))" if len(self.failures) > 1
                    else "")
            raise CellFailed(f"study: {self.failures[0]}{more}; the finished cells are kept "
                             "(castlab study --resume, or run(done=records), runs the rest)")


def _warm_cells(st: _Study, cells: list) -> None:
    """On CUDA, compile the kernels of every pending cell's forward runs first,
    `cuda.compile_threads()` at a time (castlab._jit.warm; the cells then run one after
    another as before and find them loaded). CASTLAB_COMPILE_THREADS=1 skips it."""
    if not st.device.startswith("cuda"):
        return
    threads = cuda.compile_threads()
    runs = [r for _, spec in cells for r in _cell_warm_runs(spec)]
    if threads > 1 and runs:   # (with numerics.compare's and the plans' fixed-source kernels)
        warm(runs, threads, device=st.device)


def _run_here(cells: list, collect: _Collector) -> None:
    """The cells in this process, one after another, until one fails."""
    for pos_spec in cells:
        try:
            rec = _run_cell(pos_spec[1])
        except (Exception, SystemExit) as e:  # noqa: BLE001  (the chain's code: reported
            # as a worker's failure is, and the study stops)
            rec = CellFailure(pos_spec, f"{type(e).__name__}: {_one_line(e)}")
        collect(pos_spec, rec)
        if collect.failures:
            break


def _run_on_workers(st: _Study, cells: list, collect: _Collector) -> None:
    """The cells on Dask workers (castlab.sweep), their records collected as they finish."""
    devs = None
    if st.device.startswith("cuda") and st.scheduler is None:
        devs = [f"cuda:{i}" for i in range(cuda.device_count())]
    sent = _cells_for_workers(cells, st.chains)
    by_pos = dict(cells)
    out = run_cells(sent, _run_cell_at, workers=st.workers, scheduler=st.scheduler,
                    devices=devs, on_result=lambda c, r: collect((c[0], by_pos[c[0]]), r))
    if out.interrupted:
        raise KeyboardInterrupt


def _gathered(records: dict) -> tuple:
    """(rows, attribution rows, verdicts) of the cells' records, in the order of the jobs."""
    rows: list = []
    att_rows: list = []
    verdicts: list = []
    for ji in sorted(records):
        rec = records[ji]
        rows += rec["rows"]
        att_rows += rec.get("attribution", [])
        verdicts += rec.get("verdicts", [])
    return rows, att_rows, verdicts



def attribution_table(df):
    """The attribution of a ``run(..., attribute=True)`` study as a DataFrame: one row per
    factor set of each attributed pair, columns ``ATTRIBUTION_COLUMNS``."""
    import pandas as pd

    if "attribution" not in df.attrs:
        raise ValueError("this study has no attribution: run it with attribute=True")
    return pd.DataFrame(df.attrs["attribution"], columns=ATTRIBUTION_COLUMNS)


def __dir__() -> list:
    """The public API only (not the helpers this module imports)."""
    return sorted(__all__)
