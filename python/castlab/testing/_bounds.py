"""Proven worst cases: :func:`bounds` runs a chain or library preset and its references on
every input of an input space (:mod:`._space`), chunk by chunk on the device, and keeps the
worst case against each reference."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

from .. import _C, cuda
from .._device import as_device
from ..numerics import Enumeration
from ..numerics._exhaustive import _as_enumeration
from ..numerics._tables import _fmt_num, _html_table, _text_table
from ._space import Space, check_dtype, elementwise_space, rope_space
from ._stats import Namespace, chunk_stats
from ._target import Target, flat, reference, subject

__all__ = ["bounds", "Bounds", "default_space", "chunks", "cache_dir", "check_device",
           "DEFAULT_AGAINST"]

#: What :func:`bounds` measures against by default.
DEFAULT_AGAINST = ("fp64", "torch_eager", "inductor")
#: Input tuples per chunk, by device kind.
_CHUNK = {"cpu": 1 << 20, "cuda": 1 << 26}
#: Input tuples a default space visits, by device kind: on the GPU all 2**32 pairs of a
#: 16-bit dtype; on the CPU every value of the first input times a sample of the others.
DEFAULT_BUDGET = {"cpu": 1 << 22, "cuda": 1 << 32}


#: Where a chunk's inputs are made and its statistics reduced: None -- on the device with
#: PyTorch on a GPU, with NumPy on the host for the CPU. True forces the GPU's way on any
#: device (the tests run it on the CPU: same bits, same counts).
ON_DEVICE: bool | None = None


def cache_dir() -> str | None:
    """Where bounds are cached: ``$CASTLAB_BOUNDS_DIR`` (set but empty: no disk cache),
    else ``$XDG_CACHE_HOME/castlab/bounds`` or ``~/.cache/castlab/bounds`` (next to the
    kernel cache, not inside it). Created 0700."""
    d = os.environ.get("CASTLAB_BOUNDS_DIR")
    if d is not None:
        return d or None
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "castlab", "bounds")


def check_device(device: Any, what: str):
    """The device, or a RuntimeError naming why a GPU cannot be used."""
    dev = as_device(device)
    if dev.is_cuda and not cuda.is_available():
        raise RuntimeError(f"{what}: device {dev}: no usable GPU for castlab "
                           f"({cuda.unavailable_reason()})")
    return dev


def default_space(t: Target, dt: Any, device: Any = "cpu", *, values: str = "all",
                  sample: int | None = None, seed: int = 0,
                  inputs: Sequence[Enumeration] | None = None) -> Space:
    """The input space of target `t` in dtype `dt` on `device` (see :func:`bounds`)."""
    d = check_dtype(dt, "bounds")
    if values not in ("all", "finite"):
        raise ValueError(f"values must be 'all' or 'finite', got {values!r}")
    kind = "cuda" if as_device(device).is_cuda else "cpu"
    budget = DEFAULT_BUDGET[kind] if sample is None else _checked_count(sample, "sample")
    if inputs is not None:
        inputs = [_as_enumeration(x) for x in inputs]
    if t.family == "rope":
        return rope_space(t.arg_names, d, values=values, budget=budget, seed=seed, inputs=inputs)
    return elementwise_space(t.arg_names, d, values=values, budget=budget, seed=seed,
                             first=t.first, inputs=inputs)


def _checked_count(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{what} must be a positive int (input tuples), got {v!r}")
    return int(v)


def chunks(space: Space, device: Any, on_device: bool | None = None,
           step: int | None = None) -> Iterator[tuple]:
    """``(lo, hi, args)`` for each chunk of the space: input tuples [lo, hi) as the op's
    arguments on `device`, `step` tuples a chunk (default :data:`_CHUNK`'s). On a GPU the
    inputs are made on the device from their indices (PyTorch); `on_device` forces either
    way (the same bits)."""
    dev = str(as_device(device))
    cuda_dev = dev.startswith("cuda")
    step = step or _CHUNK["cuda" if cuda_dev else "cpu"]
    on = (cuda_dev if ON_DEVICE is None else ON_DEVICE) if on_device is None else on_device
    n = space.size
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        yield lo, hi, space.chunk(lo, hi, dev, on)


def out_to_input(k: int, lo: int, n: int, m: int, blocks: int) -> tuple:
    """Output element `k` of a chunk of `n` input tuples starting at `lo`, with `m` output
    elements in `blocks` concatenated outputs: ``(input tuple, output number, element of
    that output in a call on this one input)``."""
    per = m // blocks
    q = max(1, per // n)          # output elements per input tuple (2 for a RoPE pair)
    e = k % per
    return lo + e // q, k // per, e % q


class _Worst:
    """Running worst case against one reference."""

    def __init__(self, label: str, exact: bool):
        self.label, self.exact = label, exact
        self.n = self.differ = self.nan = self.over = 0
        self.max_ulp = self.max_abs = self.max_rel = 0.0
        self.worst: tuple | None = None   # (input index, output number)

    def add(self, st: dict, at: tuple) -> None:
        self.n += st["n"]
        self.differ += st["differ"]
        self.nan += st["nan_mismatches"]
        self.over += st["overflows"]
        if self.worst is None or st["max_ulp"] > self.max_ulp:
            self.worst = at
            self.max_ulp = st["max_ulp"]
        self.max_abs = max(self.max_abs, st["max_abs"])
        self.max_rel = max(self.max_rel, st["max_rel"])


class Bounds:
    """The result of :func:`bounds`: per reference, the worst case over the input space.

    ``rows[label]``: ``elements`` (output elements compared), ``differ`` (elements not
    equal to the reference; against ``fp64``: not correctly rounded), ``differ_share``,
    ``nan_mismatches``, ``max_ulp`` (against fp64: the largest ``|x - r| / ulp(r)``;
    against a configuration: the largest distance in ulps of the reference's value),
    ``max_abs_error``, ``max_rel_error`` (``|x - r| / |r|``) and ``worst_inputs`` (the
    input tuple reaching ``max_ulp``, by name: value and bits). ``exhaustive``: whether
    every input of the space's dtypes was visited (else ``space`` says what was
    sampled). ``cached``: read from the disk cache.
    """

    def __init__(self, d: dict, cached: bool = False):
        self.__dict__.update(d)
        self.cached = cached

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "cached"}

    def to_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)

    @staticmethod
    def headers() -> list:
        return ["subject", "dtype", "against", "max ulp", "differ", "share", "max abs",
                "max rel", "NaN mismatch", "overflows", "worst input"]

    def table_rows(self) -> list:
        out = []
        for lab, r in self.rows.items():
            w = r["worst_inputs"]
            out.append([self.subject, self.dtype, lab, r["max_ulp"], r["differ"],
                        r["differ_share"], r["max_abs_error"], r["max_rel_error"],
                        r["nan_mismatches"], r["overflows"],
                        ", ".join(f"{k}={v[1]}" for k, v in w.items()) if w else "-"])
        return out

    def __str__(self) -> str:
        head = (f"castlab bounds: {self.subject} in {self.dtype} on {self.device}, "
                f"{self.space}{'' if self.exhaustive else ' (sampled)'}")
        return head + "\n" + _text_table(self.headers(), [[_fmt_num(v) for v in r]
                                                          for r in self.table_rows()])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return _html_table(self.headers(), self.table_rows(), caption=self.space)


def _key(s: Target, refs: list, dt: str, space: Space) -> str:
    blob = json.dumps([_C.__version__, s.key, dt, [r.key for r in refs], space.key()],
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _cached(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _store(path: str, d: dict) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(d, f)
    os.replace(tmp, path)


def bounds(chain_or_preset: Any, dtype: Any = "bfloat16",
           against: Sequence[Any] = DEFAULT_AGAINST, *, policy: Any = None, math: Any = None,
           device: Any = "cpu", values: str = "all", sample: int | None = None, seed: int = 0,
           inputs: Sequence[Any] | None = None, cache: bool = True) -> Bounds:
    """The proven worst case of a chain or library preset against each reference, over
    every input of an input space.

    chain_or_preset: a library preset (``cl.library("liger")["swiglu"]`` or
    ``"liger:swiglu"``), a preset op (``"swiglu"``, ``"rope"``...: Hugging Face eager),
    a one-argument op (``"exp"``) or a castlab function of elementwise tensors (run under
    `policy`/`math`, default ``cl.jit``'s: eager, torch_eager).
    against: ``"fp64"`` (the exact value of the same formula, rounded once: the error
    of the kernel), ``"torch_eager"`` (PyTorch eager), ``"inductor"`` (torch.compile),
    a library name, ``"policy/math"``, an OpPreset or a castlab function.

    The space: a one-argument op visits every pattern of a 16-bit dtype (65,536; float32:
    a sample of 65,536). Two or more arguments: the first (SwiGLU's gate ``a``) takes
    every pattern and the others as many sampled patterns as `sample` input tuples allow
    (default: 2**32 on a GPU, which is every pair of a 16-bit dtype, and 2**22 on the CPU).
    RoPE visits ``x1`` (every pattern) x ``x2`` x the angle (sampled from Qwen2's). The
    result says what was sampled and with which seed. `values="finite"` leaves out NaN
    and infinity; `inputs` (Enumerations, dtypes or tensors, one per free scalar) sets
    the space by hand.

    Results are cached on disk (:func:`cache_dir`; ``CASTLAB_BOUNDS_DIR``) by the chain's
    source, its policy and math, the references', the dtype, the space and castlab's
    version; `cache=False` recomputes and stores nothing.

    >>> import castlab as cl
    >>> from castlab.testing import bounds
    >>> b = bounds("silu", "bfloat16", cache=False)
    >>> b.exhaustive, b.inputs, b.rows["torch_eager"]["differ"]
    (True, 65536, 0)
    """
    dev = check_device(device, "bounds")
    s = subject(chain_or_preset, policy, math)
    if isinstance(against, (str, Target)) or callable(against):
        against = [against]
    refs = [reference(s, a) for a in against]
    if not refs:
        raise ValueError("against is empty")
    labels = [r.label for r in refs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"against names a reference twice: {labels}")
    space = default_space(s, dtype, dev, values=values, sample=sample, seed=seed, inputs=inputs)
    where = cache_dir() if cache else None
    path = None if where is None else os.path.join(where, _key(s, refs, space.dtype.name,
                                                               space) + ".json")
    if path is not None:
        hit = _cached(path)
        if hit is not None:
            return Bounds(hit, cached=True)
    t0 = time.perf_counter()
    xp = Namespace("torch" if (dev.is_cuda if ON_DEVICE is None else ON_DEVICE) else "numpy")
    worst = [_Worst(r.label, r.label == "fp64") for r in refs]
    for lo, hi, args in chunks(space, dev):
        raw = s.run(s.args(args))
        got = flat(raw)
        blocks = len(raw) if isinstance(raw, (tuple, list)) else 1
        for r, w in zip(refs, worst):
            want = flat(r.run(r.args(args)))
            st = chunk_stats(got, want, w.exact, xp)
            w.add(st, out_to_input(st["worst"], lo, hi - lo, got.numel(), blocks)[:2])
    rows = {}
    for w in worst:
        rows[w.label] = {
            "elements": w.n, "differ": w.differ, "differ_share": w.differ / w.n if w.n else 0.0,
            "nan_mismatches": w.nan, "overflows": w.over, "max_ulp": w.max_ulp, "max_abs_error": w.max_abs,
            "max_rel_error": w.max_rel,
            "worst_inputs": space.inputs_at(w.worst[0]) if w.worst else {},
            "worst_output": w.worst[1] if w.worst else None}
    d = {"subject": s.label, "dtype": space.dtype.name, "device": str(dev),
         "space": space.description, "exhaustive": space.exhaustive, "inputs": space.size,
         "seed": seed, "values": values, "castlab_version": _C.__version__, "rows": rows,
         "seconds": time.perf_counter() - t0}
    if path is not None:
        try:
            _store(path, d)
        except OSError as e:   # a read-only home: the bound stands, uncached
            d["cache_error"] = str(e)
    return Bounds(d)
