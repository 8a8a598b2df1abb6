"""Kernel-library presets: the SwiGLU and RoPE kernels people run, as castlab graphs.

A library's kernel differs from PyTorch eager in where it rounds and in which formula it
evaluates; castlab names both. Each preset is an ordinary castlab function (the library's
formula, operand order included, since it decides which product an fma absorbs), the
:class:`~castlab.Policy` that places the library's roundings, and the
:class:`~castlab.Math` of its compiler and functions. One name per library selects all of
them for every op it covers:

>>> import castlab as cl
>>> lib = cl.library("liger")
>>> lib.ops
('swiglu', 'swiglu_backward', 'geglu', 'rope', 'rope_backward', 'rms_norm', 'rms_norm_gemma')
>>> a, b = cl.randn(4, 8, seed=0, dtype=cl.bfloat16), cl.randn(4, 8, seed=1, dtype=cl.bfloat16)
>>> y = lib.swiglu(a, b)                                  # runs castlab's reproduction
>>> lib["swiglu"].policy.round_after
('silu',)
>>> f = cl.jit(lib["swiglu"].fn, policy=lib["swiglu"].policy, math=lib.math)  # same thing

Inputs, per op (the tensors each library's kernel reads; shapes as in Hugging Face):

- ``swiglu(a, b)``: gate ``a`` and up ``b``, same shape and dtype.
- ``swiglu_backward(dc, a, b)`` -> ``(da, db)``.
- ``geglu(a, b)``: Gemma's ``gelu(a, approximate="tanh") * b`` (PyTorch eager and Liger).
- ``rope(x, cos, sin)``: ``x`` [..., S, D]; ``cos``/``sin`` [S, R] as Hugging Face builds
  them (``cat(freqs, freqs)``, R = rotary dims <= D, the rest of ``x`` passes through), in
  the dtype of the cache the library reads. Libraries that compute cos/sin in the kernel
  (``apex``, ``transformer_engine``) take ``rope(x, freqs)``: the fp32 angles [S, R]
  (``cat(freqs, freqs)``; for the interleaved layout, ``repeat_interleave(freqs, 2)``).
- ``rope_backward(dy, cos, sin)`` (or ``(dy, freqs)``) -> ``dx``.
- ``rope_interleaved`` / ``rope_interleaved_backward``: the GPT-J layout (pairs
  ``x[2i], x[2i+1]`` rotate together; cos/sin [S, R] read at column i for pair i).
- ``rms_norm(x, weight, *, eps=1e-6)``: RMSNorm over the last dim of ``x`` [..., H],
  ``weight`` [H] in x's dtype (eps keyword-only, default ``castlab._presets_norm.EPS``;
  a captured model's kernels pass the model's): Llama's ``norm(x) * weight``.
- ``rms_norm_gemma(x, weight)``: Gemma's ``norm(x) * (1 + weight)`` (the stored weight is
  the offset from 1).
- ``fused_add_rms_norm(x, residual, weight)`` -> ``(y, z)``: ``z = x + residual`` in the
  storage dtype (the decoder layer's residual add; vLLM's kernel stores it as the new
  residual) and ``y = rms_norm(z, weight)``.

Every preset is written from the library's source (cited in its ``source``) and marked
by ``verified``: whether it has been run against the library itself
(docs/kernel_libraries.md, "Status"). tests/test_presets.py checks
each against a NumPy reference of the library's formula on the CPU;
tests/test_presets_cuda.py against the library on the GPU. ``castlab.study.libraries``
measures them all against Hugging Face eager and fp64.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable

from . import _presets_norm as _norm
from ._dtype import float32
from ._jit import JitFunction, jit
from .ops import cat, cos, gelu, reshape, sigmoid, silu, sin, stack, tanh
from .policy import Math, Policy, as_math, as_policy

__all__ = ["Library", "OpPreset", "library", "libraries", "coverage", "OPS", "ROW_OPS",
           "VERIFIED", "VERIFIED_H100", "NOT_RUN", "BASELINE"]

#: The ops a library preset can cover, in display order.
OPS = ("swiglu", "swiglu_backward", "geglu", "rope", "rope_backward", "rope_interleaved",
       "rope_interleaved_backward", "rms_norm", "rms_norm_gemma", "fused_add_rms_norm")

#: The ops over whole rows (RMSNorm): castlab.testing's bounds enumerate the inputs of
#: elementwise ops one element at a time, so they leave these out.
ROW_OPS = ("rms_norm", "rms_norm_gemma", "fused_add_rms_norm")

#: ``Library.verified`` of a library whose kernels tests/test_presets_cuda.py ran on the
#: H200 with 0 mismatches against castlab's presets, and of one written from source only.
VERIFIED = "verified against the library on the H200"
VERIFIED_H100 = "verified against the library on an H100"
NOT_RUN = "from source, not run"
#: ``torch_eager``'s: the eager code the others are measured against
BASELINE = "the baseline: PyTorch eager"


@dataclasses.dataclass(frozen=True)
class OpPreset:
    """One library's op: its formula as a castlab function, the policy placing the
    library's roundings, the math of its compiler, and where it comes from.

    >>> p = cl.library("flash_attn")["rope"]
    >>> p.policy.name, p.math.fma
    ('fused', True)
    """

    library: str
    op: str
    fn: Callable
    policy: Policy
    math: Math
    summary: str        # where it rounds, which formula: one line
    source: str         # file and lines (with the commit read), as a URL
    #: the arguments the op takes, by name: ("x", "c", "s") for RoPE from a cos/sin
    #: cache, ("x", "freqs") for RoPE from the fp32 angles (the first is the cotangent
    #: for a backward op)
    inputs: tuple = ()
    #: gradients by castlab's autodiff instead of a formula of the library's own:
    #: (forward function, argnums); the op is called as (cotangent, *other primals)
    grad_of: tuple | None = None
    #: this op's own VERIFIED / NOT_RUN where it differs from its library's (an op added
    #: after the library's others were run against it); None: the library's
    verified: str | None = None

    def jit(self) -> JitFunction:
        """The op as a ``cl.jit`` function under the preset's policy and math (cached).

        >>> swiglu = cl.library("liger")["swiglu"].jit()
        """
        key = (self.library, self.op)
        j = _JITS.get(key)
        if j is None:
            j = _JITS[key] = jit(self.grad_of[0] if self.grad_of else self.fn,
                                 policy=self.policy, math=self.math)
        return j

    def __call__(self, *args):
        """Run the preset on castlab tensors (any device).

        >>> x = cl.randn(1, 2, 4, 8, seed=0, dtype=cl.bfloat16)
        >>> freqs = cl.randn(4, 8, seed=1)
        >>> y = cl.library("transformer_engine")["rope"](x, freqs)
        """
        return self._run(args)

    def reference(self, *args):
        """The library's own formula on the same inputs in fp64, with no rounding anywhere
        (``Policy("fp64")``, castlab's portable fp64 functions): what a correctly rounded
        kernel of this library would round once.

        >>> a, b = cl.randn(4, 8, seed=0, dtype=cl.bfloat16), cl.randn(4, 8, seed=1, dtype=cl.bfloat16)
        >>> cl.library("liger")["swiglu"].reference(a, b).dtype
        castlab.float64
        """
        return self._run(args, policy="fp64", math="portable")

    def _run(self, args: tuple, **how):
        if self.grad_of is None:
            return self.jit().run(*args, **how) if how else self.jit()(*args)
        dy, primals = self._primals(args)
        return self.jit().backward(*primals, grad_outputs=dy, argnums=self.grad_of[1], **how)

    def _primals(self, args: tuple) -> tuple:
        """(cotangent, primals) of a backward op's call. Autodiff, called as the library
        ops are: swiglu_backward(dc, a, b) has every primal; rope_backward(dy, cos, sin)
        lacks x, which RoPE's gradient (linear in x) never reads: dy stands in for it as
        a tensor of the right shape and dtype."""
        dy, *rest = args
        return dy, (rest if self.op.startswith("swiglu") else [dy, *rest])

    def _runs(self, args: tuple) -> list:
        """The (jit function, args, policy, math) that calling the op and its
        ``reference`` on `args` run (castlab._jit.warm compiles them ahead)."""
        j = self.jit()
        if self.grad_of is not None:
            dy, primals = self._primals(args)
            j, args = j.backward_fn(len(primals), self.grad_of[1]), (*primals, dy)
        return [(j, tuple(args), j.policy, j.math),
                (j, tuple(args), as_policy("fp64"), as_math("portable"))]

    def trace(self, *args) -> str:
        """The listing of the graph castlab runs for these inputs (casts shown)."""
        return self.jit().trace(*args)


_JITS: dict = {}


@dataclasses.dataclass(frozen=True)
class Library:
    """The presets of one kernel library, by op. ``lib.swiglu(a, b)`` runs one;
    ``lib["swiglu"]`` is its :class:`OpPreset`; an op the library does not have raises
    a ValueError that lists which libraries cover which ops.

    >>> cl.library("flash_attn").swiglu          # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: flash_attn has no swiglu kernel...
    """

    name: str
    summary: str
    url: str
    math: Math
    presets: dict
    verified: str = NOT_RUN

    @property
    def ops(self) -> tuple:
        return tuple(op for op in OPS if op in self.presets)

    def __getitem__(self, op: str) -> OpPreset:
        try:
            return self.presets[op]
        except KeyError:
            raise ValueError(_missing(self.name, op)) from None

    def __getattr__(self, op: str):
        if op.startswith("_") or op not in OPS:
            raise AttributeError(op)
        return self[op]

    def status(self, op: str, dtype: str) -> str:
        """Whether this op in this dtype has been run against the library itself.

        >>> cl.library("flash_attn").status("rope", "bfloat16")
        'verified against the library on the H200'
        >>> cl.library("vllm").status("rms_norm", "bfloat16")
        'from source, not run'
        """
        p = self.presets.get(op)
        return p.verified if p is not None and p.verified is not None else self.verified

    def describe(self) -> str:
        """One line per op: where it rounds, which formula, the source."""
        lines = [f"{self.name}: {self.summary} ({self.url}) [{self.verified}]"]
        lines += [f"  {p.op}: {p.summary} [{p.source}]"
                  + (f" [{p.verified}]" if p.verified is not None else "")
                  for p in self.presets.values()]
        return "\n".join(lines)


def _missing(name: str, op: str) -> str:
    by_op = coverage()
    if op not in by_op:
        return (f"unknown op {op!r}; kernel-library presets cover: " + ", ".join(OPS))
    table = "; ".join(f"{o}: {', '.join(libs)}" for o, libs in by_op.items())
    return (f"{name} has no {op} kernel, so castlab has no {op} preset for it. "
            f"Presets by op: {table}")


# ---------------------------------------------------------------- formulas

def _split(x, rd: int):
    """The rotary part of x's last dim and the part that passes through (or None)."""
    d = x.shape[-1]
    if rd > d or rd % 2:
        raise ValueError(f"RoPE: rotary dims {rd} must be even and <= head dim {d}")
    return (x, None) if rd == d else (x[..., :rd], x[..., rd:])


def _join(out, rest, dt):
    out = out.astype(dt)
    return out if rest is None else cat([out, rest], dim=-1)


def _rope_hf(x, c, s):
    """Hugging Face's apply_rotary_pos_emb: x*cos + rotate_half(x)*sin, cos/sin
    [S, R] = cat(freqs, freqs); dims past R pass through (partial rotary)."""
    xr, rest = _split(x, c.shape[-1])
    h = c.shape[-1] // 2
    rot = cat([-xr[..., h:], xr[..., :h]], dim=-1)
    return _join(xr * c + rot * s, rest, x.dtype)


def _rope_interleaved_rot(x, c, s):
    """GPT-J layout, TransformerEngine's form: x*cos + rot(x)*sin with
    rot(x)[2i] = -x[2i+1], rot(x)[2i+1] = x[2i]; cos/sin per element."""
    xr, rest = _split(x, c.shape[-1])
    p = reshape(xr, *xr.shape[:-1], xr.shape[-1] // 2, 2)
    rot = reshape(stack([-p[..., 1], p[..., 0]], dim=-1), *xr.shape)
    return _join(xr * c + rot * s, rest, x.dtype)


def _rope_interleaved_torch(x, c, s):
    """flash-attn's PyTorch reference, apply_rotary_emb_torch(interleaved=True): cos/sin
    read at column i for pair i and repeated to (d 2), then x*cos + rot(x)*sin."""
    h = c.shape[-1] // 2
    c, s = (reshape(stack([t[..., :h], t[..., :h]], dim=-1), *t.shape) for t in (c, s))
    return _rope_interleaved_rot(x, c, s)


def _hf_swiglu(a, b):
    return silu(a) * b


def _hf_geglu(a, b):
    """Gemma's MLP: ``gelu(gate, approximate="tanh") * up``, each op rounded (eager)."""
    return gelu(a, approximate="tanh") * b


def _liger_geglu(a, b):
    """Liger's ``_geglu_tanh_forward_kernel``: a in fp32, ``0.5 * a * (1 + tanh(
    sqrt(2/pi) * (a + 0.044715 * a**3)))`` (Triton contracts ``a + 0.044715 * a3`` into
    an fma; libdevice tanhf), rounded to b's dtype, times b in that dtype."""
    h = a.astype(float32)
    inner = 0.7978845608028654 * (h + 0.044715 * (h * h * h))
    g = 0.5 * h * (1.0 + tanh(inner))
    return g.astype(b.dtype) * b


def _from_freqs(round_to_input: bool, conj: bool, interleaved: bool = False):
    """RoPE with cos/sin computed from fp32 angles inside the kernel (sincosf), cast to
    the input dtype first (Apex, TransformerEngine's unfused path) or kept in fp32
    (TransformerEngine fused). `conj`: the backward, sin negated."""
    body = _rope_interleaved_rot if interleaved else _rope_hf

    def rope_from_freqs(x, freqs):
        c, s = cos(freqs), sin(freqs)
        if round_to_input:
            c, s = c.astype(x.dtype), s.astype(x.dtype)
        return body(x, c, -s if conj else s)

    return rope_from_freqs


# Liger/Unsloth RoPE: x cast to the cos/sin dtype, then `x1*c - x2*s`, `x2*c + x1*s` in
# that dtype. With a bf16/fp16 cache Triton computes in that dtype: mul.bf16 for one
# product, and fma.rn.bf16 (one rounding of the exact value) for the other product with
# the add/sub. Which product LLVM's fp fusion takes was measured on the H200 against
# Liger-Kernel 0.8.5 (its PTX: mul.bf16 / neg.bf16 / fma.rn.bf16, no other arithmetic):
#   forward   x1*c - x2*s: x1*c fused;  x2*c + x1*s: x1*s fused
#   backward  x1*c + x2*s: x2*s fused;  x2*c - x1*s: x2*c fused
# In castlab's trace the forward's products are t6 (x1*c), t7 (x2*s), t9 (x2*c), t10
# (x1*s), the sub t8 and the add t11; the backward negates sin first (t2), so it computes
# x1*c - x2*(-s) (t7, t8, t9) and x2*c + x1*(-s) (t10, t11, t12). The policies round the
# product that is not fused and the add/sub; Math.fma_rounding="storage" makes the fma
# round once. Unsloth's kernel negates sin for its backward and keeps the forward's
# sub/add, so its backward fuses like the forward (as measured against Unsloth's kernels).
_LIGER_ROPE_ROUNDED = {(False, "liger"): (7, 8, 9, 11), (True, "liger"): (8, 9, 11, 12),
                       (False, "unsloth"): (7, 8, 9, 11), (True, "unsloth"): (8, 9, 10, 12)}


def _liger_rope(conj: bool):
    def liger_rope(x, c, s):
        rd = c.shape[-1]
        h = rd // 2
        c, s = c[..., :h], s[..., :h]                                     # t0, t1
        if conj:
            s = -s                                                        # (t2)
        if rd > x.shape[-1] or rd % 2:
            raise ValueError(f"RoPE: rotary dims {rd} must be even and <= head dim "
                             f"{x.shape[-1]}")
        xr = x[..., :rd].astype(c.dtype)                                  # t2, t3
        x1, x2 = xr[..., :h], xr[..., h:]                                 # t4, t5
        o1 = x1 * c - x2 * s                                              # t6 t7 t8
        o2 = x2 * c + x1 * s                                              # t9 t10 t11
        out = cat([o1, o2], dim=-1).astype(x.dtype)
        if rd == x.shape[-1]:
            return out
        return cat([out, x[..., rd:]], dim=-1)                            # pass-through

    return liger_rope


def _liger_rope_policy(conj: bool, lib: str = "liger") -> Policy:
    return Policy("custom", round_after=_LIGER_ROPE_ROUNDED[(conj, lib)])


def _pairs_fp32(flash: bool, interleaved: bool, conj: bool):
    """flash-attn's and vLLM's RoPE: x, cos, sin widened to fp32, pairs (x0, x1) rotated
    as x0*c - x1*s and (flash-attn) x0*s + x1*c or (vLLM) x1*c + x0*s, one rounding."""

    def rope_fp32(x, c, s):
        rd = c.shape[-1]
        h = rd // 2
        c, s = c[..., :h].astype(float32), s[..., :h].astype(float32)
        if conj:
            s = -s
        xr, rest = _split(x, rd)
        xr = xr.astype(float32)
        if interleaved:
            p = reshape(xr, *xr.shape[:-1], h, 2)
            x0, x1 = p[..., 0], p[..., 1]
        else:
            x0, x1 = xr[..., :h], xr[..., h:]
        o0 = x0 * c - x1 * s
        o1 = x0 * s + x1 * c if flash else x1 * c + x0 * s
        if interleaved:
            out = reshape(stack([o0, o1], dim=-1), *xr.shape)
        else:
            out = cat([o0, o1], dim=-1)
        return _join(out, rest, x.dtype)

    return rope_fp32


def _liger_swiglu_backward(dc, a, b):
    # Liger swiglu.py: recompute sigmoid and silu in fp32; db = dc*silu, da =
    # dc*(silu*(1-sig) + sig)*b, each rounded once on store
    sig = sigmoid(a)
    silu_a = a * sig
    db = dc * silu_a
    da = dc * (silu_a * (1.0 - sig) + sig) * b
    return da, db


def _unsloth_swiglu_backward(dc, a, b):
    # Unsloth swiglu.py _DWf_DW_dfg_kernel: f = e*sig rounded to the dtype (t1), df = dW*f,
    # dg = dW*g rounded (t3), de = dg*sig*(1 + e*(1-sig)) rounded once
    sig = sigmoid(a)                      # t0
    f = a * sig                           # t1: rounded
    db = dc * f                           # t2
    dg = dc * b                           # t3: rounded
    da = dg * sig * (1.0 + a * (1.0 - sig))
    return da, db


_UNSLOTH_SWIGLU_BWD = Policy("custom", round_after=(1, 3))
_ROUND_SILU = Policy("custom", round_after=("silu",))

# ---------------------------------------------------------------- the libraries

_GH = "https://github.com/"
_LIGER = _GH + "linkedin/Liger-Kernel/blob/v0.8.5/src/liger_kernel/ops/"
_UNSLOTH = _GH + "unslothai/unsloth/blob/015bdef0d94a241bcd94eec7a405b1700632180d/unsloth/kernels/"
_FLASH = _GH + "Dao-AILab/flash-attention/blob/0251105a2fb19d2957484b7f023cd8c115286ced/flash_attn/"
_VLLM = _GH + "vllm-project/vllm/blob/"
_APEX = _GH + "NVIDIA/apex/blob/6424da3b4faa6c8f062da4a48c424fff3f02d42d/csrc/megatron/"
_TE = _GH + "NVIDIA/TransformerEngine/blob/d0067d0da6cb01811b8072a7d304f0e00344ce2b/transformer_engine/"

_EAGER = Policy("eager")
_FUSED = Policy("fused")


def _positional(fn: Callable) -> tuple:
    """The names of `fn`'s positional parameters (the tensors a preset reads; RMSNorm's
    keyword-only ``eps`` is not one)."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(n for n, p in inspect.signature(fn).parameters.items() if p.kind in kinds)


def _lib(name: str, summary: str, url: str, math: Math, ops: list,
         verified: str = NOT_RUN, extra: tuple = ()) -> Library:
    """A Library of `ops` (op, fn, policy, summary, source[, grad_of]) under `math`, and
    `extra` ops (op, fn, policy, summary, source, math, verified) that carry their own
    math and status (RMSNorm's, which add rsqrtf to the library's math)."""
    presets = {}
    for op, fn, policy, summ, source, *grad in ops:
        grad_of = grad[0] if grad else None
        args = tuple(inspect.signature(grad_of[0] if grad_of else fn).parameters)
        if grad_of and op.startswith("swiglu"):
            args = ("dc",) + args           # swiglu_backward(dc, a, b)
        elif op.startswith("rope") and op.endswith("_backward"):
            args = ("dy",) + args[1:]       # rope_backward(dy, cos, sin): dy in x's place
        presets[op] = OpPreset(name, op, fn, policy, math, summ, source, inputs=args,
                               grad_of=grad_of)
    for op, fn, policy, summ, source, mth, ver in extra:
        presets[op] = OpPreset(name, op, fn, policy, mth, summ, source,
                               inputs=_positional(fn), verified=ver)
    return Library(name, summary, url, math, presets, verified)

# ---------------------------------------------------------------- RMSNorm

_LIGER_WHEEL = _LIGER + "rms_norm.py"
# Unsloth's RMSNorm kernels as read (a later commit than its SwiGLU/RoPE files above)
_UNSLOTH_RMS = (_GH + "unslothai/unsloth/blob/0050c73e05ca9bb74e42d0649be410f177160c08/"
                "unsloth/kernels/rms_layernorm.py")
_VLLM_LN = (_VLLM + "0112cf233e0c60674c2844a09695ddeb2b901dc0/csrc/layernorm_kernels.cu")
_APEX_LN = _GH + ("NVIDIA/apex/blob/6424da3b4faa6c8f062da4a48c424fff3f02d42d/csrc/"
                  "layer_norm_cuda_kernel.cu")
_HF_MODELS = _GH + "huggingface/transformers/blob/main/src/transformers/models/"
# the eager-per-op rounding of the residual add (a fused-policy add is an output only)
_ROUND_ADDS = Policy("custom", round_after=("add",))


def _rms_norm_presets() -> dict:
    """RMSNorm's presets by library: (op, fn, policy, summary, source, math, verified).
    The CUDA kernels' maths add ``cuda_kernels`` to the library's: their ``rsqrtf`` (and
    Triton's libdevice rsqrt) is the GPU's approximate rsqrt.approx.f32."""
    eager = Math.preset("torch_eager")
    liger = Math("liger", impl="cuda", fma=True, silu="mul_sigmoid", sigmoid="ex2_approx",
                 division="approx", fma_rounding="storage", cuda_kernels=True)
    unsloth = dataclasses.replace(liger, name="unsloth")
    cuda = {n: Math(n, impl="cuda", fma=True, cuda_kernels=True) for n in ("vllm", "apex")}
    te = dataclasses.replace(Math.preset("transformer_engine"), cuda_kernels=True)
    lrms = _norm.liger_rms_norm
    liger_src = "x in fp32; rstd = rsqrt(tl.sum(x*x)/n + eps) (Triton block order, fmas); "
    return {
        "torch_eager": [
            ("rms_norm", _norm.hf_rms_norm, _EAGER,
             "h = x.float(); weight * (h * rsqrt(mean(h**2) + eps)).to(dtype), per op",
             _HF_MODELS + "llama/modeling_llama.py#L53-L67", eager, BASELINE),
            ("rms_norm_gemma", _norm.hf_rms_norm_gemma, _EAGER,
             "h = x.float(); (h * rsqrt(mean(h**2) + eps) * (1 + w.float())).type_as(x)",
             _HF_MODELS + "gemma/modeling_gemma.py#L64-L78", eager, BASELINE),
            ("fused_add_rms_norm", _norm.hf_fused_add_rms_norm, _EAGER,
             "z = residual + x rounded (the decoder layer's add), then LlamaRMSNorm(z)",
             _HF_MODELS + "llama/modeling_llama.py#L53-L67", eager, BASELINE),
        ],
        "liger": [
            ("rms_norm", lrms("llama", 0.0), _FUSED,
             liger_src + "casting_mode llama: (x*rstd).to(dtype) * (0.0 + w) in fp32, "
             "rounded (LigerRMSNorm, apply_liger_kernel_to_llama/qwen2)",
             _LIGER_WHEEL + "#L67-L150", liger, VERIFIED),
            ("rms_norm_gemma", lrms("gemma", 1.0), _FUSED,
             liger_src + "casting_mode gemma, offset 1: x*rstd*(1.0 + w.float()), one "
             "rounding (LigerRMSNormForGemma, apply_liger_kernel_to_gemma)",
             _LIGER_WHEEL + "#L106-L150", liger, VERIFIED),
        ],
        "liger_casting_gemma": [
            ("rms_norm", lrms("gemma", 0.0), _FUSED,
             liger_src + "casting_mode gemma, offset 0: x*rstd*w.float(), one rounding",
             _LIGER_WHEEL + "#L106-L150", liger, VERIFIED),
        ],
        "unsloth": [
            ("rms_norm", _norm.unsloth_rms_norm(False), _FUSED,
             "x in fp32; rstd = tl.math.rsqrt(tl.sum(x*x)/n + eps) (Liger's order; n, strides "
             "and eps constexpr); (x*rstd).to(w.dtype) * w, stored in x's dtype "
             "(fast_rms_layernorm)", _UNSLOTH_RMS + "#L21-L59", unsloth, VERIFIED_H100),
            ("rms_norm_gemma", _norm.unsloth_rms_norm(True), _FUSED,
             "x and w in fp32: x*rstd*(w + 1.0), one rounding (fast_rms_layernorm, gemma=True)",
             _UNSLOTH_RMS + "#L122-L158", unsloth, VERIFIED_H100),
        ],
        "vllm": [
            ("rms_norm", _norm.vllm_rms_norm, _FUSED,
             "fp32 x*x fmas per thread (stride min(H, 1024)), cub BlockReduce; "
             "(T)(x * rsqrtf(var/H + eps)) * w in T", _VLLM_LN + "#L19-L48", cuda["vllm"],
             NOT_RUN),
            ("fused_add_rms_norm", _norm.vllm_fused_add_rms_norm, _ROUND_ADDS,
             "z = input + residual in T, stored as the new residual; RMSNorm of z (width-8 "
             "vectors' sum_squares when H % 8 == 0)", _VLLM_LN + "#L50-L216", cuda["vllm"],
             NOT_RUN),
        ],
        "apex": [
            ("rms_norm", _norm.apex_rms_norm, _FUSED,
             "sigma2 = sum(x*x)/n in float; gamma * (V)(rsqrtf(sigma2 + eps) * x) "
             "(FusedRMSNorm; castlab's sum order stands in for Apex's)",
             _APEX_LN + "#L42-L150", cuda["apex"], NOT_RUN),
        ],
        "transformer_engine": [
            ("rms_norm", _norm.te_rms_norm(False), _FUSED,
             "fp32: rs = rsqrtf(rn*m2 + mu*mu + eps) from LayerNorm stats; (w * (rs*x)), "
             "one rounding (tuned kernel; castlab's sum order stands in for TE's)",
             _TE + "common/normalization/rmsnorm/rmsnorm_fwd_kernels.cuh#L72-L136", te,
             NOT_RUN),
            ("rms_norm_gemma", _norm.te_rms_norm(True), _FUSED,
             "zero_centered_gamma: (w + 1) * (rs*x) in fp32, one rounding",
             _TE + "common/normalization/rmsnorm/rmsnorm_fwd_kernels.cuh#L114-L119", te,
             NOT_RUN),
        ],
    }


def _triton_libs() -> list:
    """PyTorch eager (the baseline) and the Triton libraries: Liger, Unsloth."""
    triton_sig = dict(impl="cuda", fma=True, silu="mul_sigmoid", sigmoid="ex2_approx",
                      division="approx", fma_rounding="storage")
    rms = _rms_norm_presets()
    liger = Math("liger", **triton_sig)
    return [
        _lib("torch_eager",
             "Hugging Face modeling code (interleaved RoPE: flash-attn's PyTorch "
             "reference) under PyTorch eager: every op rounds",
             _GH + "huggingface/transformers/blob/main/src/transformers/models/qwen2/modeling_qwen2.py",
             Math.preset("torch_eager"), [
                 ("swiglu", _hf_swiglu, _EAGER,
                  "silu(a) = a/(1+expf(-a)) rounded, * b rounded",
                  "aten/src/ATen/native/cuda/ActivationSiluKernel.cu"),
                 ("swiglu_backward", None, _EAGER,
                  "autograd: dsilu = dc*b rounded; silu_backward dy*s*(1+x*(1-s)) rounded; "
                  "db = dc*silu(a) rounded (castlab's autodiff)",
                  "tools/autograd/derivatives.yaml", (_hf_swiglu, (0, 1))),
                 ("geglu", _hf_geglu, _EAGER,
                  "gelu(a, approximate='tanh') rounded, * b rounded (Gemma's MLP)",
                  "aten/src/ATen/native/cuda/ActivationGeluKernel.cu"),
                 ("rope", _rope_hf, _EAGER,
                  "x*cos + rotate_half(x)*sin, cos/sin cast to x.dtype, every op rounded",
                  "transformers models/qwen2/modeling_qwen2.py apply_rotary_pos_emb"),
                 ("rope_backward", None, _EAGER,
                  "autograd of the above (castlab's autodiff)",
                  "tools/autograd/derivatives.yaml", (_rope_hf, 0)),
                 ("rope_interleaved", _rope_interleaved_torch, _EAGER,
                  "GPT-J layout as flash-attn's PyTorch reference: x*cos + "
                  "rotate_every_two(x)*sin, every op rounded",
                  _FLASH + "layers/rotary.py#L12-L38"),
                 ("rope_interleaved_backward", None, _EAGER,
                  "autograd of the above (castlab's autodiff)",
                  "tools/autograd/derivatives.yaml", (_rope_interleaved_torch, 0)),
             ], BASELINE, extra=rms["torch_eager"]),
        _lib("liger", "Liger-Kernel 0.8.5 Triton kernels", _GH + "linkedin/Liger-Kernel",
             liger, [
                 ("swiglu", _hf_swiglu, _ROUND_SILU,
                  "silu = a*tl.sigmoid(a) in fp32, rounded to b's dtype, * b rounded",
                  _LIGER + "swiglu.py#L44-L75"),
                 ("swiglu_backward", _liger_swiglu_backward, _FUSED,
                  "fp32: db = dc*silu, da = dc*fma(silu, 1-sig, sig)*b, one rounding each",
                  _LIGER + "swiglu.py#L79-L105"),
                 ("rope", _liger_rope(False), _liger_rope_policy(False),
                  "x cast to the cos/sin dtype; x1*c - x2*s, x2*c + x1*s in that dtype: "
                  "one product rounded, the other in a native-dtype fma (x1*c, x1*s)",
                  _LIGER + "rope.py#L67-L104"),
                 ("rope_backward", _liger_rope(True), _liger_rope_policy(True),
                  "x1*c + x2*s, x2*c - x1*s; fused products x2*s, x2*c",
                  _LIGER + "rope.py#L105-L116"),
             ], VERIFIED, extra=rms["liger"] + [
                 ("geglu", _liger_geglu, _FUSED,
                  "LigerGELUMulFunction: 0.5*a*(1+tanh(sqrt(2/pi)*fma(0.044715, a^3, a))) in "
                  "fp32 (libdevice tanhf), rounded to b's dtype, * b rounded",
                  _LIGER + "geglu.py#L24-L45", liger, VERIFIED)]),
        _lib("liger_casting_gemma",
             "Liger-Kernel 0.8.5's LigerRMSNorm with casting_mode='gemma' and offset 0 "
             "(fp32 throughout: Gemma3n/4-style norms)", _GH + "linkedin/Liger-Kernel",
             Math("liger", impl="cuda", fma=True, division="approx"), [],
             VERIFIED, extra=rms["liger_casting_gemma"]),
        _lib("unsloth", "Unsloth Triton kernels", _GH + "unslothai/unsloth",
             Math("unsloth", **triton_sig), [
                 ("swiglu", _hf_swiglu, _ROUND_SILU,
                  "f = e*tl.sigmoid(e) in fp32, rounded to g's dtype, * g rounded",
                  _UNSLOTH + "swiglu.py#L37-L47"),
                 ("swiglu_backward", _unsloth_swiglu_backward, _UNSLOTH_SWIGLU_BWD,
                  "f and dW*g rounded like eager; de = dg*sig*fma(e, 1-sig, 1) rounded once",
                  _UNSLOTH + "swiglu.py#L86-L109"),
                 ("rope", _liger_rope(False), _liger_rope_policy(False, "unsloth"),
                  "Q cast to the cos/sin dtype; Q1*c - Q2*s, Q2*c + Q1*s in that dtype, "
                  "fused as Liger's forward",
                  _UNSLOTH + "rope_embedding.py#L129-L158"),
                 ("rope_backward", _liger_rope(True), _liger_rope_policy(True, "unsloth"),
                  "as rope with sin negated", _UNSLOTH + "rope_embedding.py#L140-L142"),
             ], VERIFIED, extra=rms["unsloth"]),
    ]


def _cuda_libs() -> list:
    """The CUDA and fused-kernel libraries: flash-attn, vLLM, Apex, TransformerEngine."""
    rms = _rms_norm_presets()
    return [
        _lib("flash_attn", "flash-attn's Triton rotary kernel (apply_rotary_emb)",
             _GH + "Dao-AILab/flash-attention", Math("flash_attn", impl="cuda", fma=True), [
                 ("rope", _pairs_fp32(True, False, False), _FUSED,
                  "x, cos, sin widened to fp32; x0*c - x1*s, x0*s + x1*c (fma); one rounding",
                  _FLASH + "ops/triton/rotary.py#L73-L88"),
                 ("rope_backward", _pairs_fp32(True, False, True), _FUSED,
                  "conjugate=True: as rope with sin negated", _FLASH + "ops/triton/rotary.py#L75-L76"),
                 ("rope_interleaved", _pairs_fp32(True, True, False), _FUSED,
                  "interleaved pairs, same formula", _FLASH + "ops/triton/rotary.py#L89-L99"),
                 ("rope_interleaved_backward", _pairs_fp32(True, True, True), _FUSED,
                  "interleaved, sin negated", _FLASH + "ops/triton/rotary.py#L75-L99"),
             ], VERIFIED),
        _lib("vllm", "vLLM's CUDA kernels (inference: forward only)",
             _GH + "vllm-project/vllm", Math("vllm", impl="cuda", fma=True, silu="div"), [
                 ("swiglu", _hf_swiglu, _EAGER,
                  "silu_and_mul: (T)(x/(1+expf(-x))) * y in T: two roundings, as eager",
                  _VLLM + "00ccbd42dc1f40412cc711c5737cc4be0e7a8145/csrc/activation_kernels.cu#L14-L48"),
                 ("rope", _pairs_fp32(False, False, False), _FUSED,
                  "NeoX: x*cos - y*sin, y*cos + x*sin in fp32 (nvcc fma), one rounding",
                  _VLLM + "0f5257e245116449bfbe78a87c22aeef632eba8f/csrc/pos_encoding_kernels.cu#L8-L33"),
                 ("rope_interleaved", _pairs_fp32(False, True, False), _FUSED,
                  "GPT-J layout, same formula",
                  _VLLM + "0f5257e245116449bfbe78a87c22aeef632eba8f/csrc/pos_encoding_kernels.cu#L20-L32"),
            ], extra=rms["vllm"]),
        _lib("apex", "Apex's Megatron fused RoPE (fused_apply_rotary_pos_emb)",
             _GH + "NVIDIA/apex", Math("apex", impl="cuda", fma=True), [
                 ("rope", _from_freqs(True, False), _EAGER,
                  "sincosf of fp32 angles cast to scalar_t; x*cos + rot*sin in scalar_t, "
                  "every op rounded", _APEX + "fused_rotary_positional_embedding.h#L27-L46"),
                 ("rope_backward", _from_freqs(True, True), _EAGER,
                  "cosf/sinf cast to scalar_t, sin negated on the rotated half, per op",
                  _APEX + "fused_rotary_positional_embedding.h#L62-L81"),
            ], extra=rms["apex"]),
        _lib("transformer_engine",
             "TransformerEngine: fused RoPE and its SwiGLU (fp32, one rounding)",
             _GH + "NVIDIA/TransformerEngine", Math.preset("transformer_engine"), [
                 ("swiglu", _hf_swiglu, _FUSED,
                  "silu = x*(1/(1+expf(-x))), * gate in fp32, one rounding",
                  _TE + "common/util/math.h#L39-L83"),
                 ("rope", _from_freqs(False, False), _FUSED,
                  "fp32 sincosf of fp32 angles (never rounded), fma(x, cos, rot*sin), "
                  "one rounding", _TE + "common/fused_rope/fused_rope.cu#L38-L91"),
                 ("rope_backward", _from_freqs(False, True), _FUSED,
                  "as rope with sin negated on the rotated half",
                  _TE + "common/fused_rope/fused_rope.cu#L93-L136"),
                 ("rope_interleaved", _from_freqs(False, False, True), _FUSED,
                  "interleaved: rot[2i] = -x[2i+1], rot[2i+1] = x[2i]",
                  _TE + "common/fused_rope/fused_rope.cu#L64-L75"),
                 ("rope_interleaved_backward", _from_freqs(False, True, True), _FUSED,
                  "interleaved, sin negated", _TE + "common/fused_rope/fused_rope.cu#L126-L135"),
            ], extra=rms["transformer_engine"]),
        _lib("transformer_engine_unfused",
             "TransformerEngine's unfused RoPE (apply_rotary_pos_emb, fused=False)",
             _GH + "NVIDIA/TransformerEngine", Math.preset("torch_eager"), [
                 ("rope", _from_freqs(True, False), _EAGER,
                  "torch.cos/sin(freqs).to(t.dtype), then t*cos + rotate_half(t)*sin eager",
                  _TE + "pytorch/attention/rope.py#L279-L317"),
                 ("rope_interleaved", _from_freqs(True, False, True), _EAGER,
                  "interleaved rotate_half, eager", _TE + "pytorch/attention/rope.py#L258-L317"),
             ]),
    ]


def _build() -> dict:
    libs = _triton_libs() + _cuda_libs()
    return {lib.name: lib for lib in libs}


_LIBRARIES = _build()


def libraries() -> list[str]:
    """The names of the kernel-library presets.

    >>> "liger" in cl.libraries()
    True
    """
    return list(_LIBRARIES)


def library(name: str) -> Library:
    """A kernel library's presets by name (see :func:`libraries`).

    >>> cl.library("vllm").ops
    ('swiglu', 'rope', 'rope_interleaved', 'rms_norm', 'fused_add_rms_norm')
    """
    if not isinstance(name, str):
        raise TypeError(f"library: name must be a str, not {type(name).__name__}")
    try:
        return _LIBRARIES[name]
    except KeyError:
        raise ValueError(f"unknown kernel library {name!r}; valid: "
                         + ", ".join(_LIBRARIES)) from None


def coverage() -> dict:
    """Which libraries cover which op: ``{op: [library, ...]}``.

    >>> cl.presets.coverage()["rope_interleaved"]
    ['torch_eager', 'flash_attn', 'vllm', 'transformer_engine', 'transformer_engine_unfused']
    """
    return {op: [n for n, lib in _LIBRARIES.items() if op in lib.presets] for op in OPS}
