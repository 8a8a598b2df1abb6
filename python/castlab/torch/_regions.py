"""The SwiGLU/GeGLU, RoPE, RMSNorm, attention and matmul instances of a captured model,
recognised by the dataflow of its ATen graph, and the library kernels a run puts in their
place (``CapturedModel.run(..., kernels={kind: preset})``).

Recognition reads the graph, never module class names, so a model written in another
style is found when it computes the same thing. The forms are Hugging Face's (Llama,
Qwen2, Gemma and the models copied from them), as ``torch.export`` emits them:

* ``swiglu``: ``mul(silu(gate), up)``; ``geglu``: ``mul(gelu(gate, approximate="tanh"),
  up)`` (either operand order). Kernel inputs ``(gate, up)``.
* ``rope``: ``add(mul(x, cos), mul(cat([-x[..., h:], x[..., :h]]), sin))`` (rotate_half),
  one instance per ``apply_rotary_pos_emb`` call: the rotations of q and k that share one
  cos/sin in one module (one call each). Partial rotary (``x = q[..., :R]`` rotated and
  ``cat([.., q[..., R:]])`` passed through) is one call on the whole q. Kernel inputs
  ``(x, cos, sin)`` with cos/sin as the model hands them to the multiply.
* ``rms_norm``: ``xf * rsqrt(mean(xf ** 2, -1, keepdim) + eps)`` with ``xf`` = ``x`` or
  ``x.to(float32)``, then casts and one multiply by the weight (``w``, or Gemma's
  ``1 + w.float()``), in the order the model writes. Kernel inputs ``(x, weight)``; the
  model's ``eps`` and ``offset`` (1.0 for Gemma's ``1 + w``, else 0) are parameters: the
  kernel gets ``eps=`` by keyword, and Gemma's form takes ``rms_norm_gemma`` presets.
* ``attention``: every ``scaled_dot_product_attention`` call; ``matmul``: every
  ``linear``/``matmul``/``mm``/``bmm``/``addmm``/``baddbmm`` (both run by PyTorch).

A kernel replaces a pattern only where nothing outside it reads the pattern's
intermediate values. Its inputs are the storage-dtype tensors that reach the pattern
and its outputs take the pattern's outputs' places in storage dtype: a kernel boundary,
as when a library's kernel replaces the module. The castlab region the pattern sat in is
split there (the values it hands the kernel become region outputs); a run without
``kernels`` uses the capture's own segments, unchanged.

>>> import torch, castlab.torch as ct
>>> g, u = torch.randn(4, 8).bfloat16(), torch.randn(4, 8).bfloat16()
>>> m = ct.capture(lambda g, u: torch.nn.functional.silu(g) * u, g, u)
>>> [(r.kind, r.nodes) for r in m.regions()]
[('swiglu', ('silu', 'mul'))]
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any

import torch

from .._jit import JitFunction
from ..presets import OpPreset, library
from ._partition import _SKIP, Segment, _arg_nodes, _where, module_path, partition

__all__ = ["KINDS", "PRESET_OPS", "Call", "Region", "Regions", "find", "kernel_segments"]

#: Every kind of recognised instance, in display order.
KINDS = ("swiglu", "geglu", "rope", "rms_norm", "attention", "matmul")
#: The kinds a kernel-library preset can replace, and the preset op each takes.
PRESET_OPS = {"swiglu": "swiglu", "geglu": "geglu", "rope": "rope", "rms_norm": "rms_norm"}
#: The positional inputs each replaceable kind hands its preset (rms_norm's eps goes by
#: keyword; Gemma's ``1 + w`` form takes the ``rms_norm_gemma`` op instead).
KERNEL_INPUTS = {"swiglu": ("gate", "up"), "geglu": ("gate", "up"),
                 "rope": ("x", "cos", "sin"), "rms_norm": ("x", "weight")}

_MATMULS = ("aten.linear.default", "aten.matmul.default", "aten.mm.default",
            "aten.bmm.default", "aten.addmm.default", "aten.baddbmm.default")
_SDPA = "aten.scaled_dot_product_attention.default"
_CASTS = ("aten.to.dtype", "aten._to_copy.default", "aten.type_as.default",
          "aten.to.dtype_layout", "aten.to.device", "aten.to.other")
_MUL, _ADD = "aten.mul.Tensor", "aten.add.Tensor"


@dataclasses.dataclass(frozen=True)
class Call:
    """One kernel call of a region: the FX nodes whose values it reads (in the preset's
    argument order) and the ones its outputs replace."""

    inputs: tuple
    outputs: tuple


@dataclasses.dataclass(frozen=True)
class Region:
    """One recognised instance: its ``kind`` (see :data:`KINDS`), the ``module`` path
    (``model.layers.0.mlp``) and model ``source`` (``modeling_llama.py:164``) it comes
    from, the FX ``nodes`` it covers, the ``inputs`` a kernel reads and the ``outputs`` it
    gives (FX node names), its ``params`` (rms_norm: ``eps``, ``offset``; attention: the
    SDPA call's keyword arguments) and its kernel ``calls`` (rope: one per rotated
    tensor; every other kind: one)."""

    kind: str
    module: str
    source: str
    nodes: tuple
    inputs: tuple
    outputs: tuple
    params: dict = dataclasses.field(default_factory=dict, hash=False)
    calls: tuple = ()

    def __str__(self) -> str:
        p = "".join(f" {k}={v!r}" for k, v in self.params.items())
        return (f"{self.kind:9} {self.module or '<top>'} ({self.source or '?'}): "
                f"{', '.join(self.inputs)} -> {', '.join(self.outputs)}"
                f" [{len(self.nodes)} nodes]{p}")


class Regions(tuple):
    """The recognised instances of a captured model, in graph order (a tuple of
    :class:`Region`); ``kinds`` counts them by kind, ``inert(kernels)`` lists the kinds of
    a ``kernels`` choice that have no instance.

    >>> import torch, castlab.torch as ct
    >>> g = torch.ones(2, 4, dtype=torch.bfloat16)
    >>> rs = ct.capture(lambda g, u: torch.nn.functional.silu(g) * u, g, g).regions()
    >>> rs.kinds, rs.inert({"swiglu": "liger", "rope": "liger"})
    ({'swiglu': 1}, ['rope'])
    """

    @property
    def kinds(self) -> dict:
        """{kind: number of instances}, in :data:`KINDS` order."""
        return {k: n for k in KINDS if (n := sum(r.kind == k for r in self))}

    def of(self, kind: str) -> list:
        """The instances of one kind."""
        return [r for r in self if r.kind == kind]

    def inert(self, kernels: dict) -> list:
        """The kinds `kernels` chooses a kernel for (value not None) that this model has
        no instance of: choices that would change nothing."""
        have = self.kinds
        return [k for k, v in kernels.items() if v is not None and k not in have]

    def __str__(self) -> str:
        return "\n".join(str(r) for r in self)


# ---------------------------------------------------------------- graph helpers

def _is(n: Any, *targets: str) -> bool:
    return isinstance(n, torch.fx.Node) and n.op == "call_function" and str(n.target) in targets


def _val(n: Any) -> Any:
    return n.meta.get("val") if isinstance(n, torch.fx.Node) else None


def _ndim(n: Any) -> int:
    v = _val(n)
    return v.dim() if isinstance(v, torch.Tensor) else -1


def _uncast(n: Any) -> tuple:
    """(the value before any dtype casts, the cast nodes passed on the way)."""
    casts = []
    while _is(n, *_CASTS) and isinstance(n.args[0], torch.fx.Node):
        casts.append(n)
        n = n.args[0]
    return n, casts


def _users(n) -> list:
    """The nodes that read `n`, less torch.export's metadata assertions."""
    return [u for u in n.users if str(u.target) not in _SKIP]


def _operands(n: Any) -> tuple:
    """The two operands of a binary op as both orders."""
    a, b = n.args[0], n.args[1]
    return ((a, b), (b, a))


def _closed(nodes: list, outputs: list) -> bool:
    """Nothing outside `nodes` reads one of its values but `outputs`."""
    names = {n.name for n in nodes}
    outs = {n.name for n in outputs}
    return all(n.name in outs or all(u.name in names for u in _users(n)) for n in nodes)


_HUB = f"{os.sep}kernels{os.sep}"  # the `kernels` package's hub wrapper of HF functions


def _source(node) -> str:
    """``file.py:LINE`` of the model code behind `node`: as the trace shows it, past the
    frame of a function wrapper such as Hugging Face's ``use_kernel_func_from_hub``."""
    st = node.meta.get("stack_trace") or ""
    lines = [s.strip() for s in st.splitlines()]
    frames = [s for s in lines if s.startswith("File \"")]
    kept = [s for s in frames if _HUB not in s.split("\"")[1]]
    if kept and len(kept) < len(frames):
        try:
            f, ln = kept[-1].split("\"")[1], int(kept[-1].split(", line ")[1].split(",")[0])
            return f"{os.path.basename(f)}:{ln}"
        except (IndexError, ValueError):
            pass
    w = _where(node)
    return f"{os.path.basename(w[0])}:{w[1]}" if w else ""


def _region(kind: str, anchor, nodes: list, calls: list, params: dict | None = None) -> Region:
    order = {id(n): i for i, n in enumerate(nodes)}
    ins: list = []
    for c in calls:
        ins += [x for x in c.inputs if x not in ins]
    return Region(kind, module_path(anchor), _source(anchor),
                  tuple(n.name for n in sorted(nodes, key=lambda n: order[id(n)])),
                  tuple(ins), tuple(o for c in calls for o in c.outputs), params or {},
                  tuple(calls))


# ---------------------------------------------------------------- the patterns

def _glu(mul) -> Region | None:
    """``act(gate) * up``: swiglu (silu) or geglu (tanh gelu)."""
    if not _is(mul, _MUL) or len(mul.args) < 2:
        return None
    for act, up in _operands(mul):
        if _is(act, "aten.silu.default"):
            kind = "swiglu"
        elif _is(act, "aten.gelu.default") and act.kwargs.get(
                "approximate", act.args[1] if len(act.args) > 1 else "none") == "tanh":
            kind = "geglu"
        else:
            continue
        gate = act.args[0]
        if (not isinstance(up, torch.fx.Node) or not isinstance(gate, torch.fx.Node)
                or not _same_layout(gate, up) or not _closed([act, mul], [mul])):
            continue
        return _region(kind, mul, [act, mul], [Call((gate.name, up.name), (mul.name,))])
    return None


def _same_layout(a, b) -> bool:
    va, vb = _val(a), _val(b)
    return (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)
            and va.shape == vb.shape and va.dtype == vb.dtype)


def _slice_of(n, x) -> tuple | None:
    """(start, stop) of a last-dim slice of `x` with step 1, else None."""
    if not _is(n, "aten.slice.Tensor") or n.args[0] is not x:
        return None
    a = list(n.args) + [None] * (5 - len(n.args))
    dim = 0 if a[1] is None else a[1]
    nd, d = _ndim(x), _val(x).shape[-1]
    if dim not in (-1, nd - 1) or (a[4] not in (None, 1)):
        return None
    start = 0 if a[2] is None else a[2]
    stop = d if a[3] is None or a[3] >= d else a[3]
    return start, stop


def _rotate_half(rot, x) -> list | None:
    """The nodes of ``cat([-x[..., h:], x[..., :h]], -1)`` when `rot` is that of `x`."""
    if not _is(rot, "aten.cat.default") or len(rot.args[0]) != 2:
        return None
    dim = rot.args[1] if len(rot.args) > 1 else rot.kwargs.get("dim", 0)
    if dim not in (-1, _ndim(x) - 1):
        return None
    neg, lo = rot.args[0]
    if not _is(neg, "aten.neg.default"):
        return None
    hi = neg.args[0]
    d = _val(x).shape[-1]
    if d % 2 or _slice_of(lo, x) != (0, d // 2) or _slice_of(hi, x) != (d // 2, d):
        return None
    return [rot, neg, hi, lo]


def _rope_call(add) -> tuple | None:
    """(x, cos, sin, nodes, output) of ``x*cos + rotate_half(x)*sin`` ending at `add`."""
    if not _is(add, _ADD) or len(add.args) < 2 or add.kwargs.get("alpha", 1) != 1:
        return None
    for xc, rs in _operands(add):
        if not (_is(xc, _MUL) and _is(rs, _MUL)):
            continue
        for x, c in _operands(xc):
            for rot, s in _operands(rs):
                if not isinstance(x, torch.fx.Node) or not isinstance(c, torch.fx.Node):
                    continue
                inner = _rotate_half(rot, x)
                vc, vs = _val(c), _val(s)
                if (inner is None or not isinstance(vs, torch.Tensor)
                        or vc.shape[-1] != _val(x).shape[-1] or vs.shape[-1] != vc.shape[-1]):
                    continue
                nodes = [xc, rs, *inner, add]
                if _closed(nodes, [add]):
                    return _partial(x, c, s, nodes, add)
    return None


def _partial(x, c, s, nodes: list, add) -> tuple:
    """Partial rotary: ``x = q[..., :R]`` rotated and ``cat([out, q[..., R:]], -1)``
    becomes one call on q (the presets pass dims past cos's width through)."""
    users = _users(add)
    if (_is(x, "aten.slice.Tensor") and len(users) == 1 and _is(users[0], "aten.cat.default")
            and len(users[0].args[0]) == 2 and users[0].args[0][0] is add):
        q, cat = x.args[0], users[0]
        rd = _val(x).shape[-1]
        rest = cat.args[0][1]
        dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
        if (isinstance(q, torch.fx.Node) and _slice_of(x, q) == (0, rd)
                and _slice_of(rest, q) == (rd, _val(q).shape[-1]) and dim in (-1, _ndim(q) - 1)):
            wide = nodes + [x, rest, cat]
            if _closed(wide, [cat]):
                return q, c, s, wide, cat
    return x, c, s, nodes, add


def _rms_norm(r) -> Region | None:
    """``h = xf * rsqrt(mean(xf**2, -1, keepdim) + eps)``, then casts and one weight
    multiply in the norm's own module."""
    if not _is(r, "aten.rsqrt.default") or len(_users(r)) != 1:
        return None
    a = r.args[0]
    if not _is(a, _ADD):
        return None
    mean, eps = next(((m, e) for m, e in _operands(a)
                      if _is(m, "aten.mean.dim") and isinstance(e, (int, float))), (None, 0))
    if mean is None or not _last_dim_keepdim(mean):
        return None
    p = mean.args[0]
    if _is(p, "aten.pow.Tensor_Scalar") and p.args[1] == 2:
        xf = p.args[0]
    elif _is(p, _MUL) and p.args[0] is p.args[1]:
        xf = p.args[0]
    else:
        return None
    (h,) = _users(r)
    if not _is(h, _MUL) or {id(v) for v in h.args[:2]} != {id(xf), id(r)}:
        return None
    out, w, offset, more = _weighted(h, module_path(r))
    if w is None:
        return None
    x, casts = _uncast(xf)
    # the input: before the casts, or at a cast that changes nothing and that others read
    # (an fp32 model's residual reads x.to(float32), which is x)
    for k in range(len(casts), -1, -1):
        nodes = [*casts[:k], p, mean, a, r, h, *more]
        x_k = casts[k] if k < len(casts) else x
        if (k == len(casts) or _val(x_k).dtype == _val(x).dtype) and _closed(nodes, [out]):
            break
    else:
        return None
    x = x_k
    return _region("rms_norm", out, nodes, [Call((x.name, w.name), (out.name,))],
                   {"eps": float(eps), "offset": float(offset)})


def _last_dim_keepdim(mean) -> bool:
    dims = mean.args[1] if len(mean.args) > 1 else None
    keep = mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim", False)
    return keep is True and list(dims or []) in ([-1], [_ndim(mean.args[0]) - 1])


def _weighted(h, module: str) -> tuple:
    """From the normalised `h`, the chain of casts and one weight multiply the norm's
    module applies: (output node, weight placeholder, offset, chain nodes); weight None
    when there is no such multiply."""
    cur, w, offset, chain = h, None, 0.0, []
    while len(_users(cur)) == 1:
        (u,) = _users(cur)
        if module_path(u) != module:
            break
        if _is(u, *_CASTS) and u.args[0] is cur:
            chain.append(u)
            cur = u
            continue
        if w is None and _is(u, _MUL):
            term = next((b for a, b in _operands(u) if a is cur), None)
            got = _weight_term(term)
            if got is not None:
                w, offset, nodes = got
                chain += [u, *nodes]
                cur = u
                continue
        break
    return cur, w, offset, chain


def _weight_term(t) -> tuple | None:
    """(weight placeholder, offset, nodes) of ``w``, ``w.to(...)`` or ``1 + w.float()``."""
    offset, nodes = 0.0, []
    if _is(t, _ADD):
        t2, k = next(((b, c) for b, c in _operands(t) if isinstance(c, (int, float))),
                     (None, 0))
        if t2 is None:
            return None
        nodes.append(t)
        t, offset = t2, float(k)
    w, casts = _uncast(t)
    if not isinstance(w, torch.fx.Node) or w.op != "placeholder":
        return None
    return w, offset, nodes + casts


def _ropes(nodes: list, taken: set) -> list:
    """rope instances: the rotations that share cos, sin and module, grouped."""
    groups: dict = {}
    for n in nodes:
        if n.name in taken:
            continue
        got = _rope_call(n)
        if got is None or any(m.name in taken for m in got[3]):
            continue
        x, c, s, covered, out = got
        key = (c.name, s.name, module_path(out))
        groups.setdefault(key, []).append((Call((x.name, c.name, s.name), (out.name,)),
                                           covered, out))
        taken.update(m.name for m in covered)
    out = []
    for calls in groups.values():
        covered = [m for _, cov, _ in calls for m in cov]
        out.append(_region("rope", calls[0][2], covered, [c for c, _, _ in calls]))
    return out


def find(nodes: list) -> Regions:
    """The recognised instances among a captured graph's `nodes`, in graph order."""
    found: list = []
    taken: set = set()
    ops = [n for n in nodes if n.op == "call_function"]
    for match in (_rms_norm, _glu):
        for n in ops:
            if n.name in taken:
                continue
            r = match(n)
            if r is not None and not taken.intersection(r.nodes):
                found.append(r)
                taken.update(r.nodes)
    found += _ropes(ops, taken)
    for n in ops:
        t = str(n.target)
        if t == _SDPA or t in _MATMULS:
            params = {k: v for k, v in n.kwargs.items() if not isinstance(v, torch.fx.Node)}
            found.append(_region("attention" if t == _SDPA else "matmul", n, [n],
                                 [Call(tuple(a.name for a in _arg_nodes(n)), (n.name,))],
                                 params if t == _SDPA else None))
    pos = {n.name: i for i, n in enumerate(nodes)}
    return Regions(sorted(found, key=lambda r: min(pos[m] for m in r.nodes)))


# ---------------------------------------------------------------- kernels

def _known() -> str:
    return ", ".join(f"{k} ({PRESET_OPS[k]} presets)" for k in PRESET_OPS)


def _preset_op(kind: str, regions: Regions, name: str) -> str:
    """The preset op a kind's instances take: rms_norm's Gemma form (``1 + w``, offset 1)
    takes ``rms_norm_gemma`` presets."""
    op = PRESET_OPS[kind]
    if kind != "rms_norm":
        return op
    offsets = sorted({r.params["offset"] for r in regions.of("rms_norm")})
    if len(offsets) > 1:
        raise ValueError(f"{name}: its RMSNorms multiply by weight + offset with offsets "
                         f"{offsets}; one rms_norm choice cannot cover both forms")
    off = offsets[0] if offsets else 0.0
    if off not in (0.0, 1.0):
        raise ValueError(f"{name}: its RMSNorm multiplies by (weight + {off:g}); presets "
                         "cover weight (rms_norm) and 1 + weight (rms_norm_gemma)")
    return "rms_norm_gemma" if off == 1.0 else op


def resolve(kernels: dict, regions: Regions, name: str) -> dict:
    """{kind: OpPreset} from a ``kernels`` choice, checked: every kind known and present
    in the model, every preset of the kind's op. A None value leaves that kind as
    captured."""
    if not isinstance(kernels, dict):
        raise TypeError(f"{name}: kernels must be a dict {{kind: preset or library name}}, "
                        f"not {type(kernels).__name__}")
    out = {}
    for kind, p in kernels.items():
        if kind not in PRESET_OPS:
            what = ("runs in PyTorch; choosing its kernel is not supported yet"
                    if kind in KINDS else "is not a region kind")
            raise ValueError(f"{name}: kernels[{kind!r}]: {kind!r} {what}. Kinds that "
                             f"take a kernel-library preset: {_known()}")
        if p is None:
            continue
        op = _preset_op(kind, regions, name)
        if isinstance(p, str):
            p = library(p)[op]  # an unknown library or op lists the known ones
        if not isinstance(p, OpPreset):
            raise TypeError(f"{name}: kernels[{kind!r}] must be an OpPreset "
                            f"(cl.library(...)[{op!r}]), a library name or None, not "
                            f"{type(p).__name__}")
        if p.op != op:
            raise ValueError(f"{name}: kernels[{kind!r}] is {p.library}'s {p.op} preset; "
                             f"{kind} regions take a {op} preset. Kinds and their presets: "
                             f"{_known()}")
        want = KERNEL_INPUTS[kind]
        if p.inputs and len(p.inputs) < len(want):
            raise ValueError(f"{name}: {p.library}'s {op} preset takes {p.inputs}; a "
                             f"captured {kind} hands a kernel {want}")
        out[kind] = p
    inert = regions.inert(out)
    if inert:
        raise ValueError(
            f"{name}: kernels for {', '.join(inert)}, which this model has no instance of "
            f"(a choice that does not apply is inert; its regions: "
            f"{', '.join(f'{k} x{n}' for k, n in regions.kinds.items()) or 'none'}). "
            "Leave those kinds out (captured.regions().inert(kernels) lists them)")
    return out


def run_segments(captured: Any, kernels: dict | None, policy: Any) -> list | None:
    """The segments a ``captured.run(..., kernels=)`` runs (the choice checked first),
    made once per choice; None: the capture's own (no kernel chosen, or ``fp64``)."""
    if kernels is None:
        return None
    chosen = resolve(kernels, captured.regions(), captured.name)
    if not chosen or policy.name == "fp64":
        return None
    key = tuple(sorted((k, id(p)) for k, p in chosen.items()))
    plans = captured._kernel_plans
    if key not in plans:  # (the presets are kept with it, so their ids stay theirs)
        plans[key] = (kernel_segments(captured.nodes, captured.regions(), chosen), chosen)
    return plans[key][0]


def _kernel(p: OpPreset, kind: str, params: dict) -> JitFunction:
    """The preset's function as a jit under its own policy and math, returning a tuple;
    rms_norm gets the model's eps by keyword."""
    kw: dict = {}
    if kind == "rms_norm":   # (the Gemma form is its own op, rms_norm_gemma)
        if "eps" not in inspect.signature(p.fn).parameters:
            raise ValueError(f"{p.library}'s {p.op} preset takes no 'eps' argument, but the "
                             f"model's RMSNorm uses eps={params['eps']}")
        kw["eps"] = params["eps"]
    fn = p.fn

    def kernel(*xs):
        return (fn(*xs, **kw),)

    kernel.__name__ = kernel.__qualname__ = f"{p.library}_{p.op}"
    kernel._castlab_unguarded = True  # its closure is fixed here
    return JitFunction(kernel, policy=p.policy, math=p.math)


def kernel_segments(nodes: list, regions: Regions, chosen: dict) -> list:
    """The captured graph partitioned with every instance of a chosen kind cut out and a
    "kernel" segment (the preset's jit) emitted per call where the call's last node was."""
    by_name = {n.name: n for n in nodes}
    pos = {n.name: i for i, n in enumerate(nodes)}
    cut: dict = {}
    jits: dict = {}
    for r in regions:
        p = chosen.get(r.kind)
        if p is None:
            continue
        if hasattr(p, "for_region"):  # a preset that picks its kernel per instance
            p = p.for_region(r, by_name)  # (castlab.torch._stacks.SitePreset)
        key = (r.kind, id(p), tuple(sorted(r.params.items())))
        if key not in jits:
            jits[key] = _kernel(p, r.kind, r.params)
        for name in r.nodes:
            cut.setdefault(name, None)
        for c, covered in _call_nodes(r, by_name, pos):
            seg = Segment("kernel", [by_name[m] for m in covered])
            seg.inputs = [by_name[m] for m in c.inputs]
            seg.outputs = [by_name[m] for m in c.outputs]
            seg.jit = jits[key]
            cut[max(covered, key=pos.__getitem__)] = seg
    return partition(nodes, kernels=cut)


def _call_nodes(r: Region, by_name: dict, pos: dict) -> list:
    """(call, the nodes it covers) of each call: a rope region's nodes split by the
    call whose output they reach."""
    if len(r.calls) == 1:
        return [(r.calls[0], list(r.nodes))]
    mine = set(r.nodes)
    out = []
    for c in r.calls:
        seen: set = set()
        todo = list(c.outputs)
        while todo:
            m = todo.pop()
            if m in seen or m not in mine:
                continue
            seen.add(m)
            todo += [a.name for a in _arg_nodes(by_name[m])]
        out.append((c, sorted(seen, key=pos.__getitem__)))
    return out
