"""Input spaces: which inputs a bound or a kernel check visits, and how a chunk of them
becomes the arguments of an op.

A space is the cross product of one :class:`~castlab.numerics.Enumeration` per free
scalar (the last varies fastest, as in :func:`castlab.numerics.exhaustive`), walked by
index in chunks. Elementwise ops take one scalar per argument. RoPE takes four numbers per
output pair -- the pair ``(x1, x2)`` and the angle -- so its space is ``x1 x x2 x angle``
and a chunk of ``n`` triples becomes ``x`` [1, 1, n, 2] with a cos/sin cache (or the fp32
angles) [n, 2], the layout of a head dimension of 2: every library's formula rotates the
pair exactly as it does in a wide head.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .._creation import from_numpy, tensor
from .._dlpack import from_dlpack
from .._dtype import as_dtype, dtype, float32
from ..numerics import Enumeration
from ..numerics._formats import _fmt

__all__ = ["Space", "elementwise_space", "rope_space", "check_dtype", "DTYPES", "QWEN2_ANGLES"]

#: The dtypes castlab.testing visits (16-bit: every pattern; float32: sampled).
DTYPES = ("bfloat16", "float16", "float32")


def _qwen2_angles() -> np.ndarray:
    """Every RoPE angle Qwen2 uses (head dim 128, theta 1e6, positions 0..32767), as
    Hugging Face computes them in fp32, sorted and distinct."""
    inv = (1.0 / (1e6 ** (np.arange(0, 128, 2, dtype=np.int64).astype(np.float32) / 128))
           ).astype(np.float32)
    t = np.arange(32768, dtype=np.float32)
    return np.unique(np.outer(t, inv).astype(np.float32).reshape(-1))


#: The angles RoPE bounds sample from (fp32; see :func:`rope_space`).
QWEN2_ANGLES = "Qwen2's RoPE angles (head dim 128, theta 1e6, positions 0-32767, fp32)"


@dataclasses.dataclass
class Space:
    """The inputs a check visits: ``enums`` (one Enumeration per free scalar), ``names``
    (their names), ``outputs_per_input`` (output elements per input tuple: 2 for a RoPE
    pair), ``description`` (one line: what was visited, sampled parts with their seeds)
    and ``build(bits, device)``: the op's arguments for a chunk of input tuples, from one
    array of bit patterns (or fp32 angles) per free scalar."""

    enums: list
    names: tuple
    dtype: dtype
    description: str
    build: Callable
    outputs_per_input: int = 1
    exhaustive: bool = True
    _tables: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def size(self) -> int:
        return math.prod(len(e) for e in self.enums)

    def key(self) -> list:
        """What identifies the space (the disk cache's key)."""
        return [self.description, [e.label for e in self.enums],
                [_enum_digest(e) for e in self.enums]]

    def chunk_bits(self, lo: int, hi: int) -> list:
        """One array of bit patterns per free scalar for input tuples [lo, hi) (NumPy)."""
        return [_bits_at(e, d) for e, d in zip(self.enums, self._digits_np(lo, hi))]

    def _digits_np(self, lo: int, hi: int) -> list:
        idx = np.arange(lo, hi, dtype=np.uint32 if hi <= 1 << 32 else np.int64)
        return _split_index(idx, [len(e) for e in self.enums])

    def chunk(self, lo: int, hi: int, device: str, on_device: bool = False) -> Any:
        """The arguments for input tuples [lo, hi) on `device`. With `on_device`, the
        inputs are made there from their indices with PyTorch (no host arrays, no copy:
        the GPU path); else with NumPy on the host and copied. Both give the same bits."""
        if not on_device:
            digits = self._digits_np(lo, hi)
            vals = [_values(_bits_at(e, d), e.dtype) for e, d in zip(self.enums, digits)]
            return self.build(Arrays(np, vals, digits, self, "cpu"), device)
        import torch

        grid = self.views(lo, hi, device)
        if grid is not None:   # whole rows: each value a broadcast of its table, written once
            # a fresh tensor each (a reshape could alias the cached table)
            vals = [torch.empty(v.shape, dtype=v.dtype, device=device).copy_(v).view(-1)
                    for v in grid]
            return self.build(Arrays(torch, vals, lambda: self._grid_digits(lo, hi, device),
                                     self, device), device)
        digits = _split_index(torch.arange(lo, hi, dtype=torch.int64, device=device),
                              [len(e) for e in self.enums])
        vals = [self._table_torch(k, device)[d] for k, d in enumerate(digits)]
        return self.build(Arrays(torch, vals, digits, self, device), device)

    def _grid(self, lo: int, hi: int) -> tuple | None:
        """Input tuples [lo, hi) as a grid, when they are whole rows of the first free
        scalar: ``(first row, grid shape)``; else None."""
        inner = math.prod(len(e) for e in self.enums[1:])
        if lo % inner or hi % inner or hi <= lo:
            return None
        return lo // inner, ((hi - lo) // inner, *(len(e) for e in self.enums[1:]))

    def views(self, lo: int, hi: int, device: str) -> list | None:
        """The values of input tuples [lo, hi), one broadcast view (stride 0 where a value
        repeats) per free scalar in the grid's shape, reading only the enumerations'
        tables (PyTorch on `device`); None unless the tuples are whole rows of the first
        free scalar. What a chunk holds, without making it: a check compares with it."""
        g = self._grid(lo, hi)
        if g is None:
            return None
        row, shape = g
        out = []
        for k in range(len(self.enums)):
            tab = self._table_torch(k, device)
            if k == 0:
                tab = tab[row:row + shape[0]]
            vshape = [1] * len(shape)
            vshape[k] = shape[k]
            out.append(tab.view(vshape).expand(shape))
        return out

    def _grid_digits(self, lo: int, hi: int, device: str) -> list:
        import torch

        row, shape = self._grid(lo, hi)
        out = []
        for k in range(len(shape)):
            vshape = [1] * len(shape)
            vshape[k] = shape[k]
            d = torch.arange(row if k == 0 else 0, (row if k == 0 else 0) + shape[k],
                             dtype=torch.int64, device=device)
            out.append(d.view(vshape).expand(shape).reshape(-1))
        return out

    def _table_torch(self, k: int, device: str) -> Any:
        """Enumeration k's values as a typed torch tensor on `device` (made once)."""
        key = (k, device)
        t = self._tables.get(key)
        if t is None:
            import torch

            e = self.enums[k]
            t = torch.from_dlpack(from_numpy(np.ascontiguousarray(
                _values(_table_of(e), e.dtype))))
            t = self._tables[key] = t.to(device)
        return t

    def inputs_at(self, i: int) -> dict:
        """The input tuple number `i`, by name: ``{name: (value, hex bits)}``."""
        bits = self.chunk_bits(i, i + 1)
        out = {}
        for name, e, b in zip(self.names, self.enums, bits):
            v = np.array([b[0]], dtype=np.uint64).astype(_fmt(e.dtype).uint).view(e.dtype.numpy)
            out[name] = (float(v[0].astype(np.float64)),
                         f"0x{int(b[0]):0{e.dtype.bits // 4}X}")
        return out


def _split_index(idx: Any, sizes: list) -> list:
    """Input-tuple indices (a NumPy or torch integer array) as one position per free scalar,
    the last varying fastest. A power-of-two size (every 16-bit enumeration) takes a mask
    and a shift, not an integer division (5x the whole check's host time on the CPU)."""
    out: list = [None] * len(sizes)
    for k in range(len(sizes) - 1, -1, -1):
        n = sizes[k]
        last = k == 0
        if n & (n - 1) == 0:
            out[k] = idx & (n - 1)
            if not last:
                idx = idx >> (n.bit_length() - 1)
        else:
            out[k] = idx % n
            if not last:
                idx = idx // n
    return out


class Arrays:
    """A chunk's inputs as typed arrays of one library (NumPy on the host, or PyTorch on
    the device): ``vals[k]`` the values of free scalar k, ``digits[k]`` their positions
    in its enumeration (made when first read, where `digits` is given as a function)."""

    def __init__(self, lib: Any, vals: list, digits: Any, space: Any, device: str):
        self.lib, self.vals, self.space, self.device = lib, vals, space, device
        self._digits = digits

    @property
    def digits(self) -> list:
        if callable(self._digits):
            self._digits = self._digits()
        return self._digits

    def tensor(self, a: Any):
        """A castlab tensor of array `a` on the chunk's device (a view where possible)."""
        if self.lib is np:
            return from_numpy(np.ascontiguousarray(a))
        return from_dlpack(a.contiguous())


def _table_of(e: Enumeration) -> np.ndarray:
    """Every bit pattern of an enumeration, in order (a range made on demand)."""
    if e.table is not None:
        return np.asarray(e.table, dtype=np.uint64)
    return np.arange(e.lo, e.lo + e.count, dtype=np.uint64)


def _bits_at(e: Enumeration, d: np.ndarray) -> np.ndarray:
    """The bit patterns at positions `d` of an enumeration (a range: no table to read)."""
    if e.table is None:
        return d + e.lo if e.lo else d
    return _table_of(e)[d]


def _enum_digest(e: Enumeration) -> str:
    if e.table is None:
        return f"{e.lo}+{e.count}"
    return hashlib.sha256(np.ascontiguousarray(e.table).tobytes()).hexdigest()[:16]


def _values(bits: np.ndarray, dt: dtype) -> np.ndarray:
    return bits.astype(_fmt(dt).uint).view(dt.numpy)


def _to(t: Any, device: str):
    return t if str(t.device) == device or device == "cpu" and not t.is_cuda else t.to(device)


def check_dtype(dt: Any, what: str) -> dtype:
    d = as_dtype(dt)
    if d.name not in DTYPES:
        raise ValueError(f"{what}: dtype must be one of {', '.join(DTYPES)}, got {d.name}")
    return d


def _first(dt: dtype, values: str, budget: int, seed: int) -> Enumeration:
    """The input that visits every value: all patterns of a 16-bit dtype (or every finite
    one); float32 has 2**32, so a sample of at most `budget` of them."""
    if dt.bits <= 16:
        return Enumeration.all(dt) if values == "all" else Enumeration.finite(dt)
    n = min(budget, 1 << 16)
    return Enumeration.sample(dt, n, seed=seed, finite=values == "finite")


def _rest(dt: dtype, values: str, per: int, seed: int, k: int) -> Enumeration:
    if dt.bits <= 16:
        whole = Enumeration.all(dt) if values == "all" else Enumeration.finite(dt)
        if per >= len(whole):
            return whole
    return Enumeration.sample(dt, per, seed=seed + k, finite=values == "finite")


def _per_rest(first: int, budget: int, k: int) -> int:
    """Samples per further input: the k-th root of what the budget leaves per first value."""
    if k == 0:
        return 0
    left = max(1, budget // first)
    return max(1, int(math.floor(left ** (1.0 / k) + 1e-9)))


def _whole(e: Enumeration) -> bool:
    """Does the enumeration visit every pattern of its dtype (Enumeration.all), or every
    finite value (Enumeration.finite)?"""
    if e.table is None:
        return e.lo == 0 and e.count == 1 << e.dtype.bits
    return e.dtype.bits <= 16 and np.array_equal(e.table, Enumeration.finite(e.dtype).table)


def _describe(names: tuple, enums: list) -> str:
    parts = [f"{n}: {e.label}" for n, e in zip(names, enums)]
    total = math.prod(len(e) for e in enums)
    return f"{total:,} inputs ({'; '.join(parts)})"


def elementwise_space(names: tuple, dt: dtype, *, values: str = "all", budget: int = 1 << 22,
                      seed: int = 0, first: int = 0, inputs: list | None = None) -> Space:
    """Elementwise op of ``len(names)`` arguments of dtype `dt`: argument `first` takes
    every pattern (or every finite value), the others as many sampled patterns each as
    `budget` allows (every pattern when the budget covers them: all 2**32 pairs of a
    16-bit dtype with a budget of 2**32). `inputs` (Enumerations, one per argument)
    replaces the choice."""
    k = len(names)
    if inputs is not None:
        enums = list(inputs)
        if len(enums) != k:
            raise ValueError(f"inputs: {len(enums)} enumerations for {k} arguments "
                             f"({', '.join(names)})")
    else:
        f = _first(dt, values, budget, seed)
        per = _per_rest(len(f), budget, k - 1)
        enums = [f if i == first else _rest(dt, values, per, seed, i) for i in range(k)]
    exhaustive = all(_whole(e) for e in enums)

    def build(ch: Arrays, device: str) -> tuple:
        return tuple(_to(ch.tensor(v), device) for v in ch.vals)

    return Space(enums, tuple(names), dt, _describe(names, enums), build,
                 exhaustive=exhaustive)


def rope_space(names: tuple, dt: dtype, *, values: str = "all", budget: int = 1 << 22,
               seed: int = 0, inputs: list | None = None) -> Space:
    """RoPE, one output pair per input triple ``(x1, x2, angle)``: ``x1`` every pattern,
    ``x2`` and the angle (from :data:`QWEN2_ANGLES`) sampled within `budget`. `names`
    are the subject's arguments. A chunk builds every argument RoPE kernels take, by
    name: ``x`` (also read as ``dy``), the cos/sin cache ``c``/``s`` as Hugging Face
    builds it (fp32 cos/sin of the fp32 angle, rounded to `dt`) and ``freqs``, the fp32
    angle itself (what RoPE from angles reads)."""
    if inputs is not None:
        enums = list(inputs)
        if len(enums) != 3:
            raise ValueError("inputs: RoPE takes three enumerations (x1, x2, angle)")
    else:
        f = _first(dt, values, budget, seed)
        per = _per_rest(len(f), budget, 2)
        x2 = _rest(dt, values, per, seed, 1)
        ang = _qwen2_angles()
        rng = np.random.default_rng(seed + 2)
        pick = np.sort(rng.choice(len(ang), size=min(per, len(ang)), replace=False))
        angles = Enumeration(float32, table=ang[pick].view(np.uint32).astype(np.uint64),
                             label=f"{len(pick)} sampled angles of {QWEN2_ANGLES} "
                             f"(seed {seed + 2})")
        enums = [f, x2, angles]
    if enums[2].dtype is not float32:
        raise TypeError("RoPE's third enumeration holds fp32 angles")
    x_dt = enums[0].dtype

    # cos/sin of each angle as Hugging Face's cache holds them (fp32 cos/sin, rounded to
    # the dtype), made once on the host: a chunk looks them up by the angle's position
    theta = _values(_table_of(enums[2]), float32).astype(np.float64)
    cache = {n: np.asarray(tensor(fn(theta).astype(np.float32)).astype(x_dt).numpy())
             for n, fn in (("c", np.cos), ("s", np.sin))}
    dev_cache: dict = {}

    def build(ch: Arrays, device: str) -> dict:
        L = ch.lib
        x1, x2, ang = ch.vals
        n = len(x1)
        pool = {"x": L.stack([x1, x2], -1).reshape(1, 1, n, 2),
                "freqs": L.stack([ang, ang], -1)}
        for name, tab in cache.items():
            if L is not np:
                key = (name, ch.device)
                if key not in dev_cache:
                    dev_cache[key] = L.from_dlpack(from_numpy(np.ascontiguousarray(tab))) \
                        .to(ch.device)
                tab = dev_cache[key]
            v = tab[ch.digits[2]]
            pool[name] = L.stack([v, v], -1)
        return {k: _to(ch.tensor(v), device) for k, v in pool.items()}

    labels = ("x1", "x2", "angle")
    return Space(enums, labels, x_dt, _describe(labels, enums), build,
                 outputs_per_input=2, exhaustive=False)

