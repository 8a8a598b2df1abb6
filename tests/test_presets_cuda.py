"""Kernel-library presets against the libraries themselves, on the GPU.

Each test runs a library's own SwiGLU or RoPE kernel (forward and backward) and castlab's
preset of it (castlab.presets) on the same Qwen2.5-7B-shaped tensors and requires the same
bits; mismatch counts (and, for context, each one's count against Hugging Face eager) go
to $CASTLAB_GPU_REPORT. A test skips when its library is absent. The GPU image has no
network: scripts/gpu_check.sh installs the wheels downloaded into wheels/ beforehand
(``pip install --no-deps wheels/liger_kernel-*.whl``); flash-attn's Triton rotary kernel
is loaded from wheels/flash_attn_rotary.py (flash_attn/ops/triton/rotary.py of the
flash-attention repository, commit 0251105a) when flash_attn itself is not installed, and
Unsloth's Triton kernels from wheels/unsloth_swiglu.py and wheels/unsloth_rope_embedding.py
(unsloth/kernels/ at commit 015bdef0).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import pathlib

import pytest

import castlab as cl
import castlab.cuda as clcuda

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not clcuda.is_available(), reason="no CUDA GPU for castlab")]

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch has no CUDA", allow_module_level=True)

ROOT = pathlib.Path(__file__).resolve().parents[1]
TDT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# Qwen2.5-7B: intermediate 18944, 28 query heads / 4 KV heads of 128, rope_theta 1e6
TOKENS, FFN, BATCH, HEADS, KV_HEADS, SEQ, DIM, THETA = 2048, 18944, 2, 28, 4, 2048, 128, 1e6


def report(**kw):
    print(json.dumps(kw))
    path = os.environ.get("CASTLAB_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": "presets", **kw}) + "\n")


def cl_(t):
    return cl.from_dlpack(t.detach().contiguous())


def t_(x):
    return torch.from_dlpack(x)


def mismatches(a, b) -> int:
    """Elements whose bits differ (NaNs of any payload count as equal)."""
    a, b = a.contiguous(), b.contiguous()
    iv = {2: torch.int16, 4: torch.int32}[a.element_size()]
    ia, ib = a.view(iv), b.view(iv)
    both_nan = torch.isnan(a) & torch.isnan(b)
    return int(((ia != ib) & ~both_nan).sum())


def check(what: str, lib: str, dt: str, got, want, eager=None):
    n = mismatches(got, want)
    extra = {} if eager is None else {"library_vs_hf_eager": mismatches(want, eager)}
    report(case=what, library=lib, dtype=dt, elements=want.numel(), castlab_vs_library=n,
           **extra)
    assert n == 0, f"{lib} {what} {dt}: castlab's preset differs from the library in {n} " \
                   f"of {want.numel()} elements"


def hf_cos_sin(dt, seq=SEQ, dim=DIM, theta=THETA):
    """Qwen2RotaryEmbedding: fp32 inv_freq and angles, cos/sin of cat(f, f), cast to dt."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cuda").float()
                           / dim))
    f = torch.outer(torch.arange(seq, device="cuda").float(), inv)
    emb = torch.cat([f, f], dim=-1)
    return emb.cos().to(TDT[dt]), emb.sin().to(TDT[dt]), emb


def hf_rope(q, cos, sin):
    h = q.shape[-1] // 2
    return q * cos + torch.cat([-q[..., h:], q[..., :h]], dim=-1) * sin


def randn(*shape, dt, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(TDT[dt])


# ---------------------------------------------------------------- Liger-Kernel

@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
def test_liger_swiglu(dt):
    swiglu_mod = pytest.importorskip("liger_kernel.ops.swiglu")
    lib = cl.library("liger")
    a, b, dc = (randn(TOKENS, FFN, dt=dt, seed=s) for s in (1, 2, 3))
    la, lb = a.clone().requires_grad_(), b.clone().requires_grad_()
    c = swiglu_mod.LigerSiLUMulFunction.apply(la, lb)
    c.backward(dc)
    ea, eb = a.clone().requires_grad_(), b.clone().requires_grad_()
    ec = torch.nn.functional.silu(ea) * eb
    ec.backward(dc)
    check("swiglu forward", "liger", dt, t_(lib.swiglu(cl_(a), cl_(b))), c.detach(),
          ec.detach())
    da, db = lib.swiglu_backward(cl_(dc), cl_(a), cl_(b))
    check("swiglu backward da", "liger", dt, t_(da), la.grad, ea.grad)
    check("swiglu backward db", "liger", dt, t_(db), lb.grad, eb.grad)


@pytest.mark.parametrize("dt", ["bfloat16", "float16", "float32"])
def test_liger_geglu(dt):
    """liger-kernel's LigerGELUMulFunction (apply_liger_kernel_to_gemma's GeGLU), forward,
    against castlab's preset from its source; the count against PyTorch eager's
    gelu(a, 'tanh') * b is reported for context."""
    geglu_mod = pytest.importorskip("liger_kernel.ops.geglu")
    lib = cl.library("liger")
    a, b = (randn(TOKENS, FFN, dt=dt, seed=s) for s in (11, 12))
    with torch.no_grad():
        want = geglu_mod.LigerGELUMulFunction.apply(a.clone(), b.clone())
        eager = torch.nn.functional.gelu(a, approximate="tanh") * b
    check("geglu forward", "liger", dt, t_(lib.geglu(cl_(a), cl_(b))), want, eager)


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
def test_liger_rope(dt):
    rope_mod = pytest.importorskip("liger_kernel.ops.rope")
    lib = cl.library("liger")
    cos, sin, _ = hf_cos_sin(dt)
    q = randn(BATCH, HEADS, SEQ, DIM, dt=dt, seed=4)
    k = randn(BATCH, KV_HEADS, SEQ, DIM, dt=dt, seed=5)
    dq = randn(BATCH, HEADS, SEQ, DIM, dt=dt, seed=6)
    dk = randn(BATCH, KV_HEADS, SEQ, DIM, dt=dt, seed=7)
    lq, lk = q.clone().requires_grad_(), k.clone().requires_grad_()
    oq, ok = rope_mod.LigerRopeFunction.apply(lq, lk, cos[None], sin[None])
    torch.autograd.backward([oq, ok], [dq, dk])
    eq = q.clone().requires_grad_()
    e_out = hf_rope(eq, cos, sin)
    e_out.backward(dq)
    C, S = cl_(cos), cl_(sin)
    check("rope forward q", "liger", dt, t_(lib.rope(cl_(q), C, S)), oq.detach(),
          e_out.detach())
    check("rope forward k", "liger", dt, t_(lib.rope(cl_(k), C, S)), ok.detach())
    check("rope backward dq", "liger", dt, t_(lib.rope_backward(cl_(dq), C, S)), lq.grad,
          eq.grad)
    check("rope backward dk", "liger", dt, t_(lib.rope_backward(cl_(dk), C, S)), lk.grad)


def test_liger_rope_alternatives_for_diagnosis():
    """Not a contract: how far Liger's RoPE is from each castlab RoPE preset, so that a
    failure of test_liger_rope says which cast placement the kernel really has."""
    rope_mod = pytest.importorskip("liger_kernel.ops.rope")
    cos, sin, _ = hf_cos_sin("bfloat16")
    q = randn(BATCH, HEADS, SEQ, DIM, dt="bfloat16", seed=4)
    k = randn(BATCH, KV_HEADS, SEQ, DIM, dt="bfloat16", seed=5)
    oq, _ = rope_mod.LigerRopeFunction.apply(q.clone(), k.clone(), cos[None], sin[None])
    C, S, Q = cl_(cos), cl_(sin), cl_(q)
    counts = {name: mismatches(t_(cl.library(name).rope(Q, C, S)), oq)
              for name in ("liger", "torch_eager", "flash_attn", "vllm")}
    # the other fma choice: the second product of each add/sub fused, the first rounded
    p = cl.library("liger")["rope"]
    other = cl.jit(p.fn, policy=cl.Policy("custom", round_after=(6, 8, 9, 11)), math=p.math)
    counts["liger_second_product_fused"] = mismatches(t_(other(Q, C, S)), oq)
    report(case="rope forward q: liger vs each castlab preset", library="liger",
           dtype="bfloat16", elements=oq.numel(), mismatches=counts)


# ---------------------------------------------------------------- flash-attn (Triton)

def _flash_rotary():
    try:
        return importlib.import_module("flash_attn.ops.triton.rotary")
    except Exception:
        path = os.environ.get("FLASH_ATTN_ROTARY_PY", str(ROOT / "wheels" / "flash_attn_rotary.py"))
        if not os.path.exists(path):
            pytest.skip("flash-attn's rotary kernel is not available")
        pytest.importorskip("triton")
        spec = importlib.util.spec_from_file_location("flash_attn_rotary", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
def test_flash_attn_rope(dt, interleaved):
    rot = _flash_rotary()
    lib = cl.library("flash_attn")
    op = "rope_interleaved" if interleaved else "rope"
    cos, sin, _ = hf_cos_sin(dt)
    q = randn(BATCH, HEADS, SEQ, DIM, dt=dt, seed=8)
    dq = randn(BATCH, HEADS, SEQ, DIM, dt=dt, seed=9)
    half = DIM // 2
    # flash-attn takes x as (batch, seqlen, nheads, headdim) and cos/sin (seqlen, rd/2)
    fc, fs = cos[:, :half].contiguous(), sin[:, :half].contiguous()
    out = rot.apply_rotary(q.transpose(1, 2), fc, fs, interleaved=interleaved).transpose(1, 2)
    back = rot.apply_rotary(dq.transpose(1, 2), fc, fs, interleaved=interleaved,
                            conjugate=True).transpose(1, 2)
    C, S = cl_(cos), cl_(sin)
    eager = None if interleaved else hf_rope(q, cos, sin)
    check(f"{op} forward", "flash_attn", dt, t_(lib[op](cl_(q), C, S)), out, eager)
    check(f"{op} backward", "flash_attn", dt, t_(lib[op + "_backward"](cl_(dq), C, S)), back)


# ---------------------------------------------------------------- Unsloth (Triton)

def _unsloth(name: str):
    """Unsloth's Triton kernel file (unsloth/kernels/<name>.py of the unsloth repository,
    commit 015bdef0, saved as wheels/unsloth_<name>.py), loaded without the unsloth
    package: its two package-relative imports (device count, launch helpers) are given
    here, the kernels and their autograd wrappers run unchanged."""
    pytest.importorskip("triton")
    path = ROOT / "wheels" / f"unsloth_{name}.py"
    if not path.exists():
        pytest.skip(f"Unsloth's {name}.py is not in wheels/")
    import contextlib

    import triton

    def calculate_settings(n):          # unsloth/kernels/utils.py calculate_settings
        block = triton.next_power_of_2(n)
        return block, 32 if block >= 32768 else 16 if block >= 8192 else 8 if block >= 2048 else 4

    src = path.read_text()
    for line in src.splitlines():
        if line.startswith("from ."):
            src = src.replace(line, "")
    ns = {"__name__": f"unsloth_{name}", "DEVICE_COUNT": torch.cuda.device_count(),
          "calculate_settings": calculate_settings,
          "torch_gpu_device": lambda device: contextlib.nullcontext(),
          "torch_device_stream": lambda device: torch.cuda.current_stream(device)}
    exec(compile(src, str(path), "exec"), ns)
    return ns


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
def test_unsloth_swiglu(dt):
    k = _unsloth("swiglu")
    lib = cl.library("unsloth")
    a, b, dc = (randn(TOKENS, FFN, dt=dt, seed=s) for s in (1, 2, 3))
    h = k["swiglu_fg_kernel"](a[None], b[None])[0]
    ea, eb = a.clone().requires_grad_(), b.clone().requires_grad_()
    ec = torch.nn.functional.silu(ea) * eb
    ec.backward(dc)
    check("swiglu forward", "unsloth", dt, t_(lib.swiglu(cl_(a), cl_(b))), h, ec.detach())
    # _DWf_DW_dfg_kernel(DW, e, g) overwrites its inputs with h, df (= db), de (= da)
    _, df, de = k["swiglu_DWf_DW_dfg_kernel"](dc.clone(), a.clone(), b.clone())
    da, db = lib.swiglu_backward(cl_(dc), cl_(a), cl_(b))
    check("swiglu backward da", "unsloth", dt, t_(da), de, ea.grad)
    check("swiglu backward db", "unsloth", dt, t_(db), df, eb.grad)


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
def test_unsloth_rope(dt):
    k = _unsloth("rope_embedding")
    lib = cl.library("unsloth")
    cos, sin, _ = hf_cos_sin(dt)
    q = randn(BATCH, HEADS, SEQ, DIM, dt=dt, seed=13)
    dq = randn(BATCH, HEADS, SEQ, DIM, dt=dt, seed=14)
    # Fast_RoPE_Embedding takes Q as (batch, seq, heads, dim) and rotates it in place
    out = k["Fast_RoPE_Embedding"].apply(q.transpose(1, 2).contiguous(), cos, sin)
    dx = dq.transpose(1, 2).contiguous()
    back = k["Fast_RoPE_Embedding"].backward(
        type("Ctx", (), {"cos": cos.squeeze(), "sin": sin.squeeze(),
                         "BLOCK_SIZE": triton_next_pow2(DIM // 2), "num_warps": 4,
                         "n_groups": -(-HEADS // 4)})(), dx.clone())[0]
    C, S = cl_(cos), cl_(sin)
    check("rope forward", "unsloth", dt, t_(lib.rope(cl_(q), C, S)), out.transpose(1, 2),
          hf_rope(q, cos, sin))
    check("rope backward", "unsloth", dt, t_(lib.rope_backward(cl_(dq), C, S)),
          back.transpose(1, 2))


def triton_next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


# ---------------------------------------------------------------- TransformerEngine, Apex

@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
def test_transformer_engine_rope(dt):
    te_rope = pytest.importorskip("transformer_engine.pytorch.attention.rope")
    _, _, emb = hf_cos_sin(dt)
    q = randn(BATCH, HEADS, SEQ, DIM, dt=dt, seed=10)
    # TE's layout "bshd": x (batch, seq, heads, dim), freqs (seq, 1, 1, dim) in fp32
    x = q.transpose(1, 2).contiguous()
    freqs = emb[:, None, None, :]
    F = cl_(emb)
    for name, fused in (("transformer_engine", True), ("transformer_engine_unfused", False)):
        out = te_rope.apply_rotary_pos_emb(x, freqs, tensor_format="bshd", fused=fused)
        check("rope forward", name, dt, t_(cl.library(name).rope(cl_(q), F)),
              out.transpose(1, 2), hf_rope(q, *hf_cos_sin(dt)[:2]))


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
def test_apex_rope(dt):
    # Apex's extension (csrc/megatron/fused_rotary_positional_embedding.cpp: forward,
    # backward): t (seq, batch, heads, dim), freqs (seq, 1, 1, dim) in fp32
    ext = pytest.importorskip("fused_rotary_positional_embedding")
    lib = cl.library("apex")
    _, _, emb = hf_cos_sin(dt)
    q = randn(BATCH, HEADS, SEQ, DIM, dt=dt, seed=11)
    dq = randn(BATCH, HEADS, SEQ, DIM, dt=dt, seed=12)
    freqs = emb[:, None, None, :].contiguous()
    out = ext.forward(q.permute(2, 0, 1, 3).contiguous(), freqs, False).permute(1, 2, 0, 3)
    back = ext.backward(dq.permute(2, 0, 1, 3).contiguous(), freqs, False).permute(1, 2, 0, 3)
    F = cl_(emb)
    check("rope forward", "apex", dt, t_(lib.rope(cl_(q), F)), out)
    check("rope backward", "apex", dt, t_(lib.rope_backward(cl_(dq), F)), back)


# ---------------------------------------------------------------- Liger-Kernel RMSNorm

HIDDEN_GPU = (896, 1000, 2048, 3584, 4096, 8192)   # Qwen2-0.5B .. Llama-3-70B, and odd
NORM_ROWS = 512
# (library, op, casting_mode, offset): what apply_liger_kernel_to_llama/qwen2 (LigerRMSNorm)
# and apply_liger_kernel_to_gemma (LigerRMSNormForGemma) use, and casting "gemma" at 0
LIGER_NORMS = [("liger", "rms_norm", "llama", 0.0), ("liger", "rms_norm_gemma", "gemma", 1.0),
               ("liger_casting_gemma", "rms_norm", "gemma", 0.0)]


def bit_mismatches(a, b) -> int:
    """mismatches() for any float width (fp32 too)."""
    a, b = a.contiguous(), b.contiguous()
    iv = {2: torch.int16, 4: torch.int32}[a.element_size()]
    both_nan = torch.isnan(a) & torch.isnan(b)
    return int(((a.view(iv) != b.view(iv)) & ~both_nan).sum())


def norm_inputs(n: int, dt: str, gemma: bool, seed: int = 20):
    tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dt]
    g = torch.Generator(device="cuda").manual_seed(seed + n)
    x = torch.randn(NORM_ROWS, n, generator=g, device="cuda").to(tdt)
    x[1] = 0                                   # a row of zeros
    x[2] *= 256                                # large values
    x[3, n // 3] = float("inf")
    x[4, n // 2] = float("nan")
    x[5] *= 1e-3                               # small values: eps matters
    w = 0.1 * torch.randn(n, generator=g, device="cuda")
    return x, (w if gemma else w + 1.0).to(tdt)


def _liger_rms_function():
    mod = pytest.importorskip("liger_kernel.ops.rms_norm")
    if os.environ.get("LIGER_KERNEL_IMPL"):
        pytest.skip("LIGER_KERNEL_IMPL selects another implementation than the Triton one")
    return mod.LigerRMSNormFunction


@pytest.mark.parametrize("n", HIDDEN_GPU)
@pytest.mark.parametrize("dt", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("lib, op, casting, offset", LIGER_NORMS)
def test_liger_rms_norm(lib, op, casting, offset, dt, n):
    """liger_kernel.ops.rms_norm.LigerRMSNormFunction (0.8.5: forward(X, W, eps, offset,
    casting_mode, in_place, row_mode); the row kernel at these widths) against castlab's
    preset, bit for bit; the count against Hugging Face eager is reported for context."""
    fn = _liger_rms_function()
    x, w = norm_inputs(n, dt, offset == 1.0)
    with torch.no_grad():
        want = fn.apply(x, w, 1e-6, offset, casting, True, None)
        eager = t_(cl.library("torch_eager")[op](cl_(x), cl_(w)))
    got = t_(cl.library(lib)[op](cl_(x), cl_(w)))
    n_bad = bit_mismatches(got, want)
    report(case=f"{op} casting={casting} offset={offset} hidden={n}", library=lib, dtype=dt,
           elements=want.numel(), castlab_vs_library=n_bad,
           library_vs_hf_eager=bit_mismatches(want, eager))
    assert n_bad == 0, f"{lib} {op} {dt} hidden {n}: {n_bad} of {want.numel()} differ"


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
def test_liger_rms_norm_modules_as_the_patches_install_them(dt):
    """The modules apply_liger_kernel_to_llama/qwen2 (LigerRMSNorm) and _gemma
    (LigerRMSNormForGemma) put in place, through liger_kernel.ops' dispatch, at Llama-3-8B's
    width: the same bits as the presets."""
    mods = pytest.importorskip("liger_kernel.transformers.rms_norm")
    _liger_rms_function()
    n = 4096
    for cls, op, gemma in ((mods.LigerRMSNorm, "rms_norm", False),
                           (mods.LigerRMSNormForGemma, "rms_norm_gemma", True)):
        x, w = norm_inputs(n, dt, gemma, seed=30)
        m = cls(n, eps=1e-6).to(device="cuda", dtype=x.dtype)
        with torch.no_grad():
            m.weight.copy_(w)
            want = m(x)
        got = t_(cl.library("liger")[op](cl_(x), cl_(w)))
        check(f"{op} module {cls.__name__}", "liger", dt, got, want)


@pytest.mark.parametrize("n", HIDDEN_GPU)
@pytest.mark.parametrize("dt", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("op", ["rms_norm", "rms_norm_gemma"])
def test_unsloth_rms_norm(op, dt, n):
    """Unsloth's Fast_RMS_Layernorm (wheels/unsloth_rms_layernorm.py, the file of commit
    0050c73e) against castlab's unsloth presets, bit for bit."""
    fn = _unsloth("rms_layernorm")["Fast_RMS_Layernorm"]
    gemma = op == "rms_norm_gemma"
    x, w = norm_inputs(n, dt, gemma, seed=40)
    with torch.no_grad():
        want = fn.apply(x, w, 1e-6, gemma)
    got = t_(cl.library("unsloth")[op](cl_(x), cl_(w)))
    n_bad = bit_mismatches(got, want)
    report(case=f"{op} hidden={n}", library="unsloth", dtype=dt, elements=want.numel(),
           castlab_vs_library=n_bad)
    assert n_bad == 0, f"unsloth {op} {dt} hidden {n}: {n_bad} of {want.numel()} differ"


def test_liger_rms_norm_order_alternatives_for_diagnosis():
    """Not a contract: where test_liger_rms_norm fails, how far Liger's kernel is from
    castlab's other RMSNorm orders (Hugging Face eager's torch_cuda sum, vLLM's cub block
    and the same formula with castlab's pairwise sum), to say what the kernel really does."""
    fn = _liger_rms_function()
    counts = {}
    for n in (896, 4096):
        x, w = norm_inputs(n, "float32", False)
        with torch.no_grad():
            want = fn.apply(x, w, 1e-6, 0.0, "llama", True, None)
        X, W = cl_(x), cl_(w)
        for name in ("liger", "torch_eager", "vllm", "apex"):
            counts[f"{name} {n}"] = bit_mismatches(t_(cl.library(name).rms_norm(X, W)), want)
    report(case="rms_norm fp32: liger vs each castlab preset", library="liger",
           dtype="float32", mismatches=counts)
