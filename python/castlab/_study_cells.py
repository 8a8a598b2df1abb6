"""The cells of a study (one chain, dtype and seed): their keys and records, their inputs,
and the checks made before they run."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from typing import Any

from . import cuda
from ._creation import tensor
from ._dtype import as_dtype, float64
from ._jit import JitFunction, _arg_names
from ._study_chains import CHAINS, Chain, _gen
from ._study_inputs import Input, _check_dims, check_shape, load_input_file
from .policy import Policy, as_policy

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


#: The grid keys of a row: one row per combination (``pass`` and ``output`` only in a
#: study with gradients). ``CELL_KEYS`` make one cell, the unit a study runs and resumes:
#: every row of a cell comes from one set of inputs.
GRID_KEYS = ["chain", "shape", "input", "scale", "dtype", "seed", "pass", "output", "math",
             "policy", "rounding"]


CELL_KEYS = ["chain", "shape", "input", "scale", "dtype", "seed"]


#: The seed label of a chain whose inputs are all fixed (files, tensors): seeds change
#: nothing, so it runs once.
FIXED_SEED = "fixed"


#: Row columns renamed since: {old name: new name} (``upgrade_record`` reads the old).
RENAMED_COLUMNS = {"same_vs_eager": "torch_same_vs_eager"}


def upgrade_record(rec: Any) -> Any:
    """A cell record (``on_cell``'s) of an earlier castlab with its rows' renamed
    columns under their new names (``RENAMED_COLUMNS``: same_vs_eager is now
    torch_same_vs_eager); anything else unchanged.

    >>> cl.study.upgrade_record({"key": {}, "rows": [{"same_vs_eager": True}]})["rows"]
    [{'torch_same_vs_eager': True}]
    """
    rows = rec.get("rows") if isinstance(rec, dict) else None
    if not isinstance(rows, list) or not any(
            isinstance(r, dict) and any(k in r for k in RENAMED_COLUMNS) for r in rows):
        return rec
    return dict(rec, rows=[_upgrade_row(r) for r in rows])


def _upgrade_row(r: Any) -> Any:
    if not isinstance(r, dict) or not any(k in r for k in RENAMED_COLUMNS):
        return r
    out = {}
    for k, v in r.items():  # in place, so that the columns keep their order
        new = RENAMED_COLUMNS.get(k)
        if new is None:
            out[k] = v
        elif new not in r:  # (both: the new one wins)
            out[new] = v
    return out


def cell_key(cell: dict) -> str:
    """The key of one cell (``CELL_KEYS`` plus the settings its rows depend on, as
    ``run``'s ``on_cell`` records hold it under "key"): a JSON string."""
    return json.dumps(cell, sort_keys=True, default=str)


def _unique(items: list, key: Callable) -> list:
    seen, out = set(), []
    for x in items:
        k = key(x)
        if k not in seen:
            seen.add(k)
            out.append(x)
    return out


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):  # NumPy scalars
        try:
            return v.item()
        except (TypeError, ValueError):
            return str(v)
    return v


def _input_seed(seed: int, i: int) -> int:
    """Input i's stream: input 0 uses the seed itself (as the built-in chains do)."""
    return seed if i == 0 else (seed + i * 0xD1B54A32D192ED03) % 2**64


def _is_builtin(ch: Chain) -> bool:
    return ch.make_inputs is not None


def _fixed_inputs(ch: Chain) -> bool:
    return ch.inputs is not None and all(sp.fixed for sp in ch.inputs)


def _positional_count(fn: Any) -> int:
    import inspect

    f = fn.fn if isinstance(fn, JitFunction) else fn
    try:
        ps = inspect.signature(f).parameters.values()
    except (TypeError, ValueError):
        return 1
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
               for p in ps) or 1


def input_names(ch: Chain) -> list[str]:
    """The names of a chain's inputs, in argument order: its function's positional
    parameters (``x``, ``cos``, ``sin`` for RoPE; ``x0``, ``x1``, ... when they cannot be
    read). A built-in chain's shape is the shape of its first input.

    >>> cl.study.input_names(cl.study.CHAINS["rope"])
    ['x', 'cos', 'sin']
    """
    n = len(ch.inputs) if ch.inputs is not None else _positional_count(ch.fn)
    f = ch.fn.fn if isinstance(ch.fn, JitFunction) else ch.fn
    return list(_arg_names(f, n))


def _make_args(ch: Chain, shape: tuple | None, dt, seed: int, kind: str, scale: float,
               device: str) -> tuple:
    """(args, shape column, input column) of one cell."""
    if ch.inputs is None:
        if _is_builtin(ch):
            return (ch.make_inputs(shape, dt, seed, kind, scale, device),
                    "x".join(str(s) for s in shape), kind)
        if shape is None:
            raise ValueError(
                f"chain {ch.name!r} has no inputs: give Input specs (study.chain(..., "
                f"inputs=[...]) or [[chains.inputs]] in --config), a shape for it "
                f"(shapes={{{ch.name!r}: ...}}, --shape {ch.name}=AxB) or inputs={{{ch.name!r}: "
                f"(tensors...)}}")
        specs = (Input(shape=tuple(shape)),) * _positional_count(ch.fn)
    else:
        specs = ch.inputs
    base = None
    if any(not sp.fixed and sp.shape is None for sp in specs):
        if not _is_builtin(ch):
            i = next(i for i, sp in enumerate(specs) if not sp.fixed and sp.shape is None)
            raise ValueError(f"input {i} of chain {ch.name!r}: give a shape, a file or a tensor")
        base = ch.make_inputs(shape, float64, seed, kind, scale, "cpu")
        if len(base) != len(specs):
            raise ValueError(f"chain {ch.name!r} takes {len(base)} inputs, got {len(specs)} "
                             "input specs")
    args = []
    for i, sp in enumerate(specs):
        idt = as_dtype(sp.dtype) if sp.dtype else dt
        if sp.file is not None:
            arr = load_input_file(sp.file, sp.key, sp.dtype)
            if sp.shape is not None and tuple(arr.shape) != tuple(sp.shape):
                raise ValueError(f"input {i} of chain {ch.name!r}: file {sp.file!r} has shape "
                                 f"{tuple(arr.shape)}, expected {tuple(sp.shape)}")
            t = tensor(arr)
        elif sp.tensor is not None:
            t = sp.tensor
            if sp.shape is not None and tuple(t.shape) != tuple(sp.shape):
                raise ValueError(f"input {i} of chain {ch.name!r}: the tensor has shape "
                                 f"{tuple(t.shape)}, expected {tuple(sp.shape)}")
        elif sp.shape is not None:
            t = _gen(sp.distribution or kind, sp.shape, _input_seed(seed, i),
                     sp.scale if sp.scale is not None else scale, idt, device)
        else:
            t = base[i]
        if not getattr(t, "dtype", None) or not t.dtype.is_floating_point:
            raise ValueError(f"input {i} of chain {ch.name!r} is {t.dtype}, not floating-point")
        args.append(t.astype(idt).to(device))
    if base is not None and shape is not None and all(not sp.fixed and sp.shape is None
                                                      for sp in specs):
        shape_s = "x".join(str(s) for s in shape)
    else:
        shape_s = ",".join("x".join(str(s) for s in a.shape) for a in args)
    return tuple(args), shape_s, ", ".join(sp.describe(kind, scale) for sp in specs)


def _cells_for_workers(cells: list, chains: list) -> list:
    """The cells as Dask workers get them. Chains read from path/file.py live in a module
    only this process has (``_castlab_chain_...``), which a worker cannot import to
    unpickle them (Dask then waits forever): such cells travel as cloudpickle bytes with
    those modules pickled by value."""
    mods = {getattr(ch.fn, "__module__", None) or "" for ch in chains}
    mods = [sys.modules[m] for m in mods if m.startswith("_castlab_chain_") and m in sys.modules]
    if not mods:
        return cells
    import cloudpickle

    for m in mods:
        cloudpickle.register_pickle_by_value(m)
    try:
        return [(ji, cloudpickle.dumps(spec)) for ji, spec in cells]
    finally:
        for m in mods:
            cloudpickle.unregister_pickle_by_value(m)


def _check_seed(sd: Any) -> int:
    """A seed: an integer in [0, 2**64) (not a bool, a float or a string)."""
    if isinstance(sd, bool) or not isinstance(sd, int):
        raise TypeError(f"seeds must be integers, got {sd!r}")
    if not 0 <= sd < 2**64:
        raise ValueError(f"seed {sd} is out of range: seeds are integers in [0, 2**64)")
    return sd


def _check_one_output(ch: Chain, tr: Any) -> None:
    """A chain returns one floating-point tensor (its rows compare that one result)."""
    if tr.structure != "single" or len(tr.outputs) != 1:
        raise ValueError(f"chain {ch.name!r} returns a {tr.structure} of {len(tr.outputs)} "
                         "tensors; a chain must return one tensor (study each output as a "
                         "chain of its own)")
    dt = tr.outputs[0].dtype
    if not dt.is_floating_point:
        raise ValueError(f"chain {ch.name!r} returns a {dt.name} tensor; a chain must return "
                         "one floating-point tensor")


class CellFailed(ValueError):
    """A cell of a study failed (in this process, or on a Dask worker after its retry)."""


def _check_chain_shape(ch: Chain, v: Any) -> tuple:
    if _is_builtin(ch) and ch.name in CHAINS:
        return check_shape(ch.name, v)
    return _check_dims(v, f"shape for {ch.name}")
