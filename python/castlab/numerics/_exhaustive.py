"""Proof by exhaustion: every input of an enumeration run through a chain under several
configurations (policy x math) and against the fp64 reference, reduced to counts
(:func:`exhaustive`).

How it runs (CPU): the cross product of the input enumerations is walked by index in
chunks of up to 2**20 inputs. For each chunk the inputs are generated from their indices
in C++ (ops/exhaustive.cpp) into chunk-sized tensors, every configuration's Plan -- the
very Programs ``cl.jit`` lowers the chain to -- runs on them with the CPU executor
(multithreaded), and the per-element statistics (ops/scalar/exhaustive.h) are reduced on
the thread pool in index order. Only the chunk is ever materialised.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from typing import Any

import numpy as np

from .. import _C
from .._creation import zeros
from .._device import as_device
from .._dtype import as_dtype, dtype
from .._graph import ELEMENTWISE
from .._jit import JitFunction, jit
from ..policy import Math, Policy, as_math, as_policy
from ._formats import _float_val, _fmt
from ._tables import _fmt_num, _html_table, _text_table

__all__ = ["exhaustive", "Enumeration", "Exhaustive", "ExhaustiveTooLong", "HIST_EDGES"]

_CHUNK = 1 << 20
_HIST_LO = int(_C.EX_HIST_LO)
_HIST_BINS = int(_C.EX_HIST_BINS)
#: Lower edges of the ulp-error histogram's bins: [0] holds errors of exactly 0, then
#: (0, 2**-8), [2**-8, 2**-7), ..., [2**31, 2**32) and [2**32, inf] (inf included).
HIST_EDGES: tuple = (0.0, 0.0) + tuple(math.ldexp(1.0, _HIST_LO + j)
                                       for j in range(_HIST_BINS - 2))
_CATEGORIES = ("exact", "rounded", "one_ulp", "over_one_ulp", "nan_mismatch")


class ExhaustiveTooLong(ValueError):
    """Raised by :func:`exhaustive` when the estimated run time exceeds ``max_seconds``
    and ``allow_long`` is not set (the message gives the estimate).

    >>> import castlab as cl, castlab.numerics as nm
    >>> try:
    ...     nm.exhaustive(lambda a, b: a * b, [cl.bfloat16] * 2, ["fused"], max_seconds=1e-3)
    ... except nm.ExhaustiveTooLong as e:
    ...     print(str(e)[:40])
    exhaustive: 4294967296 inputs would take

    Its attributes say the same in numbers: `n` (inputs), `estimate` (seconds), `rate`
    (inputs per second, measured on the first `measured` inputs) and `max_seconds`.
    """

    def __init__(self, message: str, n: int = 0, estimate: float = 0.0, rate: float = 0.0,
                 measured: int = 0, max_seconds: float = 0.0):
        super().__init__(message)
        self.n, self.estimate, self.rate = n, estimate, rate
        self.measured, self.max_seconds = measured, max_seconds


# ================================================================ argument checks

def _checked_int(v: Any, what: str, lo: int | None = 0, where: str = "Enumeration") -> int:
    """`v` as an int (a Python or NumPy integer, not a bool, float or string), >= `lo`."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{where}: {what} must be an integer, got {type(v).__name__} {v!r}")
    v = int(v)
    if lo is not None and v < lo:
        raise ValueError(f"{where}: {what} must be >= {lo}, got {v}")
    return v


def _checked_table(table: Any, d: dtype) -> np.ndarray:
    """An explicit table of bit patterns as uint64, after checking that every entry is
    an integer bit pattern of `d` (naming the first bad entry and its index)."""
    if isinstance(table, (str, bytes)) or table is None:
        raise TypeError(f"Enumeration: table must be an array of integer bit patterns, got "
                        f"{type(table).__name__}")
    if isinstance(table, (list, tuple)) and any(isinstance(v, (bool, np.bool_)) for v in table):
        i = next(i for i, v in enumerate(table) if isinstance(v, (bool, np.bool_)))
        raise TypeError(f"Enumeration: table[{i}] = {table[i]!r} is not an integer bit pattern")
    try:
        a = np.asarray(table)
    except Exception as e:  # noqa: BLE001  (ragged lists, odd objects)
        raise TypeError(f"Enumeration: table must be an array of integer bit patterns "
                        f"({type(e).__name__}: {e})") from None
    if a.ndim != 1:
        raise ValueError(f"Enumeration: table must be one-dimensional, got shape {a.shape}")
    limit = 1 << d.bits
    if a.dtype.kind in "ui":
        bad = np.flatnonzero(a < 0) if a.dtype.kind == "i" else np.zeros(0, np.intp)
        if limit < 1 << 64:  # (a float64 table: every uint64 is a pattern)
            bad = np.union1d(bad, np.flatnonzero(a.astype(np.uint64) >= np.uint64(limit)))
        if len(bad):
            i = int(bad[0])
            raise ValueError(f"Enumeration: table[{i}] = {int(a[i])} ({int(a[i]):#x}) is not a "
                             f"bit pattern of {d.name} (valid: 0 to {limit - 1:#x}); "
                             f"{len(bad)} such entr{'y' if len(bad) == 1 else 'ies'}")
        return np.ascontiguousarray(a, dtype=np.uint64)
    if a.dtype.kind == "O":
        out = np.empty(a.size, dtype=np.uint64)
        for i, v in enumerate(a.tolist()):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"Enumeration: table[{i}] = {v!r} is not an integer bit "
                                f"pattern")
            if not 0 <= v < limit:
                raise ValueError(f"Enumeration: table[{i}] = {v} is not a bit pattern of "
                                 f"{d.name} (valid: 0 to {limit - 1:#x})")
            out[i] = v
        return out
    if a.size == 0:
        return np.zeros(0, dtype=np.uint64)
    raise TypeError(f"Enumeration: table must hold integer bit patterns, got dtype {a.dtype} "
                    f"(table[0] = {a.reshape(-1)[0]!r}); use Enumeration.of(values) for values")


# ================================================================ enumerations

class Enumeration:
    """The values one input takes: bit patterns of a floating-point dtype, either a
    contiguous range of patterns or an explicit list.

    >>> import castlab as cl
    >>> from castlab.numerics import Enumeration
    >>> len(Enumeration.all(cl.bfloat16)), len(Enumeration.finite(cl.bfloat16))
    (65536, 65280)
    >>> e = Enumeration.bits(cl.bfloat16, 0x3F80, 0x3F82)
    >>> e, e.values().tolist()
    (Enumeration(bfloat16 bits [0x3F80, 0x3F82)), [1.0, 1.0078125])
    >>> Enumeration.of(cl.tensor([0.5, 2.0], dtype=cl.float16)).bits_at(1)
    16384
    """

    __slots__ = ("dtype", "lo", "count", "table", "label")

    def __init__(self, dt: Any, lo: int = 0, count: int = 0, table: np.ndarray | None = None,
                 label: str = ""):
        d = as_dtype(dt)
        if not d.is_floating_point:
            raise TypeError(f"Enumeration: {d.name} is not a floating-point dtype")
        self.dtype: dtype = d
        if not isinstance(label, str):
            raise TypeError(f"Enumeration: label must be a string, got {label!r}")
        self.table = None if table is None else _checked_table(table, d)
        if self.table is None:
            lo = _checked_int(lo, "lo", None)  # (a negative one: outside, below)
            count = _checked_int(count, "count")
        n = len(self.table) if self.table is not None else count
        if n <= 0:
            raise ValueError(f"Enumeration: {label or 'the enumeration'} is empty")
        if self.table is None and (lo < 0 or lo + n > 1 << d.bits):
            raise ValueError(f"Enumeration: bit patterns [{lo:#x}, {lo + n:#x}) are outside "
                             f"the {d.bits}-bit patterns of {d.name}")
        if n >= 1 << 64:
            raise ValueError(f"Enumeration: {n} values ({d.name}) do not fit a 64-bit index")
        self.lo = int(lo)
        self.count = n
        self.label = label

    # -- constructors --------------------------------------------------------------
    @classmethod
    def all(cls, dt: Any) -> Enumeration:
        """Every bit pattern of `dt` (NaNs and infinities included)."""
        d = as_dtype(dt)
        return cls(d, 0, 1 << d.bits, label=f"all {d.name}")

    @classmethod
    def finite(cls, dt: Any) -> Enumeration:
        """Every finite value of `dt` (both zeros included); 8- and 16-bit dtypes."""
        d = as_dtype(dt)
        if d.bits > 16:
            raise ValueError(f"Enumeration.finite: {d.name} has too many patterns for a list; "
                             "use Enumeration.bits(dtype, start, stop) ranges")
        b = np.arange(1 << d.bits, dtype=np.uint64)
        with np.errstate(invalid="ignore"):   # (NaN patterns of fp8 e4m3fn)
            v = b.astype(_fmt(d).uint).view(d.numpy).astype(np.float64)
        return cls(d, table=b[np.isfinite(v)], label=f"finite {d.name}")

    @classmethod
    def bits(cls, dt: Any, start: int, stop: int) -> Enumeration:
        """The bit patterns ``start <= bits < stop`` of `dt`."""
        d = as_dtype(dt)
        start = _checked_int(start, "start", None, "Enumeration.bits")
        stop = _checked_int(stop, "stop", None, "Enumeration.bits")
        if stop <= start:
            raise ValueError(f"Enumeration.bits: empty range [{start:#x}, {stop:#x})")
        return cls(d, int(start), int(stop) - int(start),
                   label=f"{d.name} bits [{int(start):#X}, {int(stop):#X})".replace("0X", "0x"))

    @classmethod
    def of(cls, x: Any) -> Enumeration:
        """The values of a tensor (castlab, NumPy, PyTorch), flattened, in its dtype."""
        v = _float_val(x, "values")
        f = _fmt(v.dt)
        bits = np.ascontiguousarray(v.a).reshape(-1).view(f.uint).astype(np.uint64)
        return cls(v.dt, table=bits, label=f"{len(bits)} {v.dt.name} values")

    @classmethod
    def sample(cls, dt: Any, n: int, seed: int = 0, finite: bool = True) -> Enumeration:
        """`n` distinct bit patterns of `dt` drawn uniformly (finite ones only unless
        `finite` is False), sorted; the same for the same seed."""
        d = as_dtype(dt)
        n = _checked_int(n, "n", 1, "Enumeration.sample")
        seed = _checked_int(seed, "seed", 0, "Enumeration.sample")
        if not isinstance(finite, (bool, np.bool_)):
            raise TypeError(f"Enumeration.sample: finite must be True or False, got {finite!r}")
        rng = np.random.default_rng(seed)
        if d.bits <= 16:
            pool = cls.finite(d) if finite else cls.all(d)
            if n > len(pool):
                raise ValueError(f"Enumeration.sample: {n} values asked, {d.name} has {len(pool)}")
            pick = np.sort(rng.choice(len(pool), size=n, replace=False))
            bits = pool.table[pick] if pool.table is not None else pick.astype(np.uint64)
        else:
            # float32: the finite patterns are [0, 0x7F800000) and the same with the sign bit
            half = 0x7F800000 if finite else 1 << (d.bits - 1)
            pick = np.sort(rng.choice(2 * half, size=n, replace=False)).astype(np.uint64)
            sign = np.uint64(1 << (d.bits - 1))
            bits = np.where(pick < half, pick, pick - np.uint64(half) + sign)
        return cls(d, table=bits, label=f"{n} sampled {d.name} (seed {seed})")

    # -- access --------------------------------------------------------------------
    def __len__(self) -> int:
        return self.count

    def bits_at(self, i: int) -> int:
        """The bit pattern of value number `i`."""
        if not 0 <= i < self.count:
            raise IndexError(f"Enumeration: index {i} outside [0, {self.count})")
        return int(self.table[i]) if self.table is not None else self.lo + int(i)

    def values(self) -> np.ndarray:
        """All values, in the enumeration's dtype (a NumPy / ml_dtypes array)."""
        f = _fmt(self.dtype)
        b = self.table if self.table is not None else np.arange(
            self.lo, self.lo + self.count, dtype=np.uint64)
        return b.astype(f.uint).view(self.dtype.numpy)

    def _spec(self) -> tuple:
        if self.table is not None:
            return (self.dtype.name, 0, self.count, self.table.tolist())
        return (self.dtype.name, self.lo, self.count, [])

    def __repr__(self) -> str:
        return f"Enumeration({self.label})"


def _as_enumeration(x: Any) -> Enumeration:
    if isinstance(x, Enumeration):
        return x
    if isinstance(x, (str, dtype)):
        return Enumeration.all(x)
    return Enumeration.of(x)


# ================================================================ configurations

def _as_config(c: Any) -> tuple:
    """(label, Policy, Math) from (policy, math), "policy/math" or a Policy alone."""
    if isinstance(c, str) and "/" in c:
        c = tuple(c.split("/", 1))
    if isinstance(c, (Policy, str)):
        c = (c, "torch_eager")
    if not isinstance(c, tuple) or len(c) != 2:
        raise TypeError("exhaustive: a configuration is (policy, math), 'policy/math' or a "
                        f"policy, not {c!r}")
    pol, mth = as_policy(c[0]), as_math(c[1])
    if pol.name == "fp64":
        raise ValueError("exhaustive: the fp64 policy is the reference, not a configuration")
    return (f"{pol.describe()}/{mth.name}", pol, mth)


def _configs(configs: Any) -> list:
    if configs is None or isinstance(configs, (str, Policy)) or (
            isinstance(configs, tuple) and len(configs) == 2
            and not isinstance(configs[0], (tuple, list))):
        configs = [configs] if configs is not None else []
    out = [_as_config(c) for c in configs]
    if not out:
        raise ValueError("exhaustive: configs is empty; give at least one (policy, math)")
    labels = [c[0] for c in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"exhaustive: configurations repeat: {labels}")
    return out


# ================================================================ tracing

def _trace(fn: Any, enums: list, n: int, device: str):
    """(jit function, traced graph, example inputs of length n) for `fn`, after checking
    that it is an elementwise chain of one floating-point output."""
    if isinstance(fn, JitFunction):
        jf = fn
    elif callable(fn):
        jf = jit(fn)
    else:
        raise TypeError(f"exhaustive: fn must be a function, got {type(fn).__name__}")
    xs = [zeros(n, dtype=e.dtype, device=device) for e in enums]
    try:
        tr, captured = jf._traced(xs)
    except (Exception, SystemExit) as e:  # noqa: BLE001  (any failure of the user's function)
        raise TypeError(f"exhaustive: {getattr(fn, '__name__', 'fn')} could not be traced on "
                        f"{len(enums)} tensor input(s) ({type(e).__name__}: {e})") from e
    if captured:
        raise ValueError("exhaustive: the function captures tensors; pass them as inputs "
                         "(an Enumeration.of(tensor) enumerates their values)")
    bad = sorted({nd.op for nd in tr.nodes if nd.op not in ELEMENTWISE and nd.op != "scalar"})
    if bad:
        raise ValueError(f"exhaustive: the chain must be elementwise; it has {', '.join(bad)}")
    if len(tr.outputs) != 1 or tr.structure != "single":
        raise ValueError(f"exhaustive: the function returns a {tr.structure} of "
                         f"{len(tr.outputs)} tensors; it must return one tensor (run each "
                         "output as a function of its own)")
    out = tr.outputs[0]
    if out.op == "input" or tuple(out.shape) != (n,):
        raise ValueError("exhaustive: the result must be computed elementwise from the inputs")
    if not out.dtype.is_floating_point:
        raise ValueError(f"exhaustive: the result is {out.dtype.name}, not floating point")
    return jf, tr, xs


def _plans(jf, tr, xs: list, configs: list, ref_math: Math) -> tuple:
    plans, out_dt = [], None
    for label, pol, mth in configs:
        plan, _ = jf._plan(tr, xs, pol, mth)
        d = plan.out_dtypes[0]
        if out_dt is not None and d is not out_dt:
            raise ValueError(f"exhaustive: configurations disagree on the result dtype "
                             f"({out_dt.name} vs {d.name} under {label})")
        out_dt = d
        plans.append(plan._c)
    if out_dt.name == "float64":
        raise ValueError("exhaustive: the result is float64; it has no fp64 reference to "
                         "compare with")
    try:
        ref, _ = jf._plan(tr, xs, Policy.fp64(), ref_math)
    except (ValueError, TypeError, NotImplementedError) as e:
        raise ValueError(f"exhaustive: the chain has no fp64 reference ({e})") from e
    return plans, ref._c, out_dt


# ================================================================ the result

def _merge(a: dict | None, b: dict, first_k: int) -> dict:
    """Statistics of consecutive index ranges `a` then `b`, as one range."""
    if a is None:
        return b
    a["n"] += b["n"]
    a["ties"] += b["ties"]
    a["near_ties"] += b["near_ties"]
    for ca, cb in zip(a["configs"], b["configs"]):
        ca["counts"] = [x + y for x, y in zip(ca["counts"], cb["counts"])]
        ca["hist"] = [x + y for x, y in zip(ca["hist"], cb["hist"])]
        if cb["max_error"] > ca["max_error"]:
            ca["max_error"], ca["max_index"] = cb["max_error"], cb["max_index"]
    for pa, pb in zip(a["pairs"], b["pairs"]):
        pa["differ"] += pb["differ"]
        pa["differ_at_ties"] += pb["differ_at_ties"]
        pa["max_tie_distance"] = max(pa["max_tie_distance"], pb["max_tie_distance"])
        pa["first"] = (pa["first"] + pb["first"])[:first_k]
    return a


class Exhaustive:
    """The result of :func:`exhaustive`.

    Attributes: ``n`` (inputs visited), ``total`` (size of the cross product),
    ``inputs`` (the Enumerations), ``dtype`` (the results' dtype), ``configs`` (labels),
    ``ties`` (inputs whose fp64 reference is exactly a rounding midpoint of ``dtype``),
    ``near_ties`` (those and the ones within 256 fp64 ulps of a midpoint: castlab's fp64
    functions are within 2 fp64 ulps, not correctly rounded, so for these inputs the
    reference cannot certify which neighbour is the correctly rounded one; every other
    input's labels hold against the exact value),
    ``rows`` (per configuration: counts, histogram, worst input), ``pairs`` (per pair of
    configurations: ``differ`` inputs where they differ, ``differ_at_ties`` of those with
    the reference exactly on a midpoint, ``max_tie_distance`` the farthest any of them
    lies from a midpoint of its binade, in ulps (0: all exactly on midpoints; a tiny value:
    all near ties), ``first`` the first differing indices), ``seconds``.

    Per configuration (``rows[label]``), the categories partition the inputs:
    ``exact`` (the result equals the fp64 reference), ``rounded`` (not exact, but the
    reference rounded once to ``dtype``), ``one_ulp`` / ``over_one_ulp`` (one step /
    more steps of ``dtype`` from that correctly rounded value), ``nan_mismatch`` (NaN on
    one side only); ``correctly_rounded`` = exact + rounded. ``hist`` counts the ulp
    errors ``|x - r| / ulp(r)`` in the bins of :data:`HIST_EDGES`; ``max_ulp_error`` and
    ``max_error_index`` (the smallest index reaching it) and ``max_error_inputs``.

    >>> import castlab as cl, castlab.numerics as nm
    >>> r = nm.exhaustive(cl.exp, [nm.Enumeration.bits(cl.bfloat16, 0x3F80, 0x4000)],
    ...                   [("fused", "portable")])
    >>> row = r.rows["fused/portable"]
    >>> r.n, row["correctly_rounded"], row["max_ulp_error"] <= 0.5
    (128, 128, True)
    >>> r.inputs_at(row["max_error_index"])[0] >= 1.0
    True
    """

    def __init__(self, raw: dict, enums: list, configs: list, out_dt: dtype, total: int,
                 begin: int, ref_math: str, seconds: float, first_k: int):
        self.inputs = enums
        self.dtype = out_dt
        self.total = total
        self.begin = begin
        self.n = int(raw["n"])
        self.ties = int(raw["ties"])
        self.near_ties = int(raw["near_ties"])
        self.ref = f"fp64/{ref_math}"
        self.seconds = seconds
        self.first_k = first_k
        self.configs = [c[0] for c in configs]
        self.rows: dict = {}
        for label, c in zip(self.configs, raw["configs"]):
            cnt = dict(zip(_CATEGORIES, (int(v) for v in c["counts"])))
            row = dict(cnt)
            row["correctly_rounded"] = cnt["exact"] + cnt["rounded"]
            row["hist"] = [int(v) for v in c["hist"]]
            has = c["max_error"] >= 0
            row["max_ulp_error"] = float(c["max_error"]) if has else None
            row["max_error_index"] = int(c["max_index"]) if has else None
            row["max_error_inputs"] = self.inputs_at(int(c["max_index"])) if has else None
            self.rows[label] = row
        self.pairs: dict = {}
        q = 0
        for i, a in enumerate(self.configs):
            for b in self.configs[i + 1:]:
                p = raw["pairs"][q]
                self.pairs[(a, b)] = {"differ": int(p["differ"]),
                                      "differ_at_ties": int(p["differ_at_ties"]),
                                      "max_tie_distance": (float(p["max_tie_distance"])
                                                           if p["differ"] else None),
                                      "first": [int(k) for k in p["first"]]}
                q += 1

    # -- inputs --------------------------------------------------------------------
    def bits_at(self, index: int) -> tuple:
        """The bit pattern of every input at `index` of the cross product."""
        if not 0 <= index < self.total:
            raise IndexError(f"index {index} outside [0, {self.total})")
        out = []
        for e in reversed(self.inputs):
            index, k = divmod(index, len(e))
            out.append(e.bits_at(k))
        return tuple(reversed(out))

    def inputs_at(self, index: int) -> tuple:
        """The value of every input at `index` (Python floats)."""
        vals = []
        for e, b in zip(self.inputs, self.bits_at(index)):
            f = _fmt(e.dtype)
            vals.append(float(np.array([b], dtype=f.uint).view(e.dtype.numpy)[0]))
        return tuple(vals)

    def differing(self, a: str, b: str) -> list:
        """The first differing inputs of configurations `a` and `b`: a list of dicts
        with the index, the inputs' bits (hex) and values."""
        p = self.pairs.get((a, b)) or self.pairs.get((b, a))
        if p is None:
            raise KeyError(f"no pair ({a!r}, {b!r}); configurations: {self.configs}")
        out = []
        for k in p["first"]:
            bits = self.bits_at(k)
            out.append({"index": k,
                        "bits": [f"0x{v:0{e.dtype.bits // 4}X}" for e, v in zip(self.inputs, bits)],
                        "inputs": list(self.inputs_at(k))})
        return out

    # -- output --------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Everything, JSON-ready (pairs keyed "a | b")."""
        return {
            "inputs": [repr(e) for e in self.inputs], "dtype": self.dtype.name,
            "total": self.total, "begin": self.begin, "n": self.n, "ref": self.ref,
            "ties": self.ties, "near_ties": self.near_ties, "seconds": self.seconds,
            "hist_edges": list(HIST_EDGES),
            "configs": {k: dict(v) for k, v in self.rows.items()},
            "pairs": {f"{a} | {b}": dict(p, first_inputs=self.differing(a, b))
                      for (a, b), p in self.pairs.items()},
        }

    def to_json(self, path: str | None = None) -> str:
        """The result as JSON text (also written to `path` when given)."""
        text = json.dumps(self.to_dict(), indent=1, allow_nan=True)
        if path is not None:
            with open(path, "w") as fh:
                fh.write(text + "\n")
        return text

    def to_csv(self, path: str | None = None) -> str:
        """One row per configuration: counts, max error and histogram (CSV text, also
        written to `path` when given)."""
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["config", "n", *_CATEGORIES, "correctly_rounded", "max_ulp_error",
                    "max_error_index", *[f"hist_{i}" for i in range(_HIST_BINS)]])
        for k, r in self.rows.items():
            w.writerow([k, self.n, *[r[c] for c in _CATEGORIES], r["correctly_rounded"],
                        r["max_ulp_error"], r["max_error_index"], *r["hist"]])
        if path is not None:
            with open(path, "w", newline="") as fh:
                fh.write(buf.getvalue())
        return buf.getvalue()

    def _table(self) -> tuple:
        heads = ["config", "correctly rounded", "exact", "1 ulp", ">1 ulp", "NaN mismatch",
                 "max ulp error", "worst inputs"]
        rows = []
        for k, r in self.rows.items():
            pct = 100.0 * r["correctly_rounded"] / self.n if self.n else 100.0
            worst = r["max_error_inputs"]
            rows.append([k, f"{r['correctly_rounded']} ({pct:.4g}%)", r["exact"], r["one_ulp"],
                         r["over_one_ulp"], r["nan_mismatch"], r["max_ulp_error"],
                         "-" if worst is None else ", ".join(f"{v:.6g}" for v in worst)])
        pheads = ["pair", "differ", "at midpoint ties", "max distance from a midpoint (ulps)",
                  "first differing inputs"]
        prows = []
        for (a, b), p in self.pairs.items():
            first = "; ".join(",".join(d["bits"]) for d in self.differing(a, b)[:3])
            prows.append([f"{a} vs {b}", p["differ"], p["differ_at_ties"], p["max_tie_distance"],
                          first or "-"])
        return heads, rows, pheads, prows

    def _caption(self) -> str:
        scope = "all" if self.n == self.total else f"{self.n} of {self.total}"
        ins = " x ".join(e.label for e in self.inputs)
        return (f"castlab exhaustive: {scope} inputs ({ins}) -> {self.dtype.name}; reference "
                f"{self.ref}; {self.ties} references on a midpoint, {self.near_ties} within 256 fp64 "
                f"ulps of one (labels not certified); {self.seconds:.3g} s")

    def __str__(self) -> str:
        heads, rows, ph, pr = self._table()
        s = self._caption() + "\n" + _text_table(heads, [[_fmt_num(c) for c in r] for r in rows])
        if pr:
            s += "\n" + _text_table(ph, [[_fmt_num(c) for c in r] for r in pr])
        return s

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        heads, rows, ph, pr = self._table()
        s = _html_table(heads, [[_fmt_num(c) for c in r] for r in rows], self._caption())
        if pr:
            s += _html_table(ph, [[_fmt_num(c) for c in r] for r in pr], "pairs")
        return s


# ================================================================ the entry point

def _kernel_source(fn: Any, inputs: list, configs: Any, ref_math: Any = "portable",
                   first_k: int = 10) -> str:
    """The CUDA source of the GPU kernel for this call, from Plans lowered on the CPU
    (no GPU needed: tests compile it with NVRTC)."""
    enums = [_as_enumeration(x) for x in inputs]
    cfgs = _configs(configs)
    jf, tr, xs = _trace(fn, enums, 8, "cpu")
    plans, ref_plan, out_dt = _plans(jf, tr, xs, cfgs, as_math(ref_math))
    return _C._exhaustive_cuda_source([e._spec() for e in enums], out_dt.name, first_k, plans,
                                      ref_plan)



def _checked_seconds(v: Any) -> float:
    """max_seconds: a positive finite number (not NaN, inf, a bool or a string)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"exhaustive: max_seconds must be a number of seconds, got "
                        f"{type(v).__name__} {v!r}")
    f = float(v)
    if not math.isfinite(f) or f <= 0:
        raise ValueError(f"exhaustive: max_seconds must be a positive finite number of seconds "
                         f"(allow_long=True for no limit), got {v!r}")
    return f


def exhaustive(fn: Any, inputs: Any, configs: Any, *, ref: str = "fp64",
               ref_math: Any = "portable", first_k: int = 10, start: int = 0,
               stop: int | None = None, device: Any = "cpu", allow_long: bool = False,
               max_seconds: float = 120.0, progress: Any = None) -> Exhaustive:
    """Run `fn` on every input of the cross product of `inputs` under each configuration
    of `configs` and against the fp64 reference, and count how the results compare.

    inputs: one enumeration per argument of `fn`: an :class:`Enumeration`, a dtype (all
    its bit patterns) or a tensor (its values); the last varies fastest, so input tuple
    ``i`` of ``(a, b)`` is ``(a[i // len(b)], b[i % len(b)])``.
    configs: (policy, math) pairs, ``"policy/math"`` strings or policies (with
    torch_eager math). ref: "fp64", computed with `ref_math` ("portable": the same bits
    on every device). start, stop: visit only indices [start, stop) of the product.
    first_k: differing inputs kept per pair of configurations.

    device: "cpu" (chunks of inputs generated in C++, the CPU executor, the thread pool)
    or "cuda[:i]" (one generated kernel makes every input from its index and reduces the
    statistics on the device; no input tensor exists). With portable math both give the
    same counts.

    The CPU refuses runs estimated (from the first chunk) to take longer than
    `max_seconds` unless `allow_long` (:class:`ExhaustiveTooLong`); restrict a range or
    sample an input instead.

    progress: None, or a function called as ``progress(done, n, seconds)`` while the run
    goes on (``done`` of the ``n`` inputs finished after ``seconds``): on the CPU after the
    first chunk (the one the estimate comes from) and then after each further part of
    about a hundredth of the run; on the GPU before and after its one kernel. The
    statistics are those of a run without it.

    >>> import castlab as cl
    >>> from castlab import numerics as nm
    >>> r = nm.exhaustive(lambda x: cl.silu(x) * x, [cl.bfloat16],
    ...                   [("eager", "portable"), ("fused", "portable")])
    >>> r.n, r.rows["fused/portable"]["correctly_rounded"] > r.rows["eager/portable"]["correctly_rounded"]
    (65536, True)
    """
    dev = as_device(device)
    if ref != "fp64":
        raise ValueError(f"exhaustive: ref must be 'fp64', got {ref!r}")
    if isinstance(inputs, (Enumeration, str, dtype)) or not isinstance(inputs, (list, tuple)):
        inputs = [inputs]
    if not inputs:
        raise ValueError("exhaustive: inputs is empty")
    enums = [_as_enumeration(x) for x in inputs]
    cfgs = _configs(configs)
    rmath = as_math(ref_math)
    if (isinstance(first_k, (bool, np.bool_)) or not isinstance(first_k, (int, np.integer))
            or not 0 <= first_k < 2**31):
        raise ValueError(f"exhaustive: first_k must be an int in [0, 2**31), got {first_k!r}")
    first_k = int(first_k)
    max_seconds = _checked_seconds(max_seconds)
    if not isinstance(allow_long, (bool, np.bool_)):
        raise TypeError(f"exhaustive: allow_long must be True or False, got {allow_long!r}")
    start = _checked_int(start, "start", 0, "exhaustive")
    if stop is not None:
        stop = _checked_int(stop, "stop", 0, "exhaustive")
    total = 1
    for e in enums:
        total *= len(e)
    if total >= 1 << 64:
        raise ValueError(f"exhaustive: the cross product has {total} inputs, more than a "
                         "64-bit index can count")
    stop = total if stop is None else int(stop)
    start = int(start)
    if not 0 <= start < stop <= total:
        raise ValueError(f"exhaustive: index range [{start}, {stop}) is empty or outside "
                         f"[0, {total})")
    n = stop - start
    chunk = min(n, _CHUNK)
    jf, tr, xs = _trace(fn, enums, chunk if not dev.is_cuda else min(n, 1024), str(dev))
    plans, ref_plan, out_dt = _plans(jf, tr, xs, cfgs, rmath)
    specs = [e._spec() for e in enums]
    if progress is not None and not callable(progress):
        raise TypeError(f"exhaustive: progress must be None or a function (done, n, seconds), "
                        f"got {progress!r}")
    t0 = time.perf_counter()
    if dev.is_cuda:
        if progress is not None:
            progress(0, n, 0.0)
        raw = _C._exhaustive_cuda(specs, out_dt.name, start, stop, first_k, plans, ref_plan,
                                  dev.index)
        seconds = time.perf_counter() - t0
        if progress is not None:
            progress(n, n, seconds)
        return Exhaustive(raw, enums, cfgs, out_dt, total, start, rmath.name, seconds, first_k)

    def run(b: int, e: int) -> dict:
        return _C._exhaustive_cpu(specs, out_dt.name, b, e, first_k, chunk, plans, ref_plan)

    first = min(stop, start + chunk)
    raw = run(start, first)
    dt = time.perf_counter() - t0
    estimate = dt * n / (first - start)
    if estimate > max_seconds and not allow_long:
        raise ExhaustiveTooLong(
            f"exhaustive: {n} inputs would take about {estimate:.0f} s on this CPU "
            f"({(first - start) / dt:.3g} inputs/s measured on the first {first - start}); "
            "pass allow_long=True (castlab exhaustive --allow-long), a smaller range "
            "(start/stop) or a sampled input (Enumeration.sample)",
            n=n, estimate=estimate, rate=(first - start) / dt, measured=first - start,
            max_seconds=max_seconds)
    if progress is None:
        if first < stop:
            raw = _merge(raw, run(first, stop), first_k)
    else:
        progress(first - start, n, time.perf_counter() - t0)
        # the rest in parts of about a hundredth (whole chunks), merged as one range
        part = max(chunk, -(-(stop - first) // 100 // chunk) * chunk)
        b = first
        while b < stop:
            e = min(stop, b + part)
            raw = _merge(raw, run(b, e), first_k)
            b = e
            progress(b - start, n, time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    return Exhaustive(raw, enums, cfgs, out_dt, total, start, rmath.name, seconds, first_k)
