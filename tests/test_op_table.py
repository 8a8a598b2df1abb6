"""The op table (ops/op_table.h) and what is derived from it; hardswish, the op added
through it (its table line, its scalar function, and this file)."""

from __future__ import annotations

import numpy as np
import pytest

import castlab as cl
import castlab.cuda as clcuda
from castlab import _C
from castlab._optable import OPS, TABLE

torch = pytest.importorskip("torch")


def test_opcodes_names_and_categories_are_consistent():
    names = [o.name for o in TABLE]
    assert len(set(names)) == len(names)
    assert [o.opcode for o in TABLE] == list(range(len(TABLE)))
    cats = {o.category for o in TABLE}
    assert cats == {"internal", "unary_float", "unary_signed", "binary", "compare", "ternary",
                    "conditional"}
    for o in TABLE:
        assert (o.arity == 0) == (o.category == "internal"), o
        assert o.cost >= 1 or o.category == "internal", o


def test_every_public_op_is_exported_and_a_method():
    for o in OPS.values():
        if not o.public:
            continue
        assert o.name in cl.__all__, o.name
        f = getattr(cl, o.name)
        assert f.__name__ == o.name and f.__doc__
        if o.arity <= 2 and hasattr(torch.Tensor, o.name):  # PyTorch's methods
            assert callable(getattr(cl.Tensor, o.name)), o.name
    assert "gelu_tanh" not in cl.__all__  # reached through gelu(approximate="tanh")


def test_castlab_ops_lists_the_table():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "castlab", "ops"], capture_output=True,
                       text=True, check=True)
    rows = [line for line in r.stdout.splitlines()[1:] if not line.startswith(" ")]
    listed = {line.split()[0].strip("()") for line in rows}
    assert listed == set(OPS)
    assert "hardswish_recip6" in r.stdout
    # each op's derivative rule follows it, indented
    assert "grad: [silu_backward] s = 1 / (1 + exp(-x))" in r.stdout
    assert r.stdout.count("grad:") == sum(1 for o in OPS.values() if o.grad)


def test_trace_and_describe_come_from_the_table():
    @cl.jit
    def f(x):
        return cl.hardswish(x) * 2

    x = cl.randn(8, dtype=cl.bfloat16)
    tr = f.trace(x, policy="eager")
    assert "hardswish(" in tr
    # a variant factor only shows where the op listens to it
    m = cl.Math(silu="mul_sigmoid", sigmoid="ex2_approx")
    assert m.variant_bits("add", False, True) == 0
    bits = _C.VARIANT_BITS
    assert m.variant_bits("silu", False, True) & bits["sigmoid_ex2"]
    assert not cl.Math(sigmoid="ex2_approx").variant_bits("silu", False, True) & bits["sigmoid_ex2"]
    assert cl.Math.preset("torch_eager").variant_bits("hardswish", False, True) == \
        bits["hardswish_recip6"]
    assert cl.Math.preset("torch_eager").variant_bits("hardswish", False, False) == 0


def test_instr_and_program_have_named_fields_and_are_checked():
    i = _C.Instr(op=OPS["exp"].opcode, rtype=0, dst=1, a=0, var=1)
    assert (i.op, i.dst, i.a, i.b, i.var) == (OPS["exp"].opcode, 1, 0, -1, 1)
    assert "dst=1" in repr(i)
    with pytest.raises(TypeError, match="unknown field 'dest'"):
        _C.Instr(dest=1)
    load = _C.Instr(op=_C.OP_TABLE[0]["opcode"], dst=0, dtype=1)  # load input 0
    out = _C.OutputSpec(reg=1)
    p = _C.Program([load, i], 2, [out])
    assert [c.op for c in p.code] == [load.op, i.op] and p.outputs[0].reg == 1
    with pytest.raises(ValueError, match="out of range"):
        _C.Program([load, _C.Instr(op=i.op, dst=5, a=0)], 2, [out])
    with pytest.raises(ValueError, match="unknown opcode"):
        _C.Program([_C.Instr(op=250, dst=0)], 1, [_C.OutputSpec(reg=0)])
    with pytest.raises(ValueError, match="needs 2 operands"):
        _C.Program([load, _C.Instr(op=OPS["add"].opcode, dst=1, a=0)], 2, [out])
    with pytest.raises(ValueError, match="unknown dtype code"):
        _C.Program([_C.Instr(op=load.op, dst=0, dtype=99)], 1, [_C.OutputSpec(reg=0)])


# ---------------------------------------------------------------- hardswish vs PyTorch

def _patterns(tdt):
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    return bits.view(tdt)


def _same_bits(a, b) -> int:
    """Number of elements whose bits differ (any NaN matches any NaN)."""
    a, b = a.cpu(), b.cpu()
    nan = torch.isnan(a) & torch.isnan(b)
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return int(((a.view(width) != b.view(width)) & ~nan).sum())


def _specials(t):
    t[:7] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, -3.0, 3.0])
    return t


@pytest.mark.parametrize("tdt", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_hardswish_exhaustive_vs_torch_cpu(tdt):
    t = _patterns(tdt)
    got = torch.from_dlpack(cl.hardswish(cl.from_dlpack(t)))
    assert _same_bits(got, torch.nn.functional.hardswish(t)) == 0


@pytest.mark.parametrize("tdt", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_hardswish_random_strided_vs_torch_cpu(tdt):
    g = torch.Generator().manual_seed(0)
    t = _specials(torch.randn(300_001, generator=g, dtype=torch.float64).mul(5).to(tdt))
    want = torch.nn.functional.hardswish(t)
    assert _same_bits(torch.from_dlpack(cl.hardswish(cl.from_dlpack(t))), want) == 0
    assert _same_bits(torch.from_dlpack(cl.hardswish(cl.from_dlpack(t[::3]))), want[::3]) == 0


def test_hardswish_fused_and_traced():
    x = cl.from_dlpack(torch.randn(64, 32).to(torch.bfloat16))

    @cl.jit
    def f(x):
        return cl.hardswish(x) * x

    eager = f.run(x, policy="eager")
    plain = cl.hardswish(x) * x
    assert np.array_equal(eager.numpy().view(np.uint16), plain.numpy().view(np.uint16))
    fused = f(x)
    ref = f.run(x, policy="fp64")
    assert fused.dtype == cl.bfloat16 and ref.dtype == cl.float64
    with pytest.raises(TypeError, match="bool"):
        cl.hardswish(cl.tensor([True]))
    assert cl.hardswish(cl.tensor([3], dtype=cl.int32)).dtype == cl.float32


@pytest.mark.cuda
@pytest.mark.skipif(not clcuda.is_available(), reason="no CUDA GPU for castlab")
@pytest.mark.parametrize("tdt", [torch.bfloat16, torch.float16, torch.float32, torch.float64],
                         ids=["bf16", "f16", "f32", "f64"])
def test_hardswish_vs_torch_cuda(tdt):
    if tdt in (torch.bfloat16, torch.float16):
        t = _patterns(tdt).cuda()
    else:
        g = torch.Generator().manual_seed(1)
        t = _specials(torch.randn(1 << 20, generator=g, dtype=torch.float64).mul(5).to(tdt)).cuda()
    want = torch.nn.functional.hardswish(t)
    got = torch.from_dlpack(cl.hardswish(cl.from_dlpack(t)))
    assert _same_bits(got, want) == 0
    x = cl.from_dlpack(t)
    fused = cl.jit(lambda x: cl.hardswish(x))(x)
    assert _same_bits(torch.from_dlpack(fused), want) == 0


# ---------------------------------------------------------------- one table per kind of fact

def test_variant_bits_come_from_one_table():
    """ops/scalar/ops.h CL_VARIANT_BITS: the enum, _C.VARIANT_BITS and _optable's
    constants all derive from it; every bit names the Math field that sets it."""
    import dataclasses

    from castlab import _optable

    table = _optable.VARIANT_BITS
    assert len(table) == 19 and dict(_C.VARIANT_BITS) == {b.name: b.bit for b in table}
    assert _optable.BITS == dict(_C.VARIANT_BITS)
    seen = 0
    for b in table:
        assert b.bit and not b.bit & seen, b  # distinct, non-overlapping
        seen |= b.bit
        assert b.doc, b
    fields = {f.name for f in dataclasses.fields(cl.Math)}
    assert {b.math_field for b in table} <= fields | {""}
    # what the constants policy.py reads are, by the Math field column
    assert _optable.TORCH_CUDA_BITS == (_optable.BITS["rsqrt_fast"] | _optable.BITS["fma_in_op"]
                                        | _optable.BITS["hardswish_recip6"]
                                        | _optable.BITS["pow_device"])
    assert _optable.APPROX_DIV == 0x8 and _optable.SIGMOID_EX2 == 0x10
    assert _optable.SILU_MUL_SIGMOID == 0x4 and _optable.IMPL_MASK == 0x3
    assert _optable.RSQRT_APPROX_FTZ == _optable.BITS["rsqrt_approx_ftz"] == 0x40000
    assert _optable.NEG_ZERO_MINUS == _optable.BITS["neg_zero_minus"] == 0x80000
    # the trace has a note for each bit Math.cuda_kernels sets, from the table's column
    for b in table:
        assert bool(b.trace) == (b.math_field == "cuda_kernels"), b
    # every op's factors are table bits
    for o in OPS.values():
        assert not o.factors & ~seen, o


# Ops PyTorch has no ATen op for (the table marks them kCastlabOnly): adding one here is a
# decision, not an accident.
# div_add: the lowering's contraction of Triton's approximate division into an add.
CASTLAB_ONLY = {"fma", "div_add"}


def test_every_op_has_an_aten_name_torch_resolves_or_is_castlab_only():
    from castlab.torch._aten import TORCH_OPS, castlab_fn, torch_fn

    assert {o.name for o in OPS.values() if o.aten is None} == CASTLAB_ONLY
    assert all(o.aten is None for o in TABLE if o.category == "internal")
    x = torch.linspace(-4, 4, 9, dtype=torch.float32)
    for o in OPS.values():
        if o.aten is None:
            with pytest.raises(KeyError):
                torch_fn(o.name)
            continue
        name = o.aten.split()[0]
        assert name.startswith("aten."), o
        assert hasattr(torch.ops.aten, name[5:]), o  # resolves
        assert TORCH_OPS[o.name] is not None
        if o.arity == 1:  # the keyword arguments are accepted too, and castlab agrees
            want = TORCH_OPS[o.name](x)
            got = castlab_fn(o.name)(cl.from_numpy(x.numpy())).numpy()
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
    assert set(TORCH_OPS) == {o.name for o in OPS.values() if o.aten}


def test_castlab_torch_maps_every_aten_op():
    """castlab.torch's ATen map holds every op of the table that has an ATen name."""
    from castlab.torch._aten import ATEN

    mapped = {k.split(".")[1] for k in ATEN}
    for o in OPS.values():
        if o.aten:
            assert o.aten.split()[0][5:] in mapped, o


def test_test_maps_cover_every_aten_op():
    """The op -> torch lists of tests and benchmarks derive from the aten column: none is
    kept by hand (a hand list silently skips a new op), and the derived ones hold every
    unary op with an ATen name."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1]
    names = "|".join(sorted(OPS, key=len, reverse=True))
    # "silu": F.silu / "silu": (torch.nn.functional.silu, cl.silu) / (cl.exp, torch.exp)
    hand = re.compile(rf'"({names})":\s*\(?\s*(?:cl\.\w+,\s*)?(?:torch\.nn\.functional|F|torch)\.\1\b')
    found = []
    for folder in ("tests", "benchmarks"):
        for p in sorted((root / folder).glob("*.py")):
            if p.name == "test_op_table.py":  # (its own examples)
                continue
            for m in hand.finditer(p.read_text()):
                found.append(f"{p.name}: {m.group(0)}")
    assert not found, "hand-kept op -> torch maps (derive them from castlab.torch._aten):\n" + \
        "\n".join(found)
    from castlab.torch._aten import torch_pairs

    unary = {o.name for o in OPS.values() if o.aten and o.arity == 1}
    assert set(torch_pairs("unary_float", "unary_signed")) == unary


def _gpu_only_choice(field: str, value: str, bit: str, op: str, other: str, notes: tuple,
                     bad: str) -> None:
    """The inductor preset sets Math.<field> to `value`, whose variant bit reaches `op` on
    the GPU only (not `other`, not the other presets), the trace says which (`notes`: GPU,
    CPU), and an unknown choice (`bad`) is refused."""
    from castlab import _optable

    m = cl.Math.preset("inductor")
    assert getattr(m, field) == value and getattr(cl.Math(), field) == "ieee"
    b = _optable.BITS[bit]
    assert m.variant_bits(op, False, True) & b
    assert not m.variant_bits(op, False, False) & b
    assert not m.variant_bits(other, False, True) & b
    for name in ("torch_eager", "inductor_cpu", "nvfuser", "portable"):
        assert not cl.Math.preset(name).variant_bits(op, False, True) & b, name
    assert (m.describe_op(op, True), m.describe_op(op, False)) == notes
    with pytest.raises(ValueError, match=field):
        cl.Math(**{field: bad})


def test_inductor_rsqrt_is_tritons_approximation_on_the_gpu_only():
    """Math.rsqrt: Inductor's rsqrt is Triton's libdevice.rsqrt (rsqrt.approx.ftz.f32 in its
    RMSNorm kernel's PTX), so the inductor preset sets "approx_ftz"; the bit reaches the
    rsqrt op on the GPU only (the CPU's Inductor is inductor_cpu: 1 / sqrt), fp64 too (the
    device's rsqrt)."""
    _gpu_only_choice("rsqrt", "approx_ftz", "rsqrt_approx_ftz", "rsqrt", "sqrt",
                     ("rsqrt=approx.ftz", "rsqrt=ieee (approx is GPU-only)"), "fast")
    from castlab import _optable

    bit = _optable.BITS["rsqrt_approx_ftz"]
    assert cl.Math.preset("inductor").variant_bits("rsqrt", True, True) & bit


def test_inductor_neg_is_tritons_unary_minus_on_the_gpu_only():
    """Math.neg: Inductor writes neg as Triton's unary minus, which is 0 - x (sub.f32 from 0
    in the PTX of its RoPE kernel), so -(+0) is +0; the inductor preset sets "zero_minus",
    and the bit reaches neg on the GPU only (Inductor's C++ flips the sign)."""
    _gpu_only_choice("neg", "zero_minus", "neg_zero_minus", "neg", "abs",
                     ("neg=0-x", "neg=-x (0-x is GPU-only)"), "flip")
