"""The built-in chains of castlab.study (SwiGLU, GeGLU, RoPE, RMSNorm, softmax, log-probs),
their input generators, and the default study settings."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ._creation import rand, randn, tensor
from ._dtype import float64, int64
from ._index import gather
from ._reduce import log_softmax, rms_norm, softmax
from .ops import cat, chunk, gelu, reshape, silu, stack

# The largest input a study generates (elements). Inputs are made in fp64 and the
# study keeps several results of the same size, so this is already tens of GB.
MAX_NUMEL = 1 << 31


def _swiglu(x):
    a, b = chunk(x, 2, dim=-1)
    return silu(a) * b


def _geglu(x):
    a, b = chunk(x, 2, dim=-1)
    return gelu(a) * b


def _rope(x, cos, sin):
    # Hugging Face rotate_half layout: cat(-x2, x1) with cos/sin broadcast over batch/heads.
    x1, x2 = chunk(x, 2, dim=-1)
    return x * cos + cat([-x2, x1], dim=-1) * sin


def _rope_interleaved(x, cos, sin):
    # GPT-J / Meta layout: pairs (x[2i], x[2i+1]) rotate together.
    shp = x.shape
    xp = reshape(x, *shp[:-1], shp[-1] // 2, 2)
    x0, x1 = xp[..., 0], xp[..., 1]
    out = stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)
    return reshape(out, *shp)


def _rope_angles(seq: int, dim: int, base: float = 10000.0):
    """The angles [seq, dim/2] as Hugging Face builds them: fp32 inverse frequencies
    ``1 / base**(i/dim)``, fp32 outer product with the positions. The power is taken in
    double (Python's, glibc's) and rounded to fp32, so the angles are the same on every
    machine: NumPy's fp32 ``power`` is Intel SVML's where the CPU has AVX512 and libm's
    elsewhere, and their last bits differ."""
    import math

    import numpy as np

    e = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    pw = np.array([math.pow(base, float(v)) for v in e], dtype=np.float64).astype(np.float32)
    inv = (np.float32(1.0) / pw).astype(np.float32)
    t = np.arange(seq, dtype=np.float32)
    return np.outer(t, inv).astype(np.float32)


def _rope_tables(seq: int, dim: int, base: float = 10000.0):
    """cos/sin of Hugging Face's fp32 angles (_rope_angles), each the fp64 value rounded
    to fp32 (Python's libm, element by element): the same tables on every machine, where
    NumPy's vectorised cos/sin depend on the CPU's SIMD extensions."""
    import math

    import numpy as np

    freqs = _rope_angles(seq, dim, base)
    flat = freqs.astype(np.float64).ravel().tolist()
    c = np.array([math.cos(v) for v in flat], dtype=np.float64).astype(np.float32)
    s = np.array([math.sin(v) for v in flat], dtype=np.float64).astype(np.float32)
    return c.reshape(freqs.shape), s.reshape(freqs.shape)


def _gen(kind: str, shape, seed: int, scale: float, dt, device):
    if kind == "normal":
        t = randn(*shape, seed=seed, dtype=float64, device="cpu")
    elif kind == "uniform":
        t = rand(*shape, seed=seed, dtype=float64, device="cpu")
    else:
        raise ValueError(f"unknown input generator {kind!r}; valid: normal, uniform")
    if scale != 1.0:
        t = t * float(scale)
    return t.astype(dt).to(device)


def _swiglu_inputs(shape, dt, seed, kind, scale, device):
    return (_gen(kind, shape, seed, scale, dt, device),)


def _rope_inputs(shape, dt, seed, kind, scale, device, interleaved=False):
    import numpy as np

    b, h, s, d = shape
    x = _gen(kind, shape, seed, scale, dt, device)
    cos, sin = _rope_tables(s, d)
    if not interleaved:
        cos = np.concatenate([cos, cos], axis=-1)
        sin = np.concatenate([sin, sin], axis=-1)
    return (x, tensor(cos).astype(dt).to(device), tensor(sin).astype(dt).to(device))


def _halves(grads: tuple) -> dict:
    """SwiGLU/GeGLU: the gradient of x = [a, b] as the gradients of its halves a and b."""
    (dx,) = grads
    h = dx.shape[-1] // 2
    return {"da": dx[..., :h], "db": dx[..., h:]}


@dataclasses.dataclass
class Chain:
    """A named chain of ops and how to make its inputs.

    For ``study.run(grad=True)``: `grad_argnums` are the inputs differentiated (None: the
    floating-point inputs with the most elements; smaller ones are taken to be broadcast,
    e.g. RoPE's cos/sin, whose gradients are sums over the broadcast dims), and
    `grad_parts` turns the tuple of gradients into named results (None: ``d<argument>``).
    """

    name: str
    fn: Callable
    make_inputs: Callable      # (shape, dtype, seed, kind, scale, device) -> tuple of tensors
    default_shape: tuple
    quick_shape: tuple
    description: str = ""
    grad_argnums: tuple | None = None
    grad_parts: Callable | None = None   # (tuple of gradients) -> {name: tensor}
    #: per-input specs (``Input``) that replace `make_inputs` (for a built-in chain, a
    #: spec without shape, file or tensor keeps the chain's own input, in its dtype)
    inputs: tuple | None = None
    #: where the chain came from ("swiglu", "pkg.module:function", "file.py:function")
    source: str | None = None


def _rmsnorm(x, w):
    # Hugging Face Qwen2RMSNorm: variance in fp32, cast to the input dtype, then * weight
    return rms_norm(x, x.shape[-1], w, 1e-6, cast="hf")


def _rmsnorm_inputs(shape, dt, seed, kind, scale, device):
    w = _gen("uniform", shape[-1:], seed + 1, 1.0, float64, "cpu") + 0.5
    return (_gen(kind, shape, seed, scale, dt, device), w.astype(dt).to(device))


def _softmax(x):
    return softmax(x, -1)


def _logprobs(x, t):
    # the log-probability of each row's token: log_softmax over the vocabulary, gathered
    return gather(log_softmax(x, -1), -1, t)


def _logprobs_inputs(shape, dt, seed, kind, scale, device):
    import numpy as np

    x = _gen(kind, shape, seed, scale, dt, device)
    rng = np.random.default_rng(seed + 1)
    t = tensor(rng.integers(0, shape[-1], size=tuple(shape[:-1]) + (1,)), dtype=int64)
    return (x, t.to(device))


CHAINS: dict[str, Chain] = {
    # gradients: SwiGLU/GeGLU of x, reported as its halves da and db; RoPE of x only
    # (cos/sin are broadcast over batch and heads: their gradients are reductions)
    "swiglu": Chain("swiglu", _swiglu, _swiglu_inputs, (2048, 2048), (256, 512),
                    "a, b = chunk(x, 2, -1); silu(a) * b", (0,), _halves),
    "geglu": Chain("geglu", _geglu, _swiglu_inputs, (2048, 2048), (256, 512),
                   "a, b = chunk(x, 2, -1); gelu(a) * b", (0,), _halves),
    "rope": Chain("rope", _rope, _rope_inputs, (1, 8, 1024, 128), (1, 2, 128, 64),
                  "x*cos + cat(-x2, x1)*sin (HF rotate_half), cos/sin [S, D] broadcast", (0,)),
    "rope_interleaved": Chain(
        "rope_interleaved", _rope_interleaved,
        lambda *a: _rope_inputs(*a, interleaved=True), (1, 8, 1024, 128), (1, 2, 128, 64),
        "GPT-J/Meta pairs: (x0*cos - x1*sin, x0*sin + x1*cos) interleaved", (0,)),
    # reductions (no gradients yet: the derivative of a sum is not in the op table)
    "rmsnorm": Chain("rmsnorm", _rmsnorm, _rmsnorm_inputs, (4096, 3584), (256, 896),
                     "Qwen2RMSNorm: w * (h * rsqrt(mean(h**2) + 1e-6)).to(x.dtype), h = x.float()",
                     (0,)),
    "softmax": Chain("softmax", _softmax, _swiglu_inputs, (4096, 4096), (256, 1024),
                     "softmax(x, -1): max, exp(x - max), sum, divide; one PyTorch kernel", (0,)),
    "logprobs": Chain("logprobs", _logprobs, _logprobs_inputs, (512, 32000), (64, 32000),
                      "per-token log-probabilities: gather(log_softmax(logits, -1), -1, "
                      "tokens), tokens [rows, 1] drawn with the seed", (0,)),
}


# The default study: every dtype, eager vs fused vs fp64, and SwiGLU's formula presets.
DEFAULT = {
    "chains": ["swiglu", "rope"],
    "dtypes": ["bfloat16", "float16", "float32"],
    "policies": ["eager", "fused"],
    "presets": ["torch_eager"],
    "extra_presets": {"swiglu": ["inductor", "nvfuser", "transformer_engine"]},
    "rounding": ["nearest"],
    "seeds": [0],
    "input": "normal",
    "scale": 1.0,
}


QUICK = dict(DEFAULT, dtypes=["bfloat16", "float16"])
