"""Stacks: a named, immutable set of choices for a captured model (issue 52).

A :class:`Stack` says how each part of a captured model runs:

* ``policy`` and ``math``: castlab's regions (everything castlab computes itself);
* ``stores``: where values are rounded between kernels: None (castlab's regions round what
  they hand on) or "inductor" (where torch.compile's Inductor kernels store, read from the
  compiled program of the model: castlab.torch._inductor);
* ``swiglu``, ``geglu``, ``rope``, ``rms_norm``: a kernel-library preset per region kind
  (a library name, an :class:`~castlab.presets.OpPreset`, or None: as captured), put in
  place of every instance of the kind (``CapturedModel.run(..., kernels=)``);
* ``attention``: the backend of every ``scaled_dot_product_attention`` call ("math",
  "flash", "efficient", "cudnn"; None: PyTorch's own choice), run by PyTorch itself under
  ``torch.nn.attention.sdpa_kernel``;
* ``matmul``: PyTorch's matmul flags around the run (``allow_bf16_reduced_precision_
  reduction``, ``allow_fp16_reduced_precision_reduction``, ``allow_tf32``; None: as they
  are), restored afterwards, even on error.

Built-in stacks (:func:`stacks`) name what common systems run; ``Stack(base="hf_eager",
rope="vllm", attention="flash")`` builds another. ``describe()`` lists every choice with
its source (the library's file and lines) and whether it was run against the library.

>>> import castlab.torch as ct
>>> ct.stacks()
['hf_eager', 'torch_compile', 'torch_compile_emulate', 'liger', 'unsloth', 'vllm', 'transformer_engine']
>>> s = ct.Stack(base="hf_eager", rope="vllm", attention="flash")
>>> s.name, s.rope, s.attention
('hf_eager+rope=vllm+attention=flash', 'vllm', 'flash')
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Any

import torch

from .._presets_norm import EPS, _vllm_normalize
from ..policy import Math, Policy, as_math, as_policy
from ..presets import OpPreset, libraries, library
from . import _inductor, _regions

__all__ = ["Stack", "Matmul", "stacks", "stack", "FIELDS", "KERNEL_KINDS", "BACKENDS"]

#: The region kinds a stack picks a kernel-library preset for.
KERNEL_KINDS = ("swiglu", "geglu", "rope", "rms_norm")
#: Every choice a stack makes, in display order (alignment switches these one by one).
FIELDS = ("policy", "math", "stores", "swiglu", "geglu", "rope", "rms_norm", "attention", "matmul")
#: The SDPA backends a stack can force, by name.
BACKENDS = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
            "cudnn": "CUDNN_ATTENTION"}
_PRESET_OPS = {"swiglu": ("swiglu",), "geglu": ("geglu",), "rope": ("rope",),
               "rms_norm": ("rms_norm", "rms_norm_gemma")}
_UNSET = object()
#: The values of a stack's ``stores`` choice.
STORES = (None, "inductor")


@dataclasses.dataclass(frozen=True)
class Matmul:
    """PyTorch's matmul flags a stack sets while it runs (None: leave PyTorch's current
    value): ``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction``,
    ``allow_fp16_reduced_precision_reduction`` (cuBLAS may reduce split-K partials in
    16 bits) and ``allow_tf32`` (fp32 matmuls in TF32). They are CUDA flags: on the CPU
    PyTorch's matmuls do not read them.

    >>> import castlab.torch as ct
    >>> ct.Matmul(allow_bf16_reduced_precision_reduction=False).describe()
    'allow_bf16_reduced_precision_reduction=False'
    """

    allow_bf16_reduced_precision_reduction: bool | None = None
    allow_fp16_reduced_precision_reduction: bool | None = None
    allow_tf32: bool | None = None

    def set(self) -> dict:
        """The flags this sets: {name: value}."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}

    def describe(self) -> str:
        s = self.set()
        return ", ".join(f"{k}={v}" for k, v in s.items()) or "PyTorch's current flags"


@contextlib.contextmanager
def matmul_flags(m: Matmul):
    """Set `m`'s flags on ``torch.backends.cuda.matmul`` and restore them on exit."""
    mm = torch.backends.cuda.matmul
    saved = {k: getattr(mm, k) for k in m.set()}
    try:
        for k, v in m.set().items():
            setattr(mm, k, v)
        yield
    finally:
        for k, v in saved.items():
            setattr(mm, k, v)


def sdpa_context(backend: str | None):
    """``torch.nn.attention.sdpa_kernel`` forcing `backend` (a :data:`BACKENDS` name);
    a null context for None."""
    if backend is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, BACKENDS[backend])])


# ---------------------------------------------------------------- vLLM's RMSNorm per site

@dataclasses.dataclass(frozen=True)
class SitePreset(OpPreset):
    """An rms_norm preset that picks, per instance, between two kernels of one library:
    ``fused`` where the norm's input is a residual add (the decoder's ``residual +
    hidden``: vLLM calls ``fused_add_rms_norm`` there), ``fn`` elsewhere (the first
    layer's input norm). The captured graph has already rounded the add to the storage
    dtype, as the fused kernel stores it; the fused kernel's normalisation (its own
    reduction order) runs on that value."""

    fused: OpPreset | None = None

    def for_region(self, region: Any, by_name: dict) -> OpPreset:
        x = by_name.get(region.inputs[0]) if region.inputs else None
        add = (x is not None and str(x.target) == "aten.add.Tensor"
               and sum(isinstance(a, torch.fx.Node) for a in x.args[:2]) == 2)
        return self.fused if add and self.fused is not None else _plain(self)


_PLAIN: dict = {}


def _plain(p: SitePreset) -> OpPreset:
    """`p` as an ordinary OpPreset (made once, so that its id keys the kernel plans)."""
    if id(p) not in _PLAIN:
        _PLAIN[id(p)] = OpPreset(p.library, p.op, p.fn, p.policy, p.math, p.summary,
                                 p.source, p.inputs, None, p.verified)
    return _PLAIN[id(p)]


def _vllm_fused_add_norm(x, weight, *, eps: float = EPS):
    """vLLM's fused_add_rms_norm's normalisation of z = input + residual (given as `x`):
    blocks of min(hidden, 1024) threads below 256 tokens, else min(hidden, 256); the
    width-8 vector kernel where hidden % 8 == 0 (castlab._presets_norm)."""
    n = x.shape[-1]
    tokens = 1
    for d in x.shape[:-1]:
        tokens *= d
    return _vllm_normalize(x, weight, min(n, 1024 if tokens < 256 else 256),
                           8 if n % 8 == 0 else 0, eps)


def _vllm_rms_norm() -> SitePreset:
    lib = library("vllm")
    plain, fa = lib["rms_norm"], lib["fused_add_rms_norm"]
    fused = OpPreset("vllm", "rms_norm", _vllm_fused_add_norm, fa.policy, fa.math,
                     "fused_add_rms_norm's normalisation of the residual sum", fa.source,
                     ("x", "weight"), None, fa.verified)
    return SitePreset("vllm", "rms_norm", plain.fn, plain.policy, plain.math,
                      "rms_norm_kernel (first input norm); fused_add_rms_norm after a "
                      "residual add", f"{plain.source} ; {fa.source}", ("x", "weight"), None,
                      plain.verified, fused)


# ---------------------------------------------------------------- the Stack

def _check_preset(kind: str, v: Any, where: str) -> Any:
    """A kernel choice checked: None, a library name that has the kind's op, or an
    OpPreset of that op."""
    ops = _PRESET_OPS[kind]
    if v is None:
        return None
    if isinstance(v, str):
        lib = library(v)  # an unknown name lists the known ones
        if not any(op in lib.presets for op in ops):
            have = [n for n in libraries() if any(op in library(n).presets for op in ops)]
            raise ValueError(f"{where}: {kind}={v!r}: {v} has no {'/'.join(ops)} preset; "
                             f"libraries with one: {', '.join(have) or 'none yet'}")
        return v
    if isinstance(v, OpPreset):
        if v.op not in ops:
            raise ValueError(f"{where}: {kind}= is {v.library}'s {v.op} preset; {kind} takes "
                             f"a {' or '.join(ops)} preset")
        return v
    raise TypeError(f"{where}: {kind} must be a library name, an OpPreset or None, not "
                    f"{type(v).__name__}")


def _check_attention(v: Any, where: str) -> str | None:
    if v is not None and v not in BACKENDS:
        raise ValueError(f"{where}: attention={v!r}; the SDPA backends are "
                         f"{', '.join(map(repr, BACKENDS))} (None: PyTorch's own choice)")
    return v


def _check_matmul(v: Any, where: str) -> Matmul:
    if v is None:
        return Matmul()
    if isinstance(v, Matmul):
        return v
    if isinstance(v, dict):
        names = [f.name for f in dataclasses.fields(Matmul)]
        bad = [k for k in v if k not in names]
        if bad:
            raise ValueError(f"{where}: unknown matmul flag(s) {bad}; known: {names}")
        return Matmul(**v)
    raise TypeError(f"{where}: matmul must be a Matmul, a dict of flags or None, not "
                    f"{type(v).__name__}")


class Stack:
    """A named, immutable set of choices for a captured model (see :mod:`._stacks`).

    ``Stack("liger")`` is a built-in one (:func:`stacks`); ``Stack(base="hf_eager",
    rope="vllm", attention="flash")`` starts from a base and changes the choices given
    (a library name or ``cl.library(...)[op]`` per kernel kind; None: as captured).
    ``replace(**choices)`` gives a changed copy; ``describe()`` lists every choice.

    >>> import castlab.torch as ct
    >>> s = ct.Stack("liger")
    >>> s.policy.name, s.swiglu, s.rms_norm
    ('eager', 'liger', 'liger')
    >>> ct.Stack(base=s, rope=None).rope is None
    True
    """

    __slots__ = ("name", "policy", "math", "stores", "swiglu", "geglu", "rope", "rms_norm", "attention",
                 "matmul", "notes")

    def __init__(self, base: Any = None, *, name: str | None = None, policy: Any = _UNSET,
                 math: Any = _UNSET, stores: Any = _UNSET, swiglu: Any = _UNSET, geglu: Any = _UNSET,
                 rope: Any = _UNSET, rms_norm: Any = _UNSET, attention: Any = _UNSET,
                 matmul: Any = _UNSET, notes: tuple = ()):
        if base is None:
            start = {"policy": "eager", "math": "torch_eager", "stores": None, "notes": ()}
            base_name = "custom"
        else:
            b = stack(base)
            start = {f: getattr(b, f) for f in FIELDS}
            start["notes"] = b.notes
            base_name = b.name
        given = {"policy": policy, "math": math, "stores": stores, "swiglu": swiglu, "geglu": geglu,
                 "rope": rope, "rms_norm": rms_norm, "attention": attention, "matmul": matmul}
        changed = {k: v for k, v in given.items() if v is not _UNSET}
        where = f"Stack({name or base_name!r})"
        vals = {**start, **changed}
        set_ = object.__setattr__
        set_(self, "policy", as_policy(vals["policy"]))
        set_(self, "math", as_math(vals["math"]))
        if vals.get("stores") not in STORES:
            raise ValueError(f"{where}: stores must be None or 'inductor', not "
                             f"{vals.get('stores')!r}")
        set_(self, "stores", vals.get("stores"))
        for kind in KERNEL_KINDS:
            set_(self, kind, _check_preset(kind, vals.get(kind), where))
        set_(self, "attention", _check_attention(vals.get("attention"), where))
        set_(self, "matmul", _check_matmul(vals.get("matmul"), where))
        set_(self, "notes", tuple(notes) + tuple(vals["notes"]))
        if name is None:
            name = base_name + "".join(f"+{k}={_short(getattr(self, k))}" for k in changed)
        set_(self, "name", name)

    def __setattr__(self, k: str, v: Any) -> None:
        raise AttributeError(f"Stack is immutable; use stack.replace({k}=...)")

    def replace(self, name: str | None = None, **choices: Any) -> Stack:
        """A copy with `choices` changed (field=value, as the constructor takes them).

        >>> import castlab.torch as ct
        >>> ct.Stack("hf_eager").replace(attention="math").attention
        'math'
        """
        bad = [k for k in choices if k not in FIELDS]
        if bad:
            raise ValueError(f"Stack.replace: unknown choice(s) {bad}; choices: {FIELDS}")
        return Stack(self, name=name, **choices)

    def choices(self) -> dict:
        """{field: value} of every choice, in :data:`FIELDS` order."""
        return {f: getattr(self, f) for f in FIELDS}

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Stack) and all(
            _key(getattr(self, f)) == _key(getattr(other, f)) for f in FIELDS)

    def __hash__(self) -> int:
        return hash(tuple(_key(getattr(self, f)) for f in FIELDS))

    def __repr__(self) -> str:
        ch = ", ".join(f"{f}={_short(v)}" for f, v in self.choices().items()
                       if v is not None and not (isinstance(v, Matmul) and not v.set()))
        return f"<castlab.torch.Stack {self.name}: {ch}>"

    def describe(self) -> str:
        """Every choice, one line each: its value, what it does, its source (the library's
        file and lines) and its status (verified against the library, or "from source,
        not run"); then the stack's notes.

        >>> import castlab.torch as ct
        >>> print(ct.Stack("hf_eager").describe())  # doctest: +ELLIPSIS
        stack hf_eager
          policy     eager ...
        """
        lines = [f"stack {self.name}"]
        for f in FIELDS:
            lines.append(f"  {f:10} " + _describe_choice(f, getattr(self, f)))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def run(self, captured: Any, *inputs: Any, kwargs: dict | None = None) -> Any:
        """Run `captured` (a CapturedModel) under this stack; returns its outputs (as
        ``captured.run(*inputs, stack=self)``). Choices that do not apply to the model
        are reported by a warning (``plan(captured).inert`` lists them).

        >>> import torch, castlab.torch as ct
        >>> g = torch.ones(2, 4, dtype=torch.bfloat16)
        >>> m = ct.capture(lambda g, u: torch.nn.functional.silu(g) * u, g, g)
        >>> ct.Stack(swiglu="liger").run(m, g, g).dtype
        torch.bfloat16
        """
        flat = captured._flat_inputs(inputs, kwargs)
        p = plan(self, captured)
        if p.inert:
            warnings.warn(f"stack {self.name} on {captured.name}: " + "; ".join(
                f"{f} inert ({why})" for f, why in p.inert), RuntimeWarning, stacklevel=3)
        return captured.outputs(execute(captured, p, flat))


def _key(v: Any) -> Any:
    if isinstance(v, OpPreset):
        return ("preset", id(v))
    if isinstance(v, (Policy, Math)):
        return (type(v).__name__, repr(v))
    return v


def _short(v: Any) -> str:
    if isinstance(v, OpPreset):
        return v.library
    if isinstance(v, (Policy, Math)):
        return v.name
    if isinstance(v, Matmul):
        return v.describe()
    return str(v)


def preset_status(p: OpPreset) -> str:
    """A preset's verified status: its own, else its library's, else "user preset"."""
    if p.verified is not None:
        return p.verified
    if p.library in libraries():
        return library(p.library).verified
    return "a user's preset, not verified"


def _describe_choice(f: str, v: Any) -> str:
    if f == "policy":
        return f"{v.describe():14} castlab's regions' rounding (castlab.Policy)"
    if f == "math":
        cpu = _cpu_counterpart(v)
        return (f"{v.name:14} castlab's regions' math preset (castlab.Math)"
                + (f"; on CPU inputs {cpu} (the same compiler's C++ kernels)" if cpu else ""))
    if f == "stores":
        if v is None:
            return f"{'regions':14} each castlab region rounds the values it hands on"
        return (f"{v:14} rounded where torch.compile's Inductor kernels store them, read "
                "from this model's compiled program (values a kernel recomputes stay fp32; "
                "castlab.torch._inductor) [torch.compile run by PyTorch itself]")
    if f == "attention":
        return (f"{v or 'default':14} " + ("PyTorch's own choice of SDPA backend" if v is None
                                           else f"SDPA forced to SDPBackend.{BACKENDS[v]}")
                + " [run by PyTorch itself]")
    if f == "matmul":
        return f"{v.describe()} [run by PyTorch itself]"
    if v is None:
        return "as captured"
    ps = ([v] if isinstance(v, OpPreset) else
          [library(v)[op] for op in _PRESET_OPS[f] if op in library(v).presets])
    if isinstance(v, str) and f == "rms_norm" and v == "vllm":
        ps = [VLLM_RMS_NORM]
    return "; ".join(f"{p.library} {p.op}: {p.summary} [source: {p.source}] "
                     f"[{preset_status(p)}]" for p in ps)


# ---------------------------------------------------------------- built-in stacks

VLLM_RMS_NORM = _vllm_rms_norm()

#: A math preset that names a GPU compiler, and the preset of the same compiler's CPU
#: kernels: a stack with that math runs the latter on CPU inputs (torch.compile's Inductor
#: writes Triton for the GPU and C++ for the CPU: other functions, no contraction, other
#: reduction orders).
CPU_MATH = {"inductor": "inductor_cpu"}


def _cpu_counterpart(m: Math) -> str | None:
    """The preset CPU_MATH names for `m`, where `m` is that GPU preset unchanged."""
    cpu = CPU_MATH.get(m.name)
    return cpu if cpu is not None and m == Math.preset(m.name) else None


def device_math(m: Math, flat: list) -> Math:
    """The stack's math for these inputs: its CPU counterpart (CPU_MATH) where every tensor
    input is on the CPU."""
    cpu = _cpu_counterpart(m)
    if cpu is None:
        return m
    devs = {t.device.type for t in flat if isinstance(t, torch.Tensor)}
    return Math.preset(cpu) if devs <= {"cpu"} else m


def inductor_math(m: Math) -> Math:
    """`m` with Inductor's online softmax as the process's Inductor config sets it (the
    setting torch.compile of the model runs under)."""
    from torch._inductor import config as iconfig

    on = bool(getattr(iconfig, "online_softmax", True))
    return m if m.online_softmax == on else dataclasses.replace(m, online_softmax=on)


_INDUCTOR_NOTE = ("torch.compile under Inductor's default settings: castlab's regions compute in "
                  "fp32 with the inductor math preset on a GPU (Triton's division and exp, FMA "
                  "contraction) and inductor_cpu on the CPU (its C++ kernels: SLEEF's functions, "
                  "no contraction, vector-lane reductions), drop explicit casts inside a kernel "
                  "(round_casts=False, as "
                  "emulate_precision_casts=False does) and compute each value as the compiled "
                  "program's kernel that stores or reads it does (stores='inductor': read from "
                  "this model's compiled program, every load of the generated code recorded): "
                  "rounded where a kernel loads it from a bf16 buffer, fp32 where a kernel "
                  "recomputes it or keeps it from its own store")


def _builtins() -> dict:
    b = {}

    def add(name: str, **kw: Any) -> None:
        b[name] = Stack(name=name, **kw)

    add("hf_eager", policy="eager", math="torch_eager",
        notes=("Hugging Face's model run by PyTorch eager: castlab's eager policy reproduces "
               "it (tests/test_stacks.py: logits bit-identical on tiny Llama and Qwen2)",))
    add("torch_compile", policy=Policy("fused", round_casts=False), math="inductor",
        stores="inductor", notes=(_INDUCTOR_NOTE,))
    add("torch_compile_emulate", policy="eager", math="torch_eager",
        notes=("torch.compile with Inductor's emulate_precision_casts=True: each bf16/fp16 "
               "value rounded as eager rounds it, PyTorch's own libdevice functions; castlab's "
               "eager policy with torch_eager math gives its values (tests/test_torch_capture.py "
               "on the CPU; on an H200, 0 of 13 compared values of a 2-layer Llama differed)",))
    add("liger", swiglu="liger", geglu="liger", rope="liger", rms_norm="liger",
        notes=("apply_liger_kernel_to_llama/qwen2 (rope, swiglu, rms_norm) and "
               "apply_liger_kernel_to_gemma (rope, geglu, rms_norm: its 1 + w form)",))
    add("unsloth", swiglu="unsloth", rope="unsloth", rms_norm="unsloth",
        notes=("Unsloth's fast_rms_layernorm (Llama form; Gemma: its 1 + w kernel): from "
               "source, not run on a GPU; SwiGLU and RoPE verified",))
    add("vllm", swiglu="vllm", rope="vllm", rms_norm=VLLM_RMS_NORM, attention="flash",
        notes=("vLLM's silu_and_mul, rotary_embedding (cos/sin cache in the model's dtype), "
               "rms_norm for the first input norm and fused_add_rms_norm after each residual "
               "add; attention: PyTorch's flash SDPA backend stands in for vLLM's flash-attn "
               "kernel (not the same kernel); from source, not run on a GPU",))
    add("transformer_engine", swiglu="transformer_engine", rms_norm="transformer_engine",
        notes=("TE's fused RoPE computes cos/sin from fp32 angles in the kernel; a captured "
               "model hands cos/sin, so rope is as captured; TE's attention is its own fused "
               "kernel (cuDNN), left to PyTorch's SDPA choice here; from source, not run on a "
               "GPU",))
    return b


_BUILTIN = _builtins()


def stacks() -> list[str]:
    """The names of the built-in stacks.

    >>> import castlab.torch as ct
    >>> "liger" in ct.stacks()
    True
    """
    return list(_BUILTIN)


def stack(s: Any) -> Stack:
    """A Stack from a built-in name or a Stack (returned as is).

    >>> from castlab.torch._stacks import stack
    >>> stack("vllm").attention
    'flash'
    """
    if isinstance(s, Stack):
        return s
    if isinstance(s, str):
        if s not in _BUILTIN:
            raise ValueError(f"unknown stack {s!r}; built-in stacks: {', '.join(_BUILTIN)} "
                             "(or build one: castlab.torch.Stack(base=..., rope=..., ...))")
        return _BUILTIN[s]
    raise TypeError(f"a stack is a built-in name or a castlab.torch.Stack, not "
                    f"{type(s).__name__}")


# ---------------------------------------------------------------- a stack on a model

@dataclasses.dataclass
class Plan:
    """A stack resolved against one captured model: the kernels that apply
    ({kind: OpPreset}), and the choices that do not (``inert``: (field, why))."""

    stack: Stack
    kernels: dict
    inert: list
    attention: str | None
    matmul: Matmul

    def effective(self) -> dict:
        """{field: what runs}: the value each choice has on this model (an inert choice
        is None, as captured), comparable between two plans of one model."""
        out: dict = {"policy": repr(self.stack.policy), "math": repr(self.stack.math),
                     "stores": self.stack.stores}
        for k in KERNEL_KINDS:
            p = self.kernels.get(k)
            out[k] = None if p is None else id(p)
        out["attention"] = self.attention
        out["matmul"] = tuple(sorted(self.matmul.set().items()))
        return out


def plan(s: Any, captured: Any) -> Plan:
    """Resolve stack `s` against `captured`: each kernel choice becomes the preset of the
    op the model's instances take (rms_norm_gemma for Gemma's ``1 + w``), and choices the
    model has no instance of, or that no preset of the library fits, are inert (listed
    with why).

    >>> import torch, castlab.torch as ct
    >>> g = torch.ones(2, 4, dtype=torch.bfloat16)
    >>> m = ct.capture(lambda g, u: torch.nn.functional.silu(g) * u, g, g)
    >>> from castlab.torch._stacks import plan
    >>> plan("liger", m).inert
    [('geglu', 'the model has no geglu instance'), ('rope', 'the model has no rope instance'), ('rms_norm', 'the model has no rms_norm instance')]
    """
    s = stack(s)
    regions = captured.regions()
    kinds = regions.kinds
    kernels, inert = {}, []
    for kind in KERNEL_KINDS:
        v = getattr(s, kind)
        if v is None:
            continue
        if kind not in kinds:
            inert.append((kind, f"the model has no {kind} instance"))
            continue
        op = _regions._preset_op(kind, regions, captured.name)
        if isinstance(v, str):
            lib = library(v)
            if v == "vllm" and kind == "rms_norm" and op == "rms_norm":
                kernels[kind] = VLLM_RMS_NORM
                continue
            if op not in lib.presets:
                inert.append((kind, f"{v} has no {op} preset (this model's {kind} form)"))
                continue
            v = lib[op]
        if v.op != op:
            inert.append((kind, f"{v.library}'s {v.op} preset does not fit this model's "
                                f"{kind} (it takes {op})"))
            continue
        if v.inputs and len(v.inputs) < len(_regions.KERNEL_INPUTS[kind]):
            inert.append((kind, f"{v.library}'s {op} preset takes {v.inputs}; the captured "
                                f"{kind} hands {_regions.KERNEL_INPUTS[kind]}"))
            continue
        kernels[kind] = v
    att = s.attention
    if att is not None and "attention" not in kinds:
        inert.append(("attention", "the model makes no scaled_dot_product_attention call"))
        att = None
    mm = s.matmul
    if mm.set() and "matmul" not in kinds:
        inert.append(("matmul", "the model has no matmul"))
        mm = Matmul()
    return Plan(s, kernels, inert, att, mm)


def execute(captured: Any, p: Plan, flat: list) -> Any:
    """Run `captured` on flat inputs under plan `p`; returns the Run (every value). A
    backend PyTorch refuses for the model's SDPA calls is a RuntimeError naming it."""
    pol, mth = p.stack.policy, device_math(p.stack.math, flat)
    segs = _regions.run_segments(captured, p.kernels or None, pol)
    if p.stack.stores == "inductor" and pol.name != "fp64":
        segs = _inductor.segments_for(captured, segs, flat)
        mth = inductor_math(mth)
    try:
        with torch.no_grad(), matmul_flags(p.matmul), sdpa_context(p.attention):
            return captured.execute(flat, pol, mth, segments=segs)
    except RuntimeError as e:
        # (PyTorch's refusals: "No viable backend ..." on the CPU, "No available kernel.
        # Aborting execution." where no chosen CUDA kernel takes the call, such as the
        # memory-efficient kernel with grouped-query heads)
        why = str(e).lower()
        if p.attention is None or ("backend" not in why and "no available kernel" not in why):
            raise
        dev = sorted({str(t.device) for t in flat if isinstance(t, torch.Tensor)}) or ["cpu"]
        raise RuntimeError(
            f"stack {p.stack.name}: PyTorch refuses attention={p.attention!r} "
            f"(SDPBackend.{BACKENDS[p.attention]}) for {captured.name}'s "
            f"scaled_dot_product_attention calls on {', '.join(dev)}: {e}") from e


def run_with(captured: Any, s: Any, inputs: tuple, kwargs: dict | None, policy: Any,
             math: Any, kernels: Any) -> Any:
    """``captured.run(*inputs, stack=s)``: the stack's policy, math and kernels, which
    the call must not also give."""
    given = [k for k, v in (("policy", policy), ("math", math), ("kernels", kernels))
             if v is not None]
    if given:
        raise ValueError(f"{captured.name}.run: stack= sets the policy, math and kernels; "
                         f"drop {', '.join(given)} (or use Stack(base=..., ...) to change them)")
    return stack(s).run(captured, *inputs, kwargs=kwargs)
