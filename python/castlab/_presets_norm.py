"""The RMSNorm formulas of the kernel-library presets (castlab.presets): Hugging Face
eager, Liger-Kernel, Unsloth, vLLM, TransformerEngine and Apex, as castlab functions.

Each is ``f(x, weight)`` (``rms_norm``: ``y = norm(x) * weight``; ``rms_norm_gemma``: ``y =
norm(x) * (1 + weight)``) or ``f(x, residual, weight) -> (y, x + residual)``
(``fused_add_rms_norm``), over the last dim, with a keyword-only ``eps`` (default
:data:`EPS`, 1e-6: Qwen2's and Gemma's; Llama-3 uses 1e-5): an ordinary castlab function
of tensors that ``cl.jit`` traces (a captured model's stack passes the model's eps).

A kernel's sum of squares is written out in the order the kernel accumulates, as
castlab ops: each thread's partial sum (``acc + x*x``, which the library's compiler
contracts into an fma: ``Math(fma=True)``), then the tree its threads combine by. Two
orders are modelled: Triton's ``tl.sum`` over one block (Liger) and cub's
``BlockReduce`` of a thread per element (vLLM). For 16-bit inputs every square is exact
in fp32, so only the order of the additions matters; for fp32 inputs the fma does too.
"""

from __future__ import annotations

import numpy as np

from ._creation import full, zeros
from ._dtype import float32
from ._reduce import rms_norm as _rms_norm
from ._reduce import sum as _sum
from ._schedule import triton_tile
from .ops import cat, reshape, rsqrt

__all__ = ["EPS", "hf_rms_norm", "hf_rms_norm_gemma", "hf_fused_add_rms_norm",
           "liger_rms_norm", "liger_warps", "unsloth_rms_norm", "vllm_rms_norm",
           "vllm_fused_add_rms_norm", "te_rms_norm", "apex_rms_norm"]

#: The epsilon of every RMSNorm preset (Llama's, Qwen2's and Gemma's default).
EPS = 1e-6


def _f32(x):
    return x if x.dtype is float32 else x.astype(float32)


def _pad(h, total: int):
    """h [..., n] padded with zeros to [..., total] (a captured constant: the positions of
    a block past the row, which the kernels load as 0)."""
    n = h.shape[-1]
    if total == n:
        return h
    return cat([h, zeros(*h.shape[:-1], total - n, dtype=h.dtype, device=h.device)], dim=-1)


def _divide(s, n: int):
    """s / n with n as a tensor: a division the kernel performs at run time (Liger's
    ``/ n_cols``, vLLM's ``/ hidden_size``), never castlab's torch-kernel rewrite of a
    division by a Python number into a product by its reciprocal."""
    return s / full((1,) * len(s.shape), float(n), dtype=float32, device=s.device)


# ---------------------------------------------------------------- Hugging Face eager

def hf_rms_norm(x, weight, *, eps: float = EPS):
    """LlamaRMSNorm / Qwen2RMSNorm: ``weight * (h * rsqrt(mean(h**2) + eps)).to(dtype)``
    with ``h = x.float()``: PyTorch's ops one by one (castlab.rms_norm, cast="hf")."""
    return _rms_norm(x, x.shape[-1], weight, eps, cast="hf")


def hf_rms_norm_gemma(x, weight, *, eps: float = EPS):
    """GemmaRMSNorm: ``(h * rsqrt(mean(h**2) + eps) * (1.0 + weight.float())).type_as(x)``
    with ``h = x.float()``: fp32 throughout, one rounding at the end."""
    h = _rms_norm(_f32(x), x.shape[-1], None, eps)
    return (h * (1.0 + _f32(weight))).astype(x.dtype)


def hf_fused_add_rms_norm(x, residual, weight, *, eps: float = EPS):
    """A decoder layer's ``residual + hidden`` (rounded to the storage dtype), which is
    both the next residual and the input of LlamaRMSNorm."""
    r = residual + x
    return hf_rms_norm(r, weight, eps=eps), r


# ---------------------------------------------------------------- Liger (Triton)

def liger_warps(n: int) -> tuple:
    """(BLOCK_SIZE, num_warps) of Liger's ``calculate_settings(n)``: the next power of two,
    on 4 warps, 8 from 2048, 16 from 8192, 32 from 32768 (ops/utils.py)."""
    block = 1 << max(n - 1, 0).bit_length()
    warps = 32 if block >= 32768 else 16 if block >= 8192 else 8 if block >= 2048 else 4
    return block, warps


def _triton_vec(n: int, isz: int, w_isz: int | None, constexpr: bool = False) -> int:
    """Elements per thread of Liger's (and Unsloth's) RMSNorm layout. Triton's
    coalescing pass takes the largest vector any memory access of the kernel allows: X's
    and Y's rows start at ``row * stride``, aligned to 16 elements only where the
    run-time ``stride`` (= n) is a multiple of 16 (Triton's integer specialization), else
    1 element; the weight's loads start at its 16-byte aligned base: 16 bytes of its
    dtype. `constexpr`: the stride is a compile-time constant (Unsloth), aligned to its
    largest power-of-two divisor."""
    align = (n & -n) if constexpr else (16 if n % 16 == 0 else 1)
    vec = max(1, min(16 // isz, align))
    return max(vec, 16 // w_isz) if w_isz else vec


def _triton_sum_sq(h, isz: int, w_isz: int | None = None, constexpr: bool = False):
    """``tl.sum(h * h, axis=0)`` over one block of next_power_of_2(n) positions (Liger's
    row kernel), in the order Triton accumulates it: the blocked layout puts
    ``per`` contiguous positions on each of ``lanes * warps`` threads (up to 16 bytes of
    the loaded element, castlab._schedule.triton_tile); each thread folds its positions
    in register order, the first as a product and the others as fmas (LLVM contracts
    the fmul into the reduction's fadd); the lanes then combine by an xor butterfly
    (offsets 16 .. 1) and the warps by another. Positions past the row hold 0.
    The elements per thread follow all of the kernel's memory accesses (_triton_vec;
    `w_isz`: the weight's element size, None without a weight; `constexpr`: the kernel
    takes the stride as a compile-time constant)."""
    n = h.shape[-1]
    block, warps = liger_warps(n)
    vec = _triton_vec(n, isz, w_isz, constexpr)
    _, per, lanes, wr = triton_tile(block, 1, warps, isz, vec=vec)
    threads = lanes * wr
    reps = block // (per * threads)
    lead = h.shape[:-1]
    p = reshape(_pad(h, block), *lead, reps, threads, per)
    acc = None
    for rep in range(reps):
        for k in range(per):
            v = p[..., rep, :, k]
            acc = v * v if acc is None else acc + v * v
    return _butterfly(reshape(acc, *lead, wr, lanes), lanes, wr)


def _triton_normed(x, weight, eps: float, constexpr: bool = False):
    """x * rstd in fp32 with rstd = rsqrt(tl.sum(x*x) / n + eps), as Liger's and Unsloth's
    row kernels compute it (Triton's ``/``, contracted into the add on a GPU)."""
    h = _f32(x)
    s = _triton_sum_sq(h, x.dtype.bits // 8, weight.dtype.bits // 8, constexpr)
    return h * rsqrt(_divide(s, x.shape[-1]) + eps)


def _butterfly(a, lanes: int, warps: int):
    """Lane l of a warp adds lane l + off, for off = lanes/2 .. 1, then the warps likewise:
    [..., warps, lanes] -> [..., 1]."""
    off = lanes // 2
    while off:
        a = a[..., :off] + a[..., off:2 * off]
        off //= 2
    off = warps // 2
    while off:
        a = a[..., :off, :] + a[..., off:2 * off, :]
        off //= 2
    return reshape(a, *a.shape[:-2], 1)


def liger_rms_norm(casting: str, offset: float):
    """Liger's ``_rms_norm_forward_kernel`` for `casting` "llama" or "gemma" and `offset`
    (0.0 for Llama/Qwen2, 1.0 for Gemma), as a function of (x, weight).

    llama: x in fp32, rstd = rsqrt(sum(x*x) / n + eps), ``(x * rstd).to(dtype)``, then
    times ``offset + w`` in fp32, rounded on store. gemma: x and w in fp32, ``x * rstd *
    (offset + w)`` rounded once."""
    if casting not in ("llama", "gemma"):
        raise ValueError(f"liger rms_norm: casting must be 'llama' or 'gemma', not {casting!r}")

    def liger_rms_norm(x, weight, *, eps: float = EPS):
        dt = x.dtype
        y = _triton_normed(x, weight, eps)
        if casting == "llama":
            y = _f32(y.astype(dt))
        return (y * (_f32(weight) + offset)).astype(dt)

    liger_rms_norm.__qualname__ = f"liger_rms_norm_{casting}_{offset:g}"
    return liger_rms_norm


# ---------------------------------------------------------------- Unsloth (Triton)

def unsloth_rms_norm(gemma: bool):
    """Unsloth's ``_rms_layernorm_forward`` (``gemma`` False: Llama, Qwen2, Mistral) or
    ``_gemma_rms_layernorm_forward`` (True), as a function of (x, weight).

    Both: x in fp32, ``rstd = tl.math.rsqrt(tl.sum(x*x) / n_cols + eps)`` in Liger's
    order and contraction (the same launch settings; ``n_cols``, the strides and eps are
    ``tl.constexpr``, so the rows' alignment is the stride's largest power-of-two
    divisor). Llama: ``(x * rstd).to(w.dtype) * w`` in the weight's dtype, stored in x's.
    Gemma: ``x * rstd * (w.float() + 1.0)`` in fp32, one rounding."""

    def unsloth_rms_norm(x, weight, *, eps: float = EPS):
        y = _triton_normed(x, weight, eps, constexpr=True)
        if gemma:
            return (y * (_f32(weight) + 1.0)).astype(x.dtype)
        return (y.astype(weight.dtype) * weight).astype(x.dtype)

    unsloth_rms_norm.__qualname__ = "unsloth_rms_norm_gemma" if gemma else "unsloth_rms_norm"
    return unsloth_rms_norm


# ---------------------------------------------------------------- vLLM (CUDA, cub)

def _cub_block_sum(acc, threads: int):
    """cub::BlockReduce<float, 1024>::Reduce over `threads` valid threads
    (BLOCK_REDUCE_WARP_REDUCTIONS): each warp's shfl_down tree (offsets 1, 2, .. 16:
    lane l adds lane l + off, so adjacent pairs first), the missing lanes of a partial
    warp adding nothing, then thread 0 adds the warps' sums in order. acc [..., threads]
    -> [..., 1]."""
    lead = acc.shape[:-1]
    warps = -(-threads // 32)
    a = reshape(_pad(acc, warps * 32), *lead, warps, 32)
    width = 32
    while width > 1:
        a = reshape(a, *lead, warps, width // 2, 2)
        a = a[..., 0] + a[..., 1]
        width //= 2
    total = a[..., 0, :]
    for w in range(1, warps):
        total = total + a[..., w, :]
    return total


def _vllm_sum_sq(h, threads: int, vec: int):
    """vLLM's per-thread sums: thread t adds ``x * x`` (nvcc: an fma) over the elements
    t, t + threads, ... from 0 (vec 0: rms_norm_kernel and the generic
    fused_add_rms_norm_kernel), or over vectors of `vec` elements t, t + threads, ...,
    each vector's _f16Vec::sum_squares (pairs ``z.x*z.x + z.y*z.y`` added in order from
    0) added to the thread's sum. Then cub's block sum."""
    n = h.shape[-1]
    lead = h.shape[:-1]
    unit = vec or 1
    per_thread = -(-n // (threads * unit))
    p = reshape(_pad(h, per_thread * threads * unit), *lead, per_thread, threads, unit)
    acc = None
    for j in range(per_thread):
        if vec:
            s = None
            for i in range(0, vec, 2):
                zx, zy = p[..., j, :, i], p[..., j, :, i + 1]
                q = zx * zx + zy * zy
                s = q if s is None else s + q
            acc = s if acc is None else acc + s
        else:   # variance = 0.0f; variance += x * x: fmas from 0, the first one too (a
            # bare product would let castlab contract it into cub's tree, which adds
            # registers from other threads)
            z = p[..., j, :, 0]
            acc = (0.0 if acc is None else acc) + z * z
    return _cub_block_sum(acc, threads)


def _vllm_normalize(r, weight, threads: int, vec: int, eps: float):
    """``((scalar_t)(x * rsqrtf(variance / hidden + eps))) * weight``."""
    dt = r.dtype
    h = _f32(r)
    s = _divide(_vllm_sum_sq(h, threads, vec), r.shape[-1])
    y = _f32((h * rsqrt(s + eps)).astype(dt))
    return (y * _f32(weight)).astype(dt)


def vllm_rms_norm(x, weight, *, eps: float = EPS):
    """vLLM's rms_norm_kernel: a block of min(hidden, 1024) threads per token."""
    return _vllm_normalize(x, weight, min(x.shape[-1], 1024), 0, eps)


def vllm_fused_add_rms_norm(x, residual, weight, *, eps: float = EPS):
    """vLLM's fused_add_rms_norm: ``z = input + residual`` in the storage dtype, stored as
    the new residual, then RMSNorm of z. Blocks of min(hidden, 1024) threads below 256
    tokens, else min(hidden, 256); a hidden size (and row stride) divisible by 8 takes the
    width-8 vector kernel (16-byte aligned tensors, as castlab's are)."""
    n = x.shape[-1]
    tokens = int(np.prod(x.shape[:-1]))
    threads = min(n, 1024 if tokens < 256 else 256)
    z = x + residual
    return _vllm_normalize(z, weight, threads, 8 if n % 8 == 0 else 0, eps), z


# ---------------------------------------------------------------- TransformerEngine, Apex

_RN = {}


def _recip(n: int) -> float:
    """``1.f / cols`` in fp32, as TE computes rn."""
    if n not in _RN:
        _RN[n] = float(np.float32(1.0) / np.float32(n))
    return _RN[n]


def te_rms_norm(zero_centered: bool):
    """TransformerEngine's rmsnorm_fwd_tuned_kernel: fp32 throughout, ``rs = rsqrtf(rn *
    m2 + mu * mu + eps)`` from the row's mean ``mu`` and sum of squared deviations ``m2``
    (its stats are LayerNorm's), ``y = g * (rs * x)`` with ``g = w`` or, with
    zero-centered gamma, ``w + 1``, rounded once. castlab takes mu and m2 in two passes
    of its own order, not TE's Welford/Chan merges."""

    def te_rms_norm(x, weight, *, eps: float = EPS):
        h = _f32(x)
        n = x.shape[-1]
        rn = _recip(n)
        mu = _sum(h, -1, keepdim=True) * rn
        d = h - mu
        m2 = _sum(d * d, -1, keepdim=True)
        rs = rsqrt(m2 * rn + mu * mu + eps)
        g = _f32(weight) + 1.0 if zero_centered else _f32(weight)
        return (g * (rs * h)).astype(x.dtype)

    te_rms_norm.__qualname__ = "te_rms_norm_zero_centered" if zero_centered else "te_rms_norm"
    return te_rms_norm


def apex_rms_norm(x, weight, *, eps: float = EPS):
    """Apex's cuApplyRMSNorm (FusedRMSNorm): ``sigma2 = sum(x*x) / n`` in float,
    ``gamma * (V)(rsqrtf(sigma2 + eps) * x)``: Hugging Face's cast placement. castlab's
    sum stands in for Apex's order (strided per-thread sums, warp shuffles, a
    shared-memory tree over threadIdx.y)."""
    h = _f32(x)
    s = _divide(_sum(h * h, -1, keepdim=True), x.shape[-1])
    y = _f32((h * rsqrt(s + eps)).astype(x.dtype))
    return (_f32(weight) * y).astype(x.dtype)
