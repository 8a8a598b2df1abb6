"""What a bound is about and what it is measured against: chains, library presets and
configurations resolved to one record each (:class:`Target`)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from .. import ops as _ops
from .. import presets as _presets
from .._jit import JitFunction, jit
from .._optable import OPS
from ..ops import cat, reshape
from ..policy import as_math, as_policy
from ..presets import OpPreset

__all__ = ["Target", "subject", "reference", "flat", "unary_ops"]


def flat(out: Any):
    """A result as one flat tensor (the outputs of a backward op concatenated)."""
    if isinstance(out, (tuple, list)):
        return cat([reshape(t, t.numel()) for t in out], dim=0)
    return reshape(out, out.numel())


def _source(fn: Any) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"


@dataclasses.dataclass
class Target:
    """One side of a comparison: ``label``, ``run(args)`` (its result: a tensor, or a
    tuple of them for a backward op),
    ``fp64(args)`` (its formula in fp64 with castlab's portable functions), ``key`` (what
    identifies it in the disk cache: its source, policy and math), ``op`` (the preset's
    op, or None for a chain), ``arg_names`` and, for explanations, ``jit``/``policy``/
    ``math`` (None where the result comes from autodiff)."""

    label: str
    run: Callable
    fp64: Callable | None
    key: str
    op: str | None
    arg_names: tuple
    jit: JitFunction | None = None
    policy: Any = None
    math: Any = None
    preset: OpPreset | None = None

    def args(self, built: Any) -> tuple:
        """This target's arguments from a chunk's (:meth:`Space.build`): RoPE's pool of
        tensors by name (``dy`` reads ``x``), or the elementwise arguments as they are."""
        if isinstance(built, dict):
            return tuple(built["x" if n in ("x", "dy") else n] for n in self.arg_names)
        return built

    @property
    def family(self) -> str:
        return "rope" if self.op is not None and self.op.startswith("rope") else "elementwise"

    @property
    def first(self) -> int:
        """The argument that takes every pattern: the gate ``a`` of SwiGLU, else the first."""
        return self.arg_names.index("a") if "a" in self.arg_names else 0


def _preset_target(p: OpPreset, label: str | None = None, **how: Any) -> Target:
    fn = p.grad_of[0] if p.grad_of else p.fn
    pol, mth = how.get("policy", p.policy), how.get("math", p.math)
    key = "\n".join([_source(fn), repr(as_policy(pol)), repr(as_math(mth)), p.op])
    return Target(
        label or f"{p.library}:{p.op}",
        (lambda args: p._run(args, **how)) if how else (lambda args: p(*args)),
        lambda args: p.reference(*args), key, p.op, tuple(p.inputs),
        None if p.grad_of else p.jit(), as_policy(pol), as_math(mth), p)


def _arg_names(fn: Any) -> tuple:
    f = fn.fn if isinstance(fn, JitFunction) else fn
    try:
        ps = inspect.signature(f).parameters.values()
    except (TypeError, ValueError):
        return ("x",)
    names = tuple(p.name for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                  and p.default is p.empty)
    if not names:
        raise TypeError(f"{getattr(f, '__name__', f)!r} takes no positional tensor arguments")
    return names


def _chain_target(fn: Callable, label: str, policy: Any = None, math: Any = None) -> Target:
    jf = fn if isinstance(fn, JitFunction) else jit(fn)
    pol = as_policy(policy if policy is not None else jf.policy)
    mth = as_math(math if math is not None else jf.math)
    key = "\n".join([_source(jf.fn), repr(pol), repr(mth)])
    return Target(label, lambda args: jf.run(*args, policy=pol, math=mth),
                  lambda args: jf.run(*args, policy="fp64", math="portable"), key, None,
                  _arg_names(jf), jf, pol, mth)


def unary_ops() -> list:
    """The public one-argument ops a bound can be asked for by name (``"exp"``)."""
    return sorted(o.name for o in OPS.values()
                  if o.arity == 1 and o.public and o.category != "internal"
                  and callable(getattr(_ops, o.name, None)))


def subject(x: Any, policy: Any = None, math: Any = None) -> Target:
    """The thing bounded or checked: a library preset (``cl.library("liger")["swiglu"]``
    or ``"liger:swiglu"``), a preset op name (``"swiglu"``: Hugging Face eager, the
    ``torch_eager`` library), or a castlab function (under `policy`/`math`, default the
    ``cl.jit`` defaults: eager policy, torch_eager math). A row op's preset (RMSNorm:
    ``castlab.presets.ROW_OPS``) is refused: its output element depends on a whole row,
    so there is no per-element input space to enumerate."""
    op = None
    if isinstance(x, OpPreset):
        op = x.op
    elif isinstance(x, str):
        op = x.partition(":")[2] or x     # "library:op" or "op"
    if op in _presets.ROW_OPS:
        raise ValueError(f"{op}: castlab.testing enumerates the inputs of elementwise ops, one "
                         "element at a time; a row op (RMSNorm) reduces whole rows, so it has "
                         "no such input space (compare its presets with "
                         "castlab.study.libraries(ops=[...]) or castlab study --libraries all "
                         f"--chains {op})")
    if isinstance(x, OpPreset):
        if policy is not None or math is not None:
            return _preset_target(x, f"{x.library}:{x.op} {as_policy(policy or x.policy).name}/"
                                  f"{as_math(math or x.math).name}",
                                  policy=policy or x.policy, math=math or x.math)
        return _preset_target(x)
    if isinstance(x, str):
        if ":" in x:
            lib, _, op = x.partition(":")
            return subject(_presets.library(lib)[op], policy, math)
        if x in _presets.OPS:
            return subject(_presets.library("torch_eager")[x], policy, math)
        if x in unary_ops():
            return _chain_target(getattr(_ops, x), x, policy, math)
        raise ValueError(f"unknown chain or preset {x!r}; valid: an op of the library presets "
                         f"({', '.join(_presets.OPS)}), a one-argument op (exp, silu, ...), "
                         "'library:op' (libraries: "
                         f"{', '.join(_presets.libraries())}), a castlab function or an "
                         "OpPreset (cl.library(name)[op])")
    if callable(x):
        name = getattr(x, "__name__", None) or getattr(getattr(x, "fn", None), "__name__", "chain")
        return _chain_target(x, name, policy, math)
    raise TypeError(f"expected a castlab function, an OpPreset or a preset name, got "
                    f"{type(x).__name__}")


def reference(s: Target, against: Any) -> Target:
    """One reference for subject `s`: ``"fp64"`` (its formula, exact but for the final
    rounding), ``"torch_eager"`` (PyTorch eager: the chain under eager/torch_eager, or the
    ``torch_eager`` library's preset of the op), ``"inductor"`` (torch.compile: the same
    under fused/inductor), a library name (its preset of the op), ``"policy/math"`` (the
    subject's formula under that configuration), an OpPreset or a castlab function."""
    if isinstance(against, OpPreset):
        return _preset_target(against)
    if callable(against) and not isinstance(against, str):
        return _chain_target(against, getattr(against, "__name__", "reference"))
    if not isinstance(against, str):
        raise TypeError(f"against: expected names (fp64, torch_eager, inductor, a library, "
                        f"'policy/math'), OpPresets or functions, got {type(against).__name__}")
    if against == "fp64":
        return Target("fp64", s.fp64, None, "fp64", s.op, s.arg_names)
    eager_preset = None
    if s.op is not None:
        eager_lib = _presets.library("torch_eager")
        eager_preset = eager_lib.presets.get(s.op)
    if against == "torch_eager":
        if s.op is not None:
            if eager_preset is None:
                raise ValueError(f"against='torch_eager': {s.op} has no PyTorch eager preset")
            return _preset_target(eager_preset, "torch_eager")
        return _chain_target(s.jit, "torch_eager", "eager", "torch_eager")
    if against == "inductor":
        if s.op is not None:
            if eager_preset is None:
                raise ValueError(f"against='inductor': {s.op} has no PyTorch eager preset to "
                                 "compile")
            return _preset_target(eager_preset, "inductor", policy="fused", math="inductor")
        return _chain_target(s.jit, "inductor", "fused", "inductor")
    if "/" in against:
        pol, _, mth = against.partition("/")
        if s.preset is not None:
            return _preset_target(s.preset, against, policy=pol, math=mth)
        return _chain_target(s.jit, against, pol, mth)
    if against in _presets.libraries():
        if s.op is None:
            raise ValueError(f"against={against!r}: a library is a reference for a library "
                             "preset's op, not for a castlab function")
        return _preset_target(_presets.library(against)[s.op], against)
    raise ValueError(f"against: unknown reference {against!r}; valid: fp64, torch_eager, "
                     f"inductor, a library ({', '.join(_presets.libraries())}), "
                     "'policy/math', an OpPreset or a castlab function")
