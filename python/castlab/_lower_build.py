"""The program builder: one region's expression DAG as instructions, one register per
value, with a rounding step wherever the rounding placement (castlab._rounding) puts one:
after every op under ``eager``; only at the store under ``fused``; nowhere under ``fp64``.
"""

from __future__ import annotations

import math as _math

from ._dtype import _BY_CODE, as_dtype, dtype, float64, int64
from ._lower_views import Elem, Leaf, Reduced, Scalar, _dtype_code
from ._optable import BITS, F32, F64, I64, OPCODE, ROUND_MODES, instr
from ._torch_kernels import TorchKernelQuirks

K_ROUND = OPCODE["round"]
POW_DEVICE = BITS["pow_device"]
RSQRT_SCALAR16 = BITS["rsqrt_scalar16"]
TORCH_TAIL = BITS["torch_tail"]
_INT_MIN = -(1 << 63)
_INT_END = 1 << 63


def _int_scalar(v) -> bool:
    return isinstance(v, (bool, int))


def int_const(v, what: str) -> int:
    """A Python integer as an int64 constant; ValueError when it does not fit."""
    iv = int(v)
    if not _INT_MIN <= iv < _INT_END:
        raise ValueError(f"{what}: the Python integer {iv} does not fit in int64 "
                         f"(range [-2**63, 2**63 - 1])")
    return iv


def _narrow_int(v: int, to: dtype) -> int:
    """An int64 value as integer format `to` (int32 wraps, bool: v != 0), as to_i64."""
    if to.name == "bool":
        return int(v != 0)
    if to.name == "int32":
        return ((v + (1 << 31)) % (1 << 32)) - (1 << 31)
    return v


class ProgramBuilder(TorchKernelQuirks):
    """Turns one region's expression DAG into instructions (one register per value);
    PyTorch's kernels' own formulas are in TorchKernelQuirks (castlab._torch_kernels)."""

    def __init__(self, low):  # a castlab._lower.Lowering
        self.low = low
        self.code: list = []
        self.nregs = 0
        self.leaves: list = []
        self._leaf_regs: dict = {}
        self._memo: dict = {}
        self._conv: dict = {}
        self._uses: dict = {}
        self._round_of: dict = {}   # register of an inserted rounding -> its Decision
        self._elided: dict = {}     # rounding register -> the value its output store rounds

    def elide_final_round(self, reg: int, out: Leaf) -> int:
        """A deterministic rounding to the output's own dtype right before the store is
        done by the store itself: skip the separate step (same bits, less work). A value
        stored to several outputs (a function returning it twice) is elided once and every
        store rounds it."""
        if reg in self._elided:
            return self._elided[reg]
        ins = next((i for i in self.code if i.dst == reg), None)
        if (ins is None or ins.op != K_ROUND or ins.mode == ROUND_MODES["stochastic"]
                or ins.dtype != _dtype_code(out.t)):
            return reg
        if self.low.policy.rounding_code != ins.mode:
            return reg
        if any(reg in (i.a, i.b, i.c) for i in self.code):
            return reg
        self.code.remove(ins)
        d = self._round_of.get(reg)
        if d is not None:
            d.round_elided = True
        self._elided[reg] = ins.a
        return ins.a

    def new(self) -> int:
        self.nregs += 1
        return self.nregs - 1

    def ins(self, op: str, rt: int, dst: int, a=-1, b=-1, c=-1, var=0, dtype=0, mode=0,
            sat=0, aux=0, imm=0.0, iimm=0):
        self.code.append(instr(op, rt, dst, a, b, c, var=var, dtype=dtype, mode=mode,
                               saturate=sat, aux=aux, imm=imm, iimm=iimm))

    def value(self, e) -> int:
        self._count_uses(e)
        return self._value(e)[0]

    def _count_uses(self, e):
        if isinstance(e, Elem):
            k = id(e)
            self._uses[k] = self._uses.get(k, 0) + 1
            if self._uses[k] == 1:
                for a in e.args:
                    self._count_uses(a)

    def _value(self, e) -> tuple[int, int]:
        """(register, register type) holding e's value."""
        k = id(e)
        r = self._memo.get(k)
        if r is not None:
            return r
        if isinstance(e, Leaf):
            t = e.t
            key = (e.src, t._offset, t.shape, t._strides)
            r = self._leaf_regs.get(key)
            if r is None:
                code = _dtype_code(t)
                if not _BY_CODE[code].is_floating_point:
                    rt = I64  # integers and bools: exact
                else:
                    rt = F64 if (self.low.policy.compute is float64) or (
                        self.low.policy.compute is None and code == float64.code) else F32
                reg = self.new()
                self.ins("load", rt, reg, dtype=code, aux=len(self.leaves))
                self.leaves.append(e)
                r = (reg, rt)
                self._leaf_regs[key] = r
        elif isinstance(e, Scalar):
            r = None  # constants are materialised by their consumer in its type
        elif isinstance(e, Reduced):
            r = self._reduced(e)
        else:
            r = self._elem(e)
        self._memo[k] = r
        return r

    @staticmethod
    def _dtype_of(e) -> dtype:
        return _BY_CODE[_dtype_code(e.t)] if isinstance(e, Leaf) else e.node.dtype

    def operand(self, e, rt: int, to: dtype | None = None) -> int:
        """A register of type `rt` holding e's value. For an int64 register, `to` names
        the integer format the value is converted to (default: e's own dtype)."""
        rt = int(rt)
        if isinstance(e, Scalar):
            if rt == I64:
                v = e.value
                if not _int_scalar(v) and not float(v).is_integer():
                    raise ValueError(f"the Python number {v!r} is not an integer")
                iv = int_const(v, "constant")
                if to is not None:
                    iv = _narrow_int(iv, to)
                key = ("iconst", iv)
                r = self._conv.get(key)
                if r is None:
                    r = self.new()
                    self.ins("const", I64, r, iimm=iv)
                    self._conv[key] = r
                return r
            try:
                fv = float(e.value)
            except OverflowError:
                raise ValueError(f"the Python integer {e.value} is too large for a "
                                 "floating-point computation") from None
            key = ("const", fv, _math.copysign(1.0, fv), rt)  # (-0.0 is not 0.0's register)
            r = self._conv.get(key)
            if r is None:
                r = self.new()
                self.ins("const", rt, r, imm=fv)
                self._conv[key] = r
            return r
        reg, have = self._value(e)
        have = int(have)
        src = self._dtype_of(e)
        if rt == I64:
            if to is None:
                to = src if not src.is_floating_point else int64
            narrow = (have != I64 or (to.name == "int32" and src.name == "int64")
                      or (to.name == "bool" and src.name != "bool"))
            if not narrow:
                return reg
            key = (reg, rt, to.code)
        else:
            if have == rt:
                return reg
            key = (reg, rt)
        r = self._conv.get(key)
        if r is None:
            r = self.new()
            if rt == I64:
                self.ins("to_i64", I64, r, a=reg, dtype=to.code)
            else:
                self.ins("to_f64" if rt == F64 else "to_f32", rt, r, a=reg)
            self._conv[key] = r
        return r

    def _elem(self, e: Elem) -> tuple[int, int]:
        low = self.low
        node = e.node
        op = node.op
        f64 = low.vt(node)  # the register type (F32, F64 or I64)
        args = e.args
        d = low.record.decide(node, f64)
        if op == "astype":
            src = self.operand(args[0], f64, to=node.dtype if f64 == I64 else None)
            out = src
        elif f64 == I64:  # comparisons of integers, where: exact in int64
            regs = [self.operand(a, I64) for a in args]
            out = self.new()
            self.ins(op, I64, out, *(regs + [-1, -1, -1])[:3])
        else:
            out = self._float_op(e, f64, d)
        tgt = low.round_target(node)  # castlab._rounding's placement
        if tgt is not None:
            r = self.new()
            self.ins("round", f64, r, a=out, dtype=tgt.code, mode=low.policy.rounding_code,
                     sat=int(low.policy.saturate), aux=node.index + 1)
            out = r
            d.round_to, d.round_mode = tgt, low.policy.rounding
            self._round_of[r] = d
        return (out, f64)

    def _float_op(self, e: Elem, f64: int, d) -> int:
        """The register of a floating-point op's value (before its rounding): an fma
        contraction, PyTorch's kernel's own formula (TorchKernelQuirks), or the op."""
        low = self.low
        node = e.node
        op = node.op
        dt = node.dtype.name if node.dtype is not None else None
        # a step inside another PyTorch kernel (layer_norm, softmax, a backward kernel)
        # is not PyTorch's own kernel for the op: none of that kernel's details apply
        kern = node.attrs.get("kernel") or False  # the kernel's name
        args = self._scalar_args(e, kern, d)
        if low.torch_cpu_softmax(node):
            dt = None  # the kernel's Vectorized exp/log: SLEEF's, whatever the dtype
        var = low.math.variant_bits(op, f64 == F64, low.cuda, dt, kern)
        if var != d.variant or not d.description:
            d.variant = var
            d.description = low.math.describe_op(op, low.cuda, dt, kern) or ""
        gelu_x = low.onednn_gelu_backward(e)
        contracted = (self._try_fma(e, f64) if gelu_x is None and op in ("add", "sub") and (
            low.math.fma or low.kernel_contracts(node)) else None)
        if contracted is not None:
            out, mul = contracted
            d.fma_with = mul
            low.record.decide(mul, f64).fma_into = node
            return out
        quirk = self._kernel_quirk(e, f64, d, gelu_x, kern, var)
        if quirk is not None:
            return quirk
        if op == "pow" and var & POW_DEVICE:
            var, args = self._pow_device(e, var, d)
        regs = [self.operand(a, f64) for a in args]
        out = self.new()
        # rsqrt's scalar-loop rounding and pow's scalar lambda (double pow for a
        # float tensor and a Python exponent) need the storage dtype; the tail
        # width of PyTorch's vectorised loop rides in aux
        code = node.dtype.code if var & (RSQRT_SCALAR16 | TORCH_TAIL) else 0
        tail = low.math.torch_cpu_tail(op, dt, low.cuda, kern) if var & TORCH_TAIL else 0
        imm = (float(args[1].value) if op == "pow" and var & TORCH_TAIL
               and isinstance(args[1], Scalar) else 0.0)  # the exponent, in double
        iimm = 0
        cols = low.softmax_columns(e) if op in ("exp", "div") else None
        if cols is not None:  # the scalar columns of _vec_softmax & co.
            var |= TORCH_TAIL
            tail, iimm, imm = cols
            code = as_dtype(node.attrs["storage_dtype"]).code
            d.variant = var
        self.ins(op, f64, out, *(regs + [-1, -1, -1])[:3], var=var, dtype=code,
                 aux=tail, imm=imm, iimm=iimm)
        return out

    def _reduced(self, e: Reduced) -> tuple[int, int]:
        """A reduction's row result: loaded exactly, then rounded as the policy says."""
        low = self.low
        reg, rt = self._value(e.leaf)
        node = e.node
        d = low.record.decide(node, rt)
        tgt = low.round_target(node)
        if tgt is not None:
            r = self.new()
            self.ins("round", rt, r, a=reg, dtype=tgt.code, mode=low.policy.rounding_code,
                     sat=int(low.policy.saturate), aux=node.index + 1)
            d.round_to, d.round_mode = tgt, low.policy.rounding
            self._round_of[r] = d
            reg = r
        return (reg, rt)

    def _negate_one(self, rt: int, a: int, c: int, negate: str) -> tuple[int, int]:
        """A contracted subtraction as an addition: x - c negates the addend c
        (`negate` "c"), c - x negates x's first factor a ("a"). Negation is exact."""
        n = self.new()
        self.ins("neg", rt, n, a=c if negate == "c" else a)
        return (a, n) if negate == "c" else (n, c)

    def _try_div_add(self, e: Elem, f64: bool):
        """a/b + c -> div_add(a, b, c): an approximate division contracted into the add
        that uses its quotient once (Lowering.contracts_division). a/b - c adds -c;
        c - a/b divides -a (negation is exact)."""
        low = self.low

        def is_div(a):
            return (isinstance(a, Elem) and id(a) not in self._memo
                    and low.contracts_division(a.node, f64, self._uses.get(id(a), 0)))

        x, y = e.args
        if is_div(x):
            div, other, negate = x, y, "c"
        elif is_div(y):
            div, other, negate = y, x, "a"
        else:
            return None
        ea, eb = div.args
        a, b, c = (self.operand(v, f64) for v in (ea, eb, other))
        if e.node.op == "sub":
            a, c = self._negate_one(f64, a, c, negate)
        out = self.new()
        var = low.math.variant_bits("div_add", f64 == F64, low.cuda, None, False)
        self.ins("div_add", f64, out, a, b, c, var=var)
        return out, div.node

    def _try_fma(self, e: Elem, f64: bool):
        """a*b + c -> fma(a, b, c) when the product is not rounded and used once."""
        low = self.low

        def is_mul(a):
            return (isinstance(a, Elem) and id(a) not in self._memo
                    and low.contracts(a.node, f64, self._uses.get(id(a), 0), e.node))

        x, y = e.args
        op = e.node.op
        k = low._kernel(e.node)
        both = is_mul(x) and is_mul(y)
        # which product an add of two takes into its fma: a PyTorch kernel's compiler's
        # choice, or the one read from a compiled Triton kernel (castlab.torch._inductor)
        right = both and ((k is not None and k.fused_product(low.cuda, e.node.dtype) == "right")
                          or e.node.attrs.get("fma_side") == "right")
        if is_mul(x) and not right:
            mul, (ea, eb), ec, negate = x, x.args, y, "c"
        elif is_mul(y):
            mul, (ea, eb), ec, negate = y, y.args, x, "a"
        else:
            return self._try_div_add(e, f64)
        if (both and k is not None and op == "add" and not low.cuda
                and k.fused_product(False, e.node.dtype, tail=True)
                != k.fused_product(False, e.node.dtype)):
            w = low.math.torch_cpu_tail("", e.node.dtype.name, False, e.node.attrs["kernel"])
            if w:  # the kernel's scalar tails fuse the other product: both, then a select
                body = self.operand(ea, f64), self.operand(eb, f64)
                other = x if mul is y else y
                tail = self.operand(other.args[0], f64), self.operand(other.args[1], f64)
                ob, ot, one, out = self.new(), self.new(), self.new(), self.new()
                self.ins("fma", f64, ob, *body, self.operand(ec, f64))
                self.ins("fma", f64, ot, *tail, self.operand(mul, f64))
                self.ins("const", f64, one, imm=1.0)
                self.ins("where", f64, out, one, ob, ot, var=TORCH_TAIL, aux=w)
                low.record.decide(e.node, f64).quirk = (
                    "fma of the other product in the kernel's scalar tails")
                return out, mul.node
        tgt = low.round_target(e.node)
        # a native 16-bit fma (fma.rn.bf16/.f16): the exact a*b + c rounded once. In fp64
        # the product of two fp32 values is exact and the sum rounds once; the rounding to
        # tgt follows (the caller's rounding of the result, a tgt value, changes nothing)
        native = (low.math.fma_rounding == "storage" and f64 == F32 and tgt is not None
                  and tgt.itemsize == 2 and tgt is e.node.dtype)
        rt = F64 if native else f64
        ma, mb, c = (self.operand(a, rt) for a in (ea, eb, ec))
        if op == "sub":
            ma, c = self._negate_one(rt, ma, c, negate)
        out = self.new()
        if not native:
            self.ins("fma", f64, out, ma, mb, c)
            return out, mul.node
        wide, r = self.new(), self.new()
        self.ins("fma", F64, wide, ma, mb, c)
        self.ins("round", F64, r, a=wide, dtype=tgt.code, mode=low.policy.rounding_code,
                 sat=int(low.policy.saturate), aux=e.node.index + 1)
        self.ins("to_f32", F32, out, a=r)
        low.record.decide(e.node, f64).quirk = (
            f"fma rounded once to {tgt.short} (a native {tgt.short} fma: Math.fma_rounding)")
        return out, mul.node


