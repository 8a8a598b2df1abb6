"""Checking a user's kernel on every input: :func:`assert_kernel_matches`."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .. import cuda
from .._dlpack import from_dlpack
from ..numerics import Enumeration, explain, ulp_diff
from . import _bounds  # its ON_DEVICE is read at each call (tests set it)
from ._bounds import check_device, chunks, default_space, out_to_input
from ._space import Space
from ._target import Target, flat, subject

__all__ = ["assert_kernel_matches", "KernelReport", "KernelMismatch", "MODES"]

MODES = ("exhaustive", "sample")
#: The most input tuples mode="exhaustive" visits (every pair of a 16-bit dtype).
_MAX_EXHAUSTIVE = 1 << 32
#: Input tuples per chunk of a check on a GPU: 2**28 (16 chunks for every 16-bit pair;
#: about 3 GB of device memory for a two-input op), fewer waits than bounds()' chunks.
_GPU_CHUNK = 1 << 28
_INT = {8: "int8", 16: "int16", 32: "int32", 64: "int64"}


class KernelReport:
    """What :func:`assert_kernel_matches` found.

    ``passed``; ``reference`` (label) and ``space`` (what was visited); ``inputs`` and
    ``elements`` (input tuples, output elements); ``differ`` (elements whose bits differ
    from the reference's; any NaN equals any NaN), ``signed_zeros`` (of those, +0 against
    -0), ``nan_where_reference_is_not``, ``max_ulp`` (largest distance in ulps);
    ``closer_to_fp64`` / ``farther_from_fp64`` / ``as_close`` (of the differing elements:
    the kernel's value nearer the exact one than the reference's, farther, or as near);
    ``first`` (the first differing inputs: input values, kernel and reference values,
    exact value, which is correctly rounded, and the reference's rounding explained);
    ``seconds_kernel`` (in the user's kernel) and ``seconds_castlab`` (the rest of the
    wall time); ``seconds_phases`` (the time by phase: ``inputs``, ``reference``,
    ``kernel``, ``input check`` (the copy that proves the kernel left its inputs alone),
    ``comparison`` and ``explanations``; on a GPU from CUDA events, device time with the
    device's idle gaps in the phase they fall in); ``failure`` (why it failed, one line).
    """

    def __init__(self, **kw: Any):
        self.first: list = []
        self.failure: str | None = None
        self.__dict__.update(kw)

    @property
    def passed(self) -> bool:
        return self.failure is None

    def __str__(self) -> str:
        verdict = "PASS" if self.passed else f"FAIL: {self.failure}"
        L = [f"castlab kernel check against {self.reference} ({self.mode}): {verdict}",
             f"  inputs: {self.space}",
             f"  {self.differ:,} of {self.elements:,} output elements differ "
             f"({self.differ / max(1, self.elements):.3g}); max {self.max_ulp:g} ulp apart"]
        if self.signed_zeros:
            L.append(f"  {self.signed_zeros:,} of them are +0 against -0")
        if self.nan_where_reference_is_not:
            L.append(f"  NaN where the reference is not: {self.nan_where_reference_is_not:,}")
        if self.differ:
            L.append(f"  against fp64: the kernel is closer in {self.closer_to_fp64:,}, farther "
                     f"in {self.farther_from_fp64:,}, as close in {self.as_close:,}")
        for f in self.first:
            ins = ", ".join(f"{k}={v[0]!r} ({v[1]})" for k, v in f["inputs"].items())
            L.append(f"  at {ins}{'' if f['output'] == 0 else ' output ' + str(f['output'])}:"
                     f" kernel {f['kernel']!r}, reference {f['reference']!r}, exact "
                     f"{f['exact']!r}; correctly rounded: {f['correctly_rounded']}")
            if f.get("why"):
                L.append(f"    {f['why']}")
        L.append(f"  time: {self.seconds_kernel:.3f} s in the kernel, "
                 f"{self.seconds_castlab:.3f} s in castlab")
        ph = getattr(self, "seconds_phases", None)
        if ph:
            L.append("  by phase: " + ", ".join(f"{k} {v:.3f} s" for k, v in ph.items()))
        return "\n".join(L)

    __repr__ = __str__


class KernelMismatch(AssertionError):
    """Raised by :func:`assert_kernel_matches`; ``.report`` is the :class:`KernelReport`."""

    def __init__(self, report: KernelReport):
        super().__init__(str(report))
        self.report = report


def _space_for(t: Target, dtype: Any, mode: str, dev: Any, inputs: Any, sample: int | None,
               seed: int, values: str) -> Space:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if inputs is not None:
        if isinstance(inputs, (Enumeration, str)):
            inputs = [inputs]
        return default_space(t, dtype, dev, values=values, seed=seed, inputs=list(inputs))
    if mode == "sample":
        return default_space(t, dtype, dev, values=values, sample=sample or (1 << 22), seed=seed)
    if t.family == "rope":
        raise ValueError("mode='exhaustive': RoPE computes each output from four numbers "
                         "(x1, x2, cos, sin), 2**64 tuples in a 16-bit dtype; use "
                         "mode='sample' (every x1, sampled x2 and angles)")
    sp = default_space(t, dtype, dev, values=values, sample=_MAX_EXHAUSTIVE, seed=seed)
    if not sp.exhaustive or sp.size > _MAX_EXHAUSTIVE:
        raise ValueError(f"mode='exhaustive': {len(t.arg_names)} {sp.dtype.name} inputs have "
                         f"2**{sp.dtype.bits * len(t.arg_names)} tuples; use mode='sample' or "
                         "pass inputs= (one Enumeration per argument)")
    return sp


def _torch():
    import torch

    return torch


def _bits(torch: Any, t: Any) -> Any:
    """`t`'s bits as integers of its width (a view, whatever its strides)."""
    return t.view(getattr(torch, _INT[t.element_size() * 8]))


def _check_out(torch: Any, out: Any, want: Any, lo: int, space: Space,
               device: Any) -> str | None:
    """Why the kernel's result cannot be compared (None: it can)."""
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    wants = list(want) if isinstance(want, (tuple, list)) else [want]
    if isinstance(out, (tuple, list)) and not all(isinstance(o, torch.Tensor) for o in outs):
        kinds = sorted({type(o).__name__ for o in outs if not isinstance(o, torch.Tensor)})
        return (f"returned a {type(out).__name__} holding {', '.join(kinds)}, not a "
                "torch.Tensor (or a tuple of them)")
    if len(outs) != len(wants):
        return f"returned {len(outs)} tensor(s), the reference returns {len(wants)}"
    for k, (o, w) in enumerate(zip(outs, wants)):
        what = "its result" if len(outs) == 1 else f"result {k}"
        if not isinstance(o, torch.Tensor):
            return f"{what} is a {type(o).__name__}, not a torch.Tensor"
        if tuple(o.shape) != tuple(w.shape):
            return (f"{what} has shape {tuple(o.shape)}, the reference's is {tuple(w.shape)} "
                    f"(chunk starting at input {_fmt_inputs(space.inputs_at(lo))})")
        if str(o.dtype) != f"torch.{w.dtype.name}":
            return f"{what} has dtype {o.dtype}, the reference's is {w.dtype.name}"
        if o.device != device:
            return f"{what} is on {o.device}, its inputs on {device}"
    return None


class _Phases:
    """Where a check's time goes, without waiting for the device: a mark ends the phase it
    names. On a GPU a mark is a CUDA event on the current stream (read once, at the end);
    on the CPU a clock reading."""

    def __init__(self, torch: Any, dev: Any):
        self.torch, self.cuda = torch, dev.type == "cuda"
        self.marks: list = []
        self.mark("")

    def mark(self, name: str) -> None:
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append((name, e))
        else:
            self.marks.append((name, time.perf_counter()))

    def seconds(self) -> dict:
        """Seconds per phase name, in the order first seen."""
        if self.cuda and self.marks:
            self.marks[-1][1].synchronize()
        out: dict = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            dt = a.elapsed_time(b) / 1e3 if self.cuda else b - a
            out[name] = out.get(name, 0.0) + dt
        return out


def _fmt_inputs(ins: dict) -> str:
    return ", ".join(f"{k}={v[0]!r} ({v[1]})" for k, v in ins.items())


def _explain_one(t: Target, space: Space, i: int, out_no: int, k_local: int,
                 device: str) -> dict:
    """The reference at input tuple `i`, output `out_no`, explained (castlab.numerics.explain
    on a one-input call) on the check's device: the GPU's reference can differ from the
    CPU's (approximate division and ex2 are GPU-only), and the report shows the one the
    kernel was compared with."""
    args = t.args(space.chunk(i, i + 1, device))
    d: dict = {"inputs": space.inputs_at(i), "output": out_no}
    raw = t.run(args)
    r = flat(raw)
    m = r.numel()
    blocks = len(raw) if isinstance(raw, (tuple, list)) else 1
    j = out_no * (m // blocks) + k_local
    exact = flat(t.fp64(args))
    d["reference"] = float(r.cpu().numpy().astype(np.float64)[j])
    d["exact"] = float(exact.cpu().numpy()[j])
    if t.jit is not None:
        shape = tuple((raw[out_no] if blocks > 1 else raw).shape)
        idx = tuple(int(v) for v in np.unravel_index(k_local, shape)) if shape else ()
        try:
            e = explain(t.jit, args, idx, policies=[t.policy], maths=[t.math], output=out_no)
            o = e.outcomes[0]
            d["correctly_rounded_value"] = float(e.correctly_rounded)
            steps = [f"{nd['label'].split('  (')[0]} = {nd['values'][1][0]!r} (exact "
                     f"{nd['values'][0][0]!r})" for nd in e.nodes
                     if not nd["label"].endswith("(input)") and len(nd["values"]) > 1]
            d["why"] = (f"the reference ({o.label}): " + "; ".join(steps)
                        + f"; {'correctly rounded' if o.correct else 'not correctly rounded'}")
        except (TypeError, ValueError, IndexError):
            d["why"] = None
    return d


def assert_kernel_matches(kernel: Callable, reference: Any, inputs: Sequence[Any] | None = None,
                          *, dtype: Any = "bfloat16", mode: str = "exhaustive",
                          max_ulp: float | None = None, device: Any = None,
                          sample: int | None = None, seed: int = 0, values: str = "all",
                          first_k: int = 5, policy: Any = None,
                          math: Any = None) -> KernelReport:
    """Run `kernel` on every input and assert it equals `reference` bit for bit (or within
    `max_ulp` ulps); return the :class:`KernelReport`, or raise :class:`KernelMismatch`
    (an AssertionError) carrying it.

    kernel: any callable on torch tensors (a Triton kernel's launcher, a CUDA extension, a
    torch function), called with the reference's arguments (``kernel(a, b)`` for SwiGLU;
    RoPE: ``x`` [1, 1, n, 2] and its cos/sin cache [n, 2] or fp32 angles), returning
    a tensor (a tuple for a backward op) of the reference's shape and dtype.
    reference: a library preset (``cl.library("liger")["swiglu"]``, ``"liger:swiglu"``),
    a preset op (``"swiglu"``: PyTorch eager) or a castlab function (under
    `policy`/`math`, default ``cl.jit``'s).

    mode: ``"exhaustive"`` visits every input tuple of `dtype` (all 2**32 pairs for a
    two-input 16-bit op: seconds on a GPU, minutes on a CPU); ``"sample"`` every value of
    the first input (SwiGLU's ``a``) with `sample` tuples in all (default 2**22; seed
    `seed`). `inputs` (one Enumeration, dtype or tensor per argument) sets the space by
    hand. The inputs are made chunk by chunk on `device` (default: the GPU when castlab
    has one) and reach the kernel through DLPack, without a copy.

    Fails when the kernel raises, returns the wrong type, shape or dtype, changes its
    inputs in place, returns NaN where the reference does not, or (``max_ulp=None``)
    differs in any bit (any NaN equals any NaN) or is more than `max_ulp` ulps away. The
    report gives the count, the first `first_k` differing inputs with the reference's
    rounding explained, and whether the kernel is closer to the exact value than the
    reference.

    >>> import torch
    >>> from castlab.testing import assert_kernel_matches
    >>> def my_swiglu(a, b):
    ...     return torch.nn.functional.silu(a) * b
    >>> r = assert_kernel_matches(my_swiglu, "swiglu", mode="sample", sample=1 << 18,
    ...                           device="cpu")
    >>> r.passed, r.differ
    (True, 0)
    """
    torch = _torch()
    if not callable(kernel):
        raise TypeError(f"kernel must be callable, got {type(kernel).__name__}")
    if max_ulp is not None and (isinstance(max_ulp, bool) or not isinstance(max_ulp, (int, float))
                                or not max_ulp >= 0):
        raise ValueError(f"max_ulp must be None or a number >= 0, got {max_ulp!r}")
    if isinstance(first_k, bool) or not isinstance(first_k, int) or first_k < 0:
        raise ValueError(f"first_k must be an int >= 0, got {first_k!r}")
    if device is None:
        device = "cuda" if cuda.is_available() else "cpu"
    dev = check_device(device, "assert_kernel_matches")
    t = subject(reference, policy, math)
    space = _space_for(t, dtype, mode, dev, inputs, sample, seed, values)
    rep = KernelReport(reference=t.label, mode=mode if inputs is None else "inputs",
                       space=space.description, inputs=space.size, elements=0, differ=0,
                       signed_zeros=0, nan_where_reference_is_not=0, max_ulp=0.0,
                       closer_to_fp64=0, farther_from_fp64=0, as_close=0,
                       seconds_kernel=0.0, seconds_castlab=0.0, seconds_phases={})
    firsts: list = []   # (input index, output number, local index, kernel value)
    t0 = time.perf_counter()
    ph = _Phases(torch, dev)
    try:
        for lo, hi, built in chunks(space, dev, step=_GPU_CHUNK if dev.type == "cuda" else None):
            args = t.args(built)
            ph.mark("inputs")
            targs = [torch.from_dlpack(a) for a in args]
            saved = _saved(torch, space, built, targs, lo, hi, dev)
            ph.mark("input check")
            want = t.run(args)
            ph.mark("reference")
            out = _call(torch, kernel, targs, rep, lo, hi, space)
            ph.mark("kernel")
            bad = _check_out(torch, out, want, lo, space, targs[0].device)
            if bad is not None:
                rep.failure = f"the kernel {bad}"
                raise KernelMismatch(rep)
            kflat, rflat, blocks = _flat_pair(torch, out, want)
            same_in, same_out = _chunk_clean(torch, targs, saved, kflat, rflat)
            if not same_in:
                _check_unchanged(torch, t.arg_names, targs, saved, rep, lo, hi, space)
            ph.mark("input check")
            rep.elements += kflat.numel()
            if not same_out:
                _compare_chunk(torch, t, args, kflat, rflat, blocks, rep, firsts, first_k, lo,
                               hi)
            ph.mark("comparison")
        for i, o, kl, kv in firsts:
            rep.first.append(_first_one(t, space, i, o, kl, kv, str(dev)))
        ph.mark("explanations")
    finally:
        rep.seconds_phases = ph.seconds()
        rep.seconds_kernel = rep.seconds_phases.get("kernel", 0.0)
        rep.seconds_castlab = time.perf_counter() - t0 - rep.seconds_kernel
    rep.failure = _verdict(rep, max_ulp)
    if rep.failure is not None:
        raise KernelMismatch(rep)
    return rep


def _call(torch: Any, kernel: Callable, targs: list, rep: KernelReport, lo: int,
          hi: int, space: Space) -> Any:
    """The kernel's result on one chunk; an exception is a failure naming the chunk's first
    input. (No wait for the device: an asynchronous device error surfaces at the next
    wait, the chunk's comparison, as that error.)"""
    try:
        return kernel(*targs)
    except Exception as e:  # noqa: BLE001  (the user's kernel: reported, never a pass)
        rep.failure = (f"the kernel raised {type(e).__name__}: {e} (on input tuples "
                       f"[{lo}, {hi}), the first {_fmt_inputs(space.inputs_at(lo))})")
        raise KernelMismatch(rep) from e


def _saved(torch: Any, space: Space, built: Any, targs: list, lo: int, hi: int,
           dev: Any) -> list:
    """What each argument must still hold after the kernel: on a GPU (where the chunk was
    made from indices on the device), for arguments that
    are the space's values themselves (elementwise ops over whole rows), the space's
    broadcast views, which read only its tables (no copy); else a copy."""
    on = dev.type == "cuda" if _bounds.ON_DEVICE is None else _bounds.ON_DEVICE
    if on and not isinstance(built, dict):
        views = space.views(lo, hi, str(dev))
        if views is not None and len(views) == len(targs):
            return views
    return [a.clone() for a in targs]


def _check_unchanged(torch: Any, names: tuple, targs: list, saved: list, rep: KernelReport,
                     lo: int, hi: int, space: Space) -> None:
    """Fail, naming the input and its first changed element, where the kernel wrote into
    an input (compared bit for bit with a copy, or with the space's views of the values
    the chunk was made from)."""
    targs = [a.reshape(s.shape) for a, s in zip(targs, saved)]
    for name, a, s in zip(names, targs, saved):
        changed = (_bits(torch, a) != _bits(torch, s)).reshape(-1)
        if bool(changed.any()):
            ch = torch.nonzero(changed)
            i = out_to_input(int(ch[0]), lo, hi - lo, a.numel(), 1)[0]
            rep.failure = (f"the kernel changed its input {name!r} in place ({len(ch)} "
                           f"elements; the first at {_fmt_inputs(space.inputs_at(i))})")
            raise KernelMismatch(rep)


def _flat_pair(torch: Any, out: Any, want: Any) -> tuple:
    """The kernel's and the reference's results as flat torch tensors (several outputs
    concatenated), and the number of outputs."""
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    kflat = outs[0].reshape(-1) if len(outs) == 1 else torch.cat([o.reshape(-1) for o in outs])
    return kflat, torch.from_dlpack(flat(want)), len(outs)


def _chunk_clean(torch: Any, targs: list, saved: list, kflat: Any, rflat: Any,
                 one_wait: bool | None = None) -> tuple:
    """(every input unchanged, the result's bits equal the reference's): on a GPU
    (`one_wait`) one device reduction each and one wait for all of them; on the CPU
    ``torch.equal``."""
    pairs = [(a.reshape(s.shape), s) for a, s in zip(targs, saved)] + [(kflat, rflat)]
    if not (kflat.device.type != "cpu" if one_wait is None else one_wait):
        same = [torch.equal(_bits(torch, a), _bits(torch, b)) for a, b in pairs]
    else:
        same = [not v for v in torch.stack([(_bits(torch, a) != _bits(torch, b)).any()
                                            for a, b in pairs]).tolist()]
    return all(same[:-1]), same[-1]


def _compare_chunk(torch: Any, t: Target, args: tuple, kflat: Any, rflat: Any, blocks: int,
                   rep: KernelReport, firsts: list, first_k: int, lo: int, hi: int) -> None:
    """Count the differing bits of a chunk whose bits are not all equal (any NaN equals any
    NaN), their ulps, and, where they differ, which side is closer to the exact value;
    keep the first differing."""
    m = kflat.numel()
    # Only the elements whose bits differ are looked at further (NaNs with other payloads
    # among them): one pass over the chunk and a list of positions, then small tensors.
    pos = torch.nonzero(_bits(torch, kflat) != _bits(torch, rflat)).reshape(-1)
    k, r = kflat[pos], rflat[pos]
    kn, rn = torch.isnan(k), torch.isnan(r)
    keep = ~(kn & rn)
    # both counts in one transfer: one wait for the device per chunk
    nan_bad, nd = torch.stack([(kn & ~rn).sum(), keep.sum()]).tolist()
    rep.nan_where_reference_is_not += nan_bad
    if not nd:
        return
    rep.differ += nd
    where, k, r = pos[keep], k[keep], r[keep]
    rep.signed_zeros += int((k == r).sum())
    ud = torch.from_dlpack(ulp_diff(from_dlpack(r), from_dlpack(k)))
    rep.max_ulp = max(rep.max_ulp, float(ud.max()))
    exact = torch.from_dlpack(flat(t.fp64(args)))[where]
    ek = (k.double() - exact).abs()
    er = (r.double() - exact).abs()
    rep.closer_to_fp64 += int((ek < er).sum())
    rep.farther_from_fp64 += int((ek > er).sum())
    rep.as_close += int((ek == er).sum()) + int((torch.isnan(ek) | torch.isnan(er)).sum())
    for k in where[:max(0, first_k - len(firsts))].tolist():
        firsts.append((*out_to_input(k, lo, hi - lo, m, blocks), float(kflat[k].double())))


def _first_one(t: Target, space: Space, i: int, o: int, kl: int, kv: float,
               device: str) -> dict:
    """A differing input's entry of the report: the reference explained, the kernel's value
    and which of the two is correctly rounded."""
    d = _explain_one(t, space, i, o, kl, device)
    d["kernel"] = kv
    cr = d.get("correctly_rounded_value")
    d["correctly_rounded"] = ("unknown" if cr is None else
                              "both" if kv == cr and d["reference"] == cr else
                              "the kernel" if kv == cr else
                              "the reference" if d["reference"] == cr else "neither")
    return d


def _verdict(rep: KernelReport, max_ulp: float | None) -> str | None:
    if rep.nan_where_reference_is_not:
        return (f"the kernel returned NaN where the reference does not in "
                f"{rep.nan_where_reference_is_not:,} elements")
    if max_ulp is None and rep.differ:
        return f"{rep.differ:,} elements differ from the reference (max_ulp=None: bits)"
    if max_ulp is not None and rep.max_ulp > max_ulp:
        return f"{rep.max_ulp:g} ulps apart, more than max_ulp={max_ulp:g}"
    return None
