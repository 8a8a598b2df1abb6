"""castlab.torch._inductor: roundings where torch.compile's Inductor kernels store, read
from the compiled program (issue 52), against torch.compile on the CPU (PyTorch's
Inductor, its generated C++: a reference castlab did not write)."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

import castlab as cl

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from _tiny_models import compiled_and_stack  # noqa: E402

import castlab.torch as ct  # noqa: E402
from castlab.torch import _inductor, _inductor_tiles, _triton_choices  # noqa: E402

KW = {"use_cache": False}


def _qwen2(layers: int = 1):
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(hidden_size=56, num_attention_heads=28,
                                   num_key_value_heads=4, intermediate_size=112, vocab_size=2,
                                   max_position_embeddings=32, num_hidden_layers=layers)
    cfg._attn_implementation = "sdpa"
    m = transformers.Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
    ids = torch.randint(0, 2, (1, 32))
    return m, ids


@pytest.mark.slow  # two torch.compile runs (Inductor's C++): ~40 s on 2 cores
@pytest.mark.inductor
def test_torch_compile_stack_equals_torch_compile_on_the_cpu():
    """The Thunder/torch.compile report's Qwen2 (bf16), with 2 layers: the torch_compile
    stack's logits equal torch.compile(model)'s bit for bit, where one rounding per castlab
    region (stores=None) does not. The placement read from the program says why: cos/sin
    and the first residual sum are never stored (recomputed in fp32 by the kernels reading
    them), the attention projections are loaded rounded, and the second layer's residual
    sum is stored by the first loop of its RMSNorm's kernel and loaded back, rounded, by
    the second (the CPU's outer-loop fusion), while the sum of squares used it in fp32."""
    m, ids = _qwen2(2)
    cm = ct.capture(m, ids, kwargs=KW, attention="traced")  # as torch.compile traces it
    got = cm.run(ids, kwargs=KW, stack="torch_compile").logits
    plain = cm.run(ids, kwargs=KW, stack=ct.Stack("torch_compile", stores=None)).logits
    torch._dynamo.reset()
    with torch.no_grad():
        want = torch.compile(m, dynamic=False)(ids, **KW).logits
    torch._dynamo.reset()
    assert torch.equal(got, want), f"{int((got != want).sum())} of {want.numel()} differ"
    assert not torch.equal(plain, want)
    flat = cm._flat_inputs((ids,), KW)
    pl = _inductor.placement_for(cm, flat)
    assert pl is ct.inductor_stores(cm, ids, kwargs=KW)  # read once per model and inputs
    rows = {r["node"]: r for r in pl.rows(cm)}
    assert list(pl.to_frame(cm)["node"]) == list(rows)
    by = {n.name: n for n in cm.nodes}
    cos = [n for n in cm.nodes if str(n.target) == "aten.cos.default"]
    assert cos and all(n.name not in pl.stored for n in cos)
    assert all("recomputed in fp32" in pl.describe(n.name) for n in cos)
    assert all(rows[n.name]["buffer"] is None and rows[n.name]["recomputed_by"] for n in cos)
    # the residual sum after attention: an add reading the embedding, never stored
    emb = next(n for n in cm.nodes if str(n.target) == "aten.embedding.default")
    res = [n for n in emb.users if str(n.target) == "aten.add.Tensor"]
    assert res and res[0].name not in pl.stored
    linears = [n for n in cm.nodes if str(n.target) == "aten.linear.default"]
    assert all(n.name in pl.stored and pl.stored[n.name][1] == "bfloat16" for n in linears)
    rounded = pl.rounded_reads()
    assert any(v in by and by[v] in linears for v, _ in rounded)
    assert pl.loads_seen and "kernels" in str(pl) and pl.torch == torch.__version__
    # the second residual sum: stored, loaded rounded by one part of the kernel that
    # stores it, taken fp32 from that kernel's store by another
    second = [n for n in res[0].users if str(n.target) == "aten.add.Tensor"]
    third = [n for n in second[0].users if str(n.target) == "aten.add.Tensor"]
    r2 = third[0].name
    assert r2 in pl.stored, pl.describe(r2)
    buf = pl.buffer[r2]
    loaders = [p for p, bs in pl.mem.items() if buf in bs]
    keepers = [p for p, bs in pl.cached.items() if buf in bs]
    assert loaders and keepers, (loaders, keepers)
    k_of = pl._kernel_of
    assert {k_of[p] for p in loaders} & {k_of[p] for p in keepers}
    # a mean's sum is a part of the mean its reader continues
    assert any(str(by[n].target) == "aten.mean.dim" for n in pl.partial if n in by)


def _gpt2(hidden: int, layers: int, dtype):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=hidden, n_head=hidden // 64, n_layer=layers,
                                  vocab_size=512, n_positions=32)
    cfg._attn_implementation = "sdpa"
    return transformers.GPT2LMHeadModel(cfg).to(dtype).eval(), torch.randint(0, 512, (1, 16))


@pytest.mark.slow  # Inductor's C++ for two GPT-2s: ~50 s on 2 cores
@pytest.mark.inductor
@pytest.mark.parametrize("hidden,layers,dt", [(1088, 2, "bfloat16"), (768, 4, "float16")])
def test_torch_compile_stack_equals_torch_compile_on_a_layer_norm_model(hidden, layers, dt):
    """GPT-2 (LayerNorm, tanh-GELU, eval dropout, a KV cache that starts empty) under the
    torch_compile stack equals torch.compile(model) bit for bit. What it takes, each of
    which failed before:
    - aten.layer_norm computed by castlab (it ran in PyTorch, eagerly: 62,518 of 65,536
      fp32 logits differed), dropout(train=False) an identity, cat skipping PyTorch's
      legacy empty 1-d tensor (the cache);
    - over 1,024 elements, Welford's lanes as Inductor's C++ loop nest tiles them: read
      from the program (a row summed from a float local buffer tiles by float, 8 lanes
      under AVX2, not by bf16's 16);
    - a layer_norm whose kernel sums its input in fp32 and normalizes it loaded back
      rounded (Welford: mean and M2 of the fp32 value; up to 1,024 elements, two passes:
      the mean of the fp32 value, the variance of the rounded one);
    - a value a later kernel recomputes reached through an output's view (a residual sum
      through its dropout), and post-grad provenance mapped to the captured graph's names
      past export's (which the empty cache's ops shift)."""
    m, ids = _gpt2(hidden, layers, getattr(torch, dt))

    def logits(ids):  # (the model fills its KV cache, and returns it)
        return m(input_ids=ids).logits
    cm = ct.capture(logits, ids, attention="traced")
    got = cm.run(ids, stack="torch_compile")
    torch._dynamo.reset()
    with torch.no_grad():
        want = torch.compile(logits, dynamic=False)(ids)
        eager = logits(ids)
    torch._dynamo.reset()
    assert torch.equal(got, want), f"{int((got != want).sum())} of {want.numel()} differ"
    assert not torch.equal(eager, want)  # (what the comparison could miss)
    assert torch.equal(cm.run(ids, stack="hf_eager"), eager)
    pl = _inductor.placement_for(cm, cm._flat_inputs((ids,), None))
    norms = [n for n in cm.nodes if str(n.target) == "aten.layer_norm.default"]
    assert len(norms) == 2 * layers + 1 and all(n.name in pl.stored for n in norms)


def test_cat_skips_pytorchs_legacy_empty_tensor():
    """torch.cat ignores a tensor of shape [0] among tensors of other shapes (a KV cache
    that starts empty), but still promotes with its dtype."""
    e, x = torch.zeros(0, dtype=torch.float64), torch.ones(2, 3)
    for ts, dim in (([e, x], 0), ([x, e], -2), ([e, x, e], 1)):
        want = torch.cat(ts, dim)
        got = cl.cat([cl.tensor(t.numpy()) for t in ts], dim)
        assert tuple(got.shape) == tuple(want.shape) and got.dtype.name == "float64"
        np.testing.assert_array_equal(np.asarray(got.tolist()), want.numpy())
    assert tuple(cl.cat([cl.zeros(0), cl.zeros(0)]).shape) == (0,)
    with pytest.raises(ValueError, match="does not match"):
        cl.cat([cl.ones((2, 3)), cl.ones((2, 4))], 0)
    with pytest.raises(ValueError, match="tensor 2 has shape"):  # the caller's position
        cl.cat([cl.zeros(0), cl.ones((2, 3)), cl.ones((2, 4))], 0)


def _counted_reads(monkeypatch) -> list:
    """A list that gains an item each time a placement is read (compiled), with the
    process-wide placement cache emptied."""
    calls = []
    read = _inductor.read_placement
    monkeypatch.setattr(_inductor, "read_placement",
                        lambda cm, flat: calls.append(1) or read(cm, flat))
    monkeypatch.setattr(_inductor, "_SHARED", {})
    return calls


def _sin_add(x):
    return (x * 3).float().sin().to(x.dtype) + x


@pytest.mark.inductor
def test_a_second_capture_of_the_same_graph_reads_the_placement_without_compiling(
        monkeypatch):
    """The placement depends on the graph, the devices, shapes, strides and dtypes, not on
    the weights: a fresh capture of the same function reuses it; another shape or a
    transposed input compiles again."""
    calls = _counted_reads(monkeypatch)
    f = _sin_add
    x = torch.randn(4, 8).to(torch.bfloat16)
    pl = ct.inductor_stores(ct.capture(f, x), x)
    assert ct.inductor_stores(ct.capture(f, x + 1), x + 1) is pl and len(calls) == 1
    y = torch.randn(8, 4).to(torch.bfloat16)
    assert ct.inductor_stores(ct.capture(f, y), y) is not pl and len(calls) == 2
    t = y.t()  # the shape of x, other strides
    assert ct.inductor_stores(ct.capture(f, t), t) is not pl and len(calls) == 3


@pytest.mark.inductor
def test_torch_compile_stack_loss_equals_torch_compile_on_the_cpu():
    """A Qwen2 called with labels (2 layers, hidden 896, 4,096 classes, 2 x 64 tokens, one
    torch thread): the torch_compile stack's loss equals torch.compile's. The captured
    graph has one cross_entropy_loss node whose Inductor parts reduce with two widths
    (the log-softmax's rows by 32 bf16 lanes under AVX512, the sum over the rows by 16
    float ones): each reduction takes its own part's lanes (by its length), where the
    first part's lanes for all gave a loss 1 ulp away."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        cfg = transformers.Qwen2Config(hidden_size=896, num_attention_heads=14,
                                       num_key_value_heads=2, intermediate_size=4864,
                                       vocab_size=4096, num_hidden_layers=2,
                                       max_position_embeddings=256, rms_norm_eps=1e-6)
        cfg._attn_implementation = "sdpa"
        m = transformers.Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()
        with torch.no_grad():
            for name, p in m.named_parameters():
                if "norm" in name:
                    p.copy_(1 + 0.1 * torch.randn_like(p))
        ids = torch.randint(0, 4096, (2, 64))
        kw = {"use_cache": False, "labels": ids}
        want, got, cm = compiled_and_stack(m, ids, kw)
        assert torch.equal(got.logits, want.logits)
        assert torch.equal(got.loss, want.loss), (float(got.loss), float(want.loss))
        pl = _inductor.placement_for(cm, cm._flat_inputs((ids,), kw))
        if torch.backends.cpu.get_cpu_capability() == "AVX512":
            parts = pl.computing["cross_entropy_loss"]
            assert {(pl.rsizes[p], abs(pl.lanes[p])) for p in parts if p in pl.lanes} == \
                {(4096, 32), (128, 16)}
    finally:
        torch.set_num_threads(n)


@pytest.mark.inductor
@pytest.mark.parametrize("dt,red,ls,weighted", [("bfloat16", "sum", 0.0, False),
                                                ("bfloat16", "sum", 0.1, False),
                                                ("bfloat16", "mean", 0.0, True),
                                                ("float32", "mean", 0.1, True)])
def test_torch_compile_stack_loss_with_a_scalar_tail_loop(dt, red, ls, weighted):
    """Cross-entropy over 20 rows (one ignored) of 4,097 classes. Inductor's C++ kernel
    summing the loss over the rows has a last partial vector of 4 rows (AVX2: 8 floats a
    vector; AVX512: 16), and its masked selects are over 12 % of its ops, so
    `_tail_vec_worthwhile` says no: those rows run the scalar tail loop, summed from zero
    on their own and added to the lanes' butterfly at the end. The torch_compile stack
    reads that from the program (its lanes, negative); with the tail taken as a masked
    vector (before) the loss was 1 ulp away in these four cases."""
    g = torch.Generator().manual_seed(4117)
    x = (torch.randn(20, 4097, generator=g) * 2).to(getattr(torch, dt))
    t = torch.randint(0, 4097, (20,), generator=g)
    t[10] = -100
    w = torch.rand(4097, generator=g) + 0.5 if weighted else None

    def f(a, b):
        return torch.nn.functional.cross_entropy(a.float(), b, weight=w, reduction=red,
                                                 label_smoothing=ls)

    n = torch.get_num_threads()
    torch.set_num_threads(1)  # (one thread: the tests' other Inductor compiles use one)
    try:
        torch._dynamo.reset()
        want = torch.compile(f, dynamic=False)(x, t)
        torch._dynamo.reset()
        cm = ct.capture(f, x, t)
        got = cm.run(x, t, stack="torch_compile")
    finally:
        torch.set_num_threads(n)
    assert got.view(torch.int32) == want.view(torch.int32), (float(got), float(want))
    pl = _inductor.placement_for(cm, cm._flat_inputs((x, t), {}))
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        assert any(w < -1 for w in pl.lanes.values()), pl.lanes


@pytest.mark.inductor
@pytest.mark.parametrize("n", [100001, 40009, 9])
@pytest.mark.parametrize("threads", [1, 2])
def test_torch_compile_stack_sum_with_a_scalar_tail_loop_split_over_threads(n, threads):
    """A masked sum of one long row (`where` is 1 of 5 ops: over 12 %): Inductor's C++
    kernel runs the row's last partial vector as the scalar tail loop. On 2 threads the
    row is split over them (libgomp's static schedule of the vector iterations, the tail's
    iteration counted: its thread's scalar accumulator holds the tail) and every thread's
    full vectors run CascadeSumHelper. fp32 and bf16 (16-bit vectors); a row shorter
    than one vector is all tail."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for dt in (torch.float32, torch.bfloat16):
            g = torch.Generator().manual_seed(n)
            x = (torch.randn(n, generator=g) * 3).to(dt)
            m = torch.rand(n, generator=g) > 0.3

            def f(a, b):
                return torch.where(b, a.float() * 1.5, 0.0).sum()

            torch._dynamo.reset()
            want = torch.compile(f, dynamic=False)(x, m)
            torch._dynamo.reset()
            got = ct.capture(f, x, m).run(x, m, stack="torch_compile")
            assert got.view(torch.int32) == want.view(torch.int32), (dt, float(got), float(want))
    finally:
        torch.set_num_threads(before)


@pytest.mark.inductor
def test_a_placement_is_read_again_under_other_inductor_settings(monkeypatch):
    """Inductor settings that change its program (deterministic configs,
    emulate_precision_casts, max-autotune, ...) key the placement too: the same capture
    under another setting compiles again; back under the first, the first is reused."""
    from torch._inductor import config as iconfig

    calls = _counted_reads(monkeypatch)
    f = _sin_add
    x = torch.randn(4, 8).to(torch.bfloat16)
    cm = ct.capture(f, x)
    pl = ct.inductor_stores(cm, x)
    with iconfig.patch(deterministic=True):
        assert ct.inductor_stores(cm, x) is not pl and len(calls) == 2
    with iconfig.patch(emulate_precision_casts=True):
        ct.inductor_stores(cm, x)
    with iconfig.patch(online_softmax=False, split_reductions=False):
        ct.inductor_stores(cm, x)
    assert len(calls) == 4
    assert ct.inductor_stores(cm, x) is pl and len(calls) == 4


@pytest.mark.inductor
def test_a_placement_is_read_from_disk_in_a_later_process(monkeypatch, tmp_path):
    """With a placement folder, a placement read once is reused after the process's own
    cache is gone (a later process): the same stores, no compile. Another shape compiles
    again; a damaged entry is read again from the compiler; a folder others can write to
    is not trusted; CASTLAB_PLACEMENT_DIR set but empty turns the disk cache off."""
    from castlab.torch import _placement_cache

    d = tmp_path / "placements"
    monkeypatch.setenv("CASTLAB_PLACEMENT_DIR", str(d))
    calls = _counted_reads(monkeypatch)
    x = torch.randn(4, 8).to(torch.bfloat16)
    pl = ct.inductor_stores(ct.capture(_sin_add, x), x)
    assert len(calls) == 1 and len(list(d.glob("*.pkl"))) == 1
    assert oct(d.stat().st_mode & 0o777) == "0o700"
    monkeypatch.setattr(_inductor, "_SHARED", {})
    again = ct.inductor_stores(ct.capture(_sin_add, x + 1), x + 1)
    assert len(calls) == 1 and again is not pl
    assert dataclasses.asdict(again) == dataclasses.asdict(pl)
    y = torch.randn(8, 4).to(torch.bfloat16)
    ct.inductor_stores(ct.capture(_sin_add, y), y)
    assert len(calls) == 2 and len(list(d.glob("*.pkl"))) == 2
    for f in d.glob("*.pkl"):
        f.write_bytes(b"not a pickle")
    monkeypatch.setattr(_inductor, "_SHARED", {})
    assert dataclasses.asdict(ct.inductor_stores(ct.capture(_sin_add, x), x)) == \
        dataclasses.asdict(pl)
    assert len(calls) == 3
    d.chmod(0o777)
    monkeypatch.setattr(_inductor, "_SHARED", {})
    ct.inductor_stores(ct.capture(_sin_add, x), x)
    assert len(calls) == 4
    monkeypatch.setenv("CASTLAB_PLACEMENT_DIR", "")
    assert _placement_cache.placement_dir() is None


def _emulated_triton_sum_of_squares(z, tile, fused: bool):
    """A row's sum of squares as Inductor's persistent Triton kernel with `tile`
    (R0_BLOCK, per thread, lanes, warps) computes it, from its PTX (H100, torch 2.11):
    each thread's contiguous elements fold into fma(e0, e0, e1*e1), then fma(ek, ek, acc)
    (`fused`; else rounded products added in order), the lanes' and then the warps' xor
    butterflies. Exact fmas by rationals."""
    from fractions import Fraction

    r, per, lanes, warps = tile
    z = np.concatenate([z, np.zeros(r - len(z), np.float32)])
    parts = []
    for t in range(lanes * warps):
        e = z[per * t:per * t + per]
        if fused:
            acc = np.float32(float(Fraction(float(e[0])) ** 2
                                   + Fraction(float(np.float32(e[1] * e[1])))))
            for k in range(2, per):
                acc = np.float32(float(Fraction(float(e[k])) ** 2 + Fraction(float(acc))))
        else:
            acc = np.float32(e[0] * e[0])
            for k in range(1, per):
                acc = np.float32(acc + np.float32(e[k] * e[k]))
        parts.append(acc)
    q = np.array(parts, np.float32).reshape(warps, lanes)
    off = lanes // 2
    while off:
        q[:, :off] = q[:, :off] + q[:, off:2 * off]
        off //= 2
    w, off = q[:, 0].copy(), warps // 2
    while off:
        w[:off] = w[:off] + w[off:2 * off]
        off //= 2
    return w[0]


@pytest.mark.inductor
def test_a_triton_tile_orders_a_sum_of_squares_with_the_threads_fmas(monkeypatch):
    """On a GPU the placement carries each reduction kernel's tile as its autotuner
    launched it (here injected into a CPU placement: the CPU's program has no Triton
    kernels). A row sum of (x + r).float() ** 2 then follows that tile, each thread's
    squares contracted into fmas as ptxas does, equal to an independent emulation where
    castlab's default tile and the order without fmas are not."""
    import dataclasses

    def f(x, r):
        return (x + r).float().pow(2).sum(-1)

    from castlab.torch import _stacks
    monkeypatch.setattr(_stacks, "CPU_MATH", {})  # the GPU's inductor math on CPU inputs
    g = torch.Generator().manual_seed(0)
    x, r = ((torch.randn(64, 896, generator=g) * 3).to(torch.bfloat16) for _ in range(2))
    cm = ct.capture(f, x, r)
    plain = cm.run(x, r, stack="torch_compile").numpy()
    pl = ct.inductor_stores(cm, x, r)
    assert pl.tiles == {}  # the CPU's C++ kernels
    tile = (1024, 4, 32, 8)
    injected = dataclasses.replace(pl, tiles={p: tile for p in pl.mem})
    monkeypatch.setattr(_inductor, "placement_for", lambda cm_, flat: injected)
    cm.__dict__.pop("_placed_segments", None)
    got = cm.run(x, r, stack="torch_compile").numpy()
    z = (x.float() + r.float()).numpy()
    want = np.array([_emulated_triton_sum_of_squares(row, tile, True) for row in z])
    unfused = np.array([_emulated_triton_sum_of_squares(row, tile, False) for row in z])
    assert (got == want).all(), int((got != want).sum())
    assert (plain != want).any() and (unfused != want).any()


def test_the_tile_of_an_autotuned_reduction_kernel():
    """_inductor_tiles.tile: (R0_BLOCK, per thread, lanes, warps) from the launched config, the
    size hints and the kernel's pointer dtypes; None for a pointwise kernel or one not
    autotuned to one config."""
    from types import SimpleNamespace as NS

    def tuner(kw, warps, hints, sig, n=1):
        return NS(launchers=[NS(config=NS(kwargs=kw, num_warps=warps))] * n,
                  size_hints=hints, triton_meta={"signature": sig})

    bf = {"in_ptr0": "*bf16", "in_ptr1": "*bf16", "out_ptr0": "*fp32", "xnumel": "i32"}
    # the H100's RMSNorm kernel of hidden 896 (its ttgir: sizePerThread [1, 4],
    # threadsPerWarp [1, 32], warpsPerCTA [1, 8])
    assert _inductor_tiles.tile(tuner({"XBLOCK": 1}, 8, {"x": 128, "r0_": 1024}, bf)) == (
        1024, 4, 32, 8)
    assert _inductor_tiles.tile(tuner({"XBLOCK": 1, "R0_BLOCK": 2048}, 16,
                                 {"x": 128, "r0_": 4096}, bf)) == (2048, 4, 32, 16)
    assert _inductor_tiles.tile(tuner({"XBLOCK": 1}, 4, {"x": 128, "r0_": 1024},
                                 {"in_ptr0": "*fp32"})) == (1024, 4, 32, 4)
    assert _inductor_tiles.tile(tuner({"XBLOCK": 256}, 4, {"x": 1024}, bf)) is None
    assert _inductor_tiles.tile(tuner({"XBLOCK": 1}, 8, {"x": 128, "r0_": 1024}, bf, n=2)) is None
    assert _inductor_tiles.tile(None) is None


def test_inductor_stores_refuses_what_is_not_captured():
    x = torch.ones(4, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="capture it first"):
        ct.inductor_stores(lambda x: x * 2, x)


def test_stores_choice_of_a_stack():
    tc = ct.Stack("torch_compile")
    assert tc.stores == "inductor" and ct.Stack("liger").stores is None
    s = tc.replace(stores=None)
    assert s.stores is None and s != tc and s.name == "torch_compile+stores=None"
    assert "  stores     inductor " in tc.describe()
    with pytest.raises(ValueError, match="stores must be None or 'inductor'"):
        ct.Stack(stores="triton")


def test_a_store_rounds_where_a_cast_does_not():
    """ops._store (the rounding of a value a kernel stores and another loads) rounds under
    a policy that drops casts (round_casts=False, Inductor's default), as an astype does
    not; fp64 rounds neither. Checked against NumPy/ml_dtypes over every bf16 pattern."""
    from castlab import ops

    bits = np.arange(65536, dtype=np.uint16)
    xb = bits.view(ml_dtypes.bfloat16)
    x = cl.tensor(xb.astype(np.float32)).astype(cl.bfloat16)
    pol = cl.Policy("fused", round_casts=False)
    store = cl.jit(lambda x: ops._store(x * 1.37, cl.bfloat16) * 1.01)
    cast = cl.jit(lambda x: (x * 1.37).astype(cl.bfloat16) * 1.01)
    x32 = xb.astype(np.float32)
    with np.errstate(all="ignore"):
        twice = ((x32 * np.float32(1.37)).astype(ml_dtypes.bfloat16).astype(np.float32)
                 * np.float32(1.01)).astype(ml_dtypes.bfloat16)
        once = (x32 * np.float32(1.37) * np.float32(1.01)).astype(ml_dtypes.bfloat16)
    got_s = np.asarray(store.run(x, policy=pol)).view(np.uint16)
    got_c = np.asarray(cast.run(x, policy=pol)).view(np.uint16)
    nan = np.isnan(x32)
    assert np.array_equal(got_s[~nan], twice.view(np.uint16)[~nan])
    assert np.array_equal(got_c[~nan], once.view(np.uint16)[~nan])
    assert not np.array_equal(got_s, got_c)
    assert "# store: round to nearest even" in store.trace(x, policy=pol)
    assert "# store" not in cast.trace(x, policy=pol)
    f64 = np.asarray(store.run(x, policy="fp64"))
    assert f64.dtype == np.float64


def test_inductor_pow_is_repeated_squaring():
    """Math.pow="inductor" (the inductor preset): x ** n for an integer-valued Python
    number 0 <= n < 32 is Inductor's pow_recursive, in fp32: x**3 = (x*x)*x, x**0 = 1,
    2.0 like 2; every bf16 pattern against NumPy. Other exponents keep PyTorch's pow."""
    bits = np.arange(65536, dtype=np.uint16)
    xb = bits.view(ml_dtypes.bfloat16)
    x32 = xb.astype(np.float32)
    x = cl.tensor(x32).astype(cl.bfloat16)
    nan = np.isnan(x32)
    assert cl.Math.preset("inductor").pow == "inductor" and cl.Math().pow == "torch"

    def rec(k):
        if k == 0:
            return np.ones_like(x32)
        if k == 1:
            return x32
        h = rec(k // 2)
        return h * h * x32 if k % 2 else h * h

    for n in (0, 1, 2, 3, 5, 2.0, 31):
        f = cl.jit(lambda x, n=n: x ** n)
        got = np.asarray(f.run(x, policy="fused", math="inductor")).view(np.uint16)
        with np.errstate(all="ignore"):
            want = rec(int(n)).astype(ml_dtypes.bfloat16).view(np.uint16)
        assert np.array_equal(got[~nan], want[~nan]), n
    f = cl.jit(lambda x: x ** 3)
    assert "Inductor's pow_recursive" in f.trace(x, policy="fused", math="inductor")
    assert "pow_recursive" not in f.trace(x, policy="fused", math="torch_eager")
    g = cl.jit(lambda x: x ** 2.5)
    assert "pow_recursive" not in g.trace(x, policy="fused", math="inductor")
    with pytest.raises(ValueError, match="pow"):
        cl.Math(pow="triton")


@pytest.mark.inductor
@pytest.mark.parametrize("f", [lambda x: torch.var(x, dim=-1),
                               lambda x: torch.var(x, dim=-1, correction=0, keepdim=True),
                               lambda x: x.var(0, unbiased=False)],
                         ids=["var.dim", "var.correction", "var.dim-unbiased-false"])
def test_captured_var_is_castlabs_under_every_stack(f):
    """aten.var.dim and aten.var.correction are computed by castlab (they ran in PyTorch,
    eagerly, under the torch_compile stack too: 5 of 8 fp32 rows differed from
    torch.compile): eager's bits under hf_eager, torch.compile's under torch_compile."""
    torch.manual_seed(0)
    x = torch.randn(8, 2000)
    cm = ct.capture(f, x)
    assert any("var" in str(n.target) for n in cm.nodes)
    assert torch.equal(cm.run(x, stack="hf_eager"), f(x))
    torch._dynamo.reset()
    want = torch.compile(f, dynamic=False)(x)
    torch._dynamo.reset()
    assert torch.equal(cm.run(x, stack="torch_compile"), want)


# Excerpts of the PTX Triton 3.6 wrote on an H100 for Inductor's RoPE kernel of a Qwen2
# attention (q * cos + rotate_half(q) * sin, cos/sin recomputed in fp32), two of the
# configurations its autotuner compiled: 16 x 64 (q * cos through shared memory) and
# 1024 x 1 (no layout conversion).
_PTX_WHERE = """
	ld.shared.b32 	%r118, [%r117];
	ld.shared.b32 	%r873, [%r117];
	cvt.f32.bf16 	%r886, %rs27;
	selp.f32 	%r888, %r885, %r887, %p63;
	selp.f32 	%r889, %r884, %r886, %p63;
	fma.rn.f32 	%r890, %r889, %r873, %r118;
	fma.rn.f32 	%r891, %r888, %r875, %r121;
	cvt.rn.bf16x2.f32 	%r869, %r891, %r890;
	@%p123 st.global.v4.b32 [ %rd159 + 0 ], { %r869, %r870, %r871, %r872 };
"""
_PTX_PLAIN = """
	fma.rn.ftz.f32 	%r930, %r930, %r304, %r298;
	cvt.f32.bf16 	%r29, %rs1;
	selp.f32 	%r600, %r601, %r602, %p7;
	mul.f32 	%r610, %r600, %r939;
	fma.rn.f32 	%r620, %r930, %r29, %r610;
	cvt.rn.bf16.f32 	%rs40, %r620;
"""


def test_which_product_a_triton_kernels_fma_fuses():
    """_inductor_tiles.ptx_fused_product reads the launched kernel's PTX: the fma whose sum
    is rounded to the output takes the select's product (rotate_half(q) * sin), or the
    other (q * cos); None where no fma reaches an output or the fmas disagree."""
    assert _inductor_tiles.ptx_fused_product(_PTX_WHERE) == "where"
    assert _inductor_tiles.ptx_fused_product(_PTX_PLAIN) == "plain"
    assert _inductor_tiles.ptx_fused_product(_PTX_WHERE + _PTX_PLAIN) is None
    assert _inductor_tiles.ptx_fused_product("\tadd.f32 %r1, %r2, %r3;\n"
                                             "\tcvt.rn.bf16.f32 %rs1, %r1;\n") is None
    from types import SimpleNamespace as NS
    asm = NS(asm={"ptx": _PTX_WHERE.encode()})
    assert _inductor_tiles.fused_product(NS(launchers=[NS(bin=asm)])) == "where"
    assert _inductor_tiles.fused_product(NS(launchers=[NS(bin=asm)] * 2)) is None  # not tuned
    assert _inductor_tiles.fused_product(NS(launchers=[NS()])) is None
    assert _inductor_tiles.fused_product(None) is None


def test_the_launched_ptx_of_a_statically_launched_kernel(tmp_path, monkeypatch):
    """Inductor's static launcher keeps no compiled kernel, only its key in Triton's cache:
    _inductor_tiles.launched_ptx reads the PTX file there (TRITON_CACHE_DIR, as Inductor
    sets it), and gives None for a key with no PTX or an untuned kernel."""
    from types import SimpleNamespace as NS

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    (tmp_path / "KEY1").mkdir()
    (tmp_path / "KEY1" / "triton_poi_fused_0.ptx").write_text(_PTX_PLAIN)
    (tmp_path / "KEY1" / "triton_poi_fused_0.json").write_text("{}")
    meta = {"device": NS(index=0)}
    tuned = NS(launchers=[NS(cache_hash="KEY1")], triton_meta=meta)
    assert _inductor_tiles.launched_ptx(tuned) == _PTX_PLAIN
    assert _inductor_tiles.fused_product(tuned) == "plain"
    assert _inductor_tiles.launched_ptx(NS(launchers=[NS(cache_hash="NONE")],
                                           triton_meta=meta)) is None
    assert _inductor_tiles.launched_ptx(NS(launchers=[NS(cache_hash="KEY1")] * 3)) is None


def _rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


def test_the_fused_product_of_a_rope_add_follows_the_kernel():
    """_triton_choices.fuses_right on HF's RoPE add (q * cos + cat(-q2, q1) * sin): the right
    product where the kernel's fma takes the select's ("where"), the left where it takes
    the other ("plain") or nothing was read; an add whose products both have a select, or
    that is no add of two products, is left alone."""
    x = torch.randn(1, 2, 8, 16).to(torch.bfloat16)
    c = torch.randn(8, 16).to(torch.bfloat16)
    cm = ct.capture(_rope, x, c, c)
    (add,) = [n for n in cm.nodes if str(n.target) == "aten.add.Tensor"]
    assert _triton_choices.fuses_right(add, "where")
    assert not _triton_choices.fuses_right(add, "plain")
    assert not _triton_choices.fuses_right(add, None)
    swapped = ct.capture(lambda x, c, s: _rope(x, c, s).flip(-1) + x * c, x, c, c)
    last = [n for n in swapped.nodes if str(n.target) == "aten.add.Tensor"][-1]
    assert not _triton_choices.fuses_right(last, "where")  # (flip(add) * 1 is no product)
    mul = next(n for n in cm.nodes if str(n.target) == "aten.mul.Tensor")
    assert not _triton_choices.fuses_right(mul, "where")


def test_an_add_marked_for_its_right_product_contracts_it():
    """The lowering's fma contraction (castlab._lower_build._try_fma) takes the right
    product of a + b where the add carries fma_side="right" (what _inductor reads from a
    Triton kernel), else the left: fp32 RoPE with cos/sin casts dropped, as Inductor's
    kernel computes it, against NumPy's fma(rot, sin, q*cos) and fma(q, cos, rot*sin)
    (float64 products are exact; one rounding to fp32, then bf16)."""
    from castlab import _graph

    rng = np.random.default_rng(3)
    q = (rng.standard_normal((2, 14, 64, 64)) + 1).astype(ml_dtypes.bfloat16)
    ang = np.arange(64)[:, None] * (1.0 / 10000 ** (np.arange(0, 64, 2) / 64))[None]
    emb = np.concatenate([ang, ang], -1)
    cos, sin = np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)

    def f(right):
        def g(q, c, s):
            c, s = cl.astype(c, "bfloat16"), cl.astype(s, "bfloat16")  # dropped by the policy
            a = q * c
            b = cl.cat([-q[..., 32:], q[..., :32]], dim=-1) * s
            _graph._state.annot = {"fma_side": "right"} if right else None
            try:
                return a + b
            finally:
                _graph._state.annot = None
        return g

    pol = cl.Policy("fused", round_casts=False)
    args = [cl.from_dlpack(torch.from_numpy(v.view(np.uint16)).view(torch.bfloat16))
            if v.dtype == ml_dtypes.bfloat16 else cl.from_dlpack(torch.from_numpy(v))
            for v in (q, cos, sin)]
    got = {r: np.asarray(torch.from_dlpack(cl.jit(f(r)).run(*args, policy=pol, math="inductor"))
                         .float()) for r in (False, True)}
    qd = q.astype(np.float64)
    rot = np.concatenate([-qd[..., 32:], qd[..., :32]], -1)
    qc = (q.astype(np.float32) * cos).astype(np.float64)
    rs = (rot.astype(np.float32) * sin).astype(np.float64)
    left = (qd * cos + rs).astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
    right = (rot * sin + qc).astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
    assert int((left != right).sum()) > 0  # the two contractions differ somewhere here
    assert np.array_equal(got[False], left)
    assert np.array_equal(got[True], right)
