"""Where torch.compile's Inductor rounds: read from the compiled program (issue 52).

Under Inductor's default settings (``emulate_precision_casts`` off) a generated kernel
computes bf16/fp16 values in fp32 and rounds only what it writes to memory:

* a value the scheduler keeps inside one kernel (a removed buffer, or one a fused kernel
  reads back from its own store) is never rounded;
* a value no buffer holds is recomputed in fp32 by every kernel that needs it (Inductor
  inlines pointwise values into their readers: cos/sin inside the RoPE kernel, a residual
  sum inside the next RMSNorm's kernel);
* an explicit down-cast inside a kernel is dropped (``to_dtype`` emits the compute type);
* a value stored in a bf16/fp16 buffer is rounded for every other kernel that loads it.

So which value is rounded for which reader is not a rule castlab can guess from the
model: :func:`read_placement` compiles the captured graph with Inductor, records each FX
node's lowered value and the scheduler's fused kernels (which buffers each writes, which
it loads from memory), and maps them back to the captured graph's nodes (the post-grad
nodes' ``from_node`` provenance). :func:`placed_segments` then runs castlab's regions so:
a region edge whose reader loads the value from a stored buffer rounds it (an ``astype``
marked as a store), and a region output that a later region's kernel recomputes reaches
that region in fp32 (an fp32 twin of the output, not rounded on the way).
"""

from __future__ import annotations

import dataclasses
import operator
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .. import _graph
from .. import ops as clops
from .._jit import JitFunction
from . import _aten
from ._partition import Segment, _arg_nodes, _subst, _where

__all__ = ["InductorPlacement", "read_placement", "placed_segments", "placement_for",
           "segments_for"]

_LOW = (torch.bfloat16, torch.float16)
_lock = threading.Lock()
TWIN = "@f32"  # suffix of a region output's fp32 twin in a run's values


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One kernel of the compiled program, in launch order: ``kind`` ("generated",
    "extern" or "nop"), the captured nodes whose values it computes (``computes``), the
    buffers it writes and the buffers it loads from memory."""

    index: int
    kind: str
    computes: tuple
    writes: tuple
    loads: tuple


@dataclasses.dataclass
class InductorPlacement:
    """What torch.compile's Inductor stores for one captured model, inputs and device.

    ``stored``: captured node name -> (buffer, dtype name, index of the kernel writing
    it) for the values a buffer holds; ``kernels``: the compiled program's kernels;
    ``rounded``: the (value, reader) pairs of captured nodes where the reader's kernel
    loads the value from a bf16/fp16 buffer (rounded); every other pair of the castlab
    regions reads it in fp32. ``torch``: the PyTorch version that compiled it."""

    device: str
    torch: str
    stored: dict
    kernels: list
    rounded: frozenset
    recomputed: dict  # captured name -> indices of the generated kernels computing it

    def reads_rounded(self, value: str, reader: str) -> bool:
        """Whether `reader`'s kernel loads `value` from a rounded (bf16/fp16) buffer."""
        return (value, reader) in self.rounded

    def describe(self, name: str) -> str:
        """Where Inductor keeps captured node `name`: its buffer, or the kernels that
        recompute it."""
        s = self.stored.get(name)
        if s is not None:
            return f"stored in {s[0]} ({s[1]}) by kernel {s[2]}"
        ks = self.recomputed.get(name)
        if ks:
            return "not stored: recomputed in fp32 by kernel(s) " + ", ".join(map(str, ks))
        return "not in the compiled program (a view, or folded away)"

    def __str__(self) -> str:
        n_gen = sum(k.kind == "generated" for k in self.kernels)
        return (f"Inductor placement ({self.device}, torch {self.torch}): "
                f"{len(self.kernels)} kernels ({n_gen} generated), {len(self.stored)} "
                f"values stored, {len(self.rounded)} region reads of a rounded buffer")


def _root(fx: torch.fx.Node) -> list:
    """The captured graph's node names a post-grad node comes from (``from_node``)."""
    out = []
    for ns in fx.meta.get("from_node") or ():
        while ns.from_node:
            ns = ns.from_node[0]
        out.append(ns.name)
    return out or [fx.name]


def _buffer(value: Any) -> Any:
    """The buffer holding a lowered value (through its views), or None (inlined)."""
    from torch._inductor import ir

    x, seen = value, 0
    while seen < 64:
        seen += 1
        if isinstance(x, (ir.TensorBox, ir.StorageBox, ir.BaseView)):
            x = x.data
            continue
        break
    return x if isinstance(x, ir.Buffer) and not isinstance(x, ir.InputBuffer) else None


def _dtype(buf: Any) -> torch.dtype | None:
    try:
        return buf.get_dtype()
    except (NotImplementedError, AttributeError):
        return None


def _compile_and_record(gm: torch.fx.GraphModule, places: list) -> tuple:
    """torch.compile `gm` on `places` with Inductor's caches off, recording each FX node's
    lowered value and the scheduler's final (fused) nodes and removed buffers."""
    from torch._inductor import config as iconfig
    from torch._inductor import graph as igraph
    from torch._inductor import scheduler as isched
    from torch._inductor.virtualized import V

    values: dict = {}
    sched: list = []
    run_node, codegen = igraph.GraphLowering.run_node, isched.Scheduler.codegen

    def rec_run_node(self, n):
        out = run_node(self, n)
        values[n] = out
        return out

    def rec_codegen(self):
        out = codegen(self)
        sched.append((list(self.nodes), set(V.graph.removed_buffers)))
        return out

    with _lock:
        igraph.GraphLowering.run_node = rec_run_node
        isched.Scheduler.codegen = rec_codegen
        try:
            torch._dynamo.reset()
            with iconfig.patch(force_disable_caches=True), torch.no_grad(), \
                    warnings.catch_warnings():
                # (caches off, so that the scheduler runs: PyTorch says profile-guided
                # recompilation is off too, which does not apply to a static graph)
                warnings.filterwarnings("ignore", message=".*force_disable_caches")
                torch.compile(gm, dynamic=False)(*places)
        finally:
            igraph.GraphLowering.run_node = run_node
            isched.Scheduler.codegen = codegen
            torch._dynamo.reset()
    if len(sched) != 1:
        raise RuntimeError(f"castlab.torch: torch.compile made {len(sched)} Inductor graphs of "
                           "the captured graph (expected one); its placement cannot be read")
    return values, sched[0][0], sched[0][1]


def read_placement(cm: Any, flat: list) -> InductorPlacement:
    """Compile captured model `cm` with torch.compile (Inductor, default settings) on the
    flat inputs `flat` and read where it stores and recomputes each captured value."""
    from torch._inductor import scheduler as isched

    places = [cm._consts[n.name] if n.name in cm._consts else v
              for n, v in zip([n for n in cm.nodes if n.op == "placeholder"],
                              _placeholder_values(cm, flat))]
    values, nodes, removed = _compile_and_record(cm.exported.graph_module, places)
    # the lowered value of each captured node: that of its last post-grad node
    last: dict = {}
    for fx, v in values.items():
        if fx.op != "call_function":
            continue
        for r in _root(fx):
            last[r] = v
    buf_of: dict = {}
    for name, v in last.items():
        b = _buffer(v)
        if b is not None:
            buf_of[name] = b
    kernels, writer, loads_of = [], {}, {}
    for k, sn in enumerate(nodes):
        kind = ("extern" if sn.is_extern() else
                "nop" if isinstance(sn, isched.NopKernelSchedulerNode) else "generated")
        writes = tuple(sorted(sn.get_buffer_names()))
        loads = tuple(sorted({d.name for d in sn.read_writes.reads} - set(writes)))
        computes: set = set()
        for s in sn.get_nodes():
            for o in (getattr(s.node, "origins", None) or ()):
                computes.update(_root(o))
        for b in writes:
            writer[b] = k
        kernels.append(Kernel(k, kind, tuple(sorted(computes)), writes, loads))
        loads_of[k] = set(loads)
    stored, recomputed = {}, {}
    for name, b in buf_of.items():
        bn = b.get_name()
        if bn in removed or bn not in writer:
            continue
        dt = _dtype(b)
        stored[name] = (bn, str(dt).replace("torch.", "") if dt else "?", writer[bn])
    for kern in kernels:
        if kern.kind == "generated":
            for c in kern.computes:
                if c not in stored or stored[c][2] != kern.index:
                    recomputed.setdefault(c, []).append(kern.index)
    # the pairs whose reader's kernel loads the value's rounded buffer
    by_name = {n.name: n for n in cm.nodes}
    rounded = set()
    for c in cm.nodes:
        if c.op != "call_function":
            continue
        ks = [k for k in kernels if k.kind == "generated" and c.name in k.computes]
        for d in _arg_nodes(c):
            b = base(d)
            s = stored.get(b.name)
            if s is None or b.name not in by_name:
                continue
            dt = _dtype(buf_of[b.name])
            if dt not in _LOW:
                continue
            if not ks or any(s[0] in loads_of[k.index] for k in ks):
                rounded.add((d.name, c.name))
    dev = sorted({str(t.device) for t in flat if isinstance(t, torch.Tensor)}) or ["cpu"]
    return InductorPlacement(",".join(dev), torch.__version__, stored, kernels,
                             frozenset(rounded), recomputed)


def _placeholder_values(cm: Any, flat: list) -> list:
    it = iter(flat)
    return [None if n.name in cm._consts else next(it)
            for n in cm.nodes if n.op == "placeholder"]


def _is_view(n: Any) -> bool:
    if not isinstance(n, torch.fx.Node) or n.op != "call_function":
        return False
    if n.target is operator.getitem:
        return False
    entry = _aten.ATEN.get(str(n.target))
    return entry is not None and entry[0] == "view"


def base(d: torch.fx.Node) -> torch.fx.Node:
    """The node whose value view node `d` shows (d itself when it is not a view)."""
    while _is_view(d):
        (d,) = [a for a in _arg_nodes(d)][:1]
    return d


def _view_chain(d: torch.fx.Node) -> list:
    """The views from base(d) to d, in order."""
    chain = []
    while _is_view(d):
        chain.append(d)
        d = _arg_nodes(d)[0]
    return chain[::-1]


def placement_for(cm: Any, flat: list) -> InductorPlacement:
    """`cm`'s Inductor placement for inputs like `flat` (same devices, shapes and dtypes),
    read once (a torch.compile of the captured graph) and kept with the model."""
    key = (torch.__version__,) + tuple(
        (str(t.device), tuple(t.shape), str(t.dtype)) if isinstance(t, torch.Tensor) else
        repr(t) for t in flat)
    cache = cm.__dict__.setdefault("_inductor_placements", {})
    if key not in cache:
        cache[key] = read_placement(cm, flat)
    return cache[key]


def segments_for(cm: Any, segments: list | None, flat: list) -> list:
    """`segments` (None: the capture's own) placed where Inductor stores (made once per
    placement and segment list, so their castlab functions are traced once)."""
    base_segs = cm.segments if segments is None else segments
    pl = placement_for(cm, flat)
    cache = cm.__dict__.setdefault("_placed_segments", {})
    key = (id(pl), id(base_segs))
    if key not in cache:
        cache[key] = (placed_segments(base_segs, pl), pl, base_segs)
    return cache[key][0]


# ---------------------------------------------------------------- castlab's regions, placed

def placed_segments(segments: list, placement: InductorPlacement) -> list:
    """A copy of a captured program's `segments` whose regions round where Inductor's
    kernels store: a read marked rounded in `placement` rounds (a store), a region output
    a later region reads unrounded also leaves its region as an fp32 twin (``name@f32``),
    which that region reads instead (its views replayed on it)."""
    producer: dict = {}
    for k, s in enumerate(segments):
        if s.kind == "region":
            for n in s.nodes:
                producer[n.name] = k
    out: list = []
    twins_wanted: dict = {}  # segment index -> output names needing an fp32 twin
    plans: list = []
    for k, s in enumerate(segments):
        if s.kind != "region":
            plans.append(None)
            continue
        mine = {n.name for n in s.nodes}
        exact_in: dict = {}    # input name -> (base name, views to replay)
        round_edge: set = set()
        for c in s.nodes:
            for d in _arg_nodes(c):
                rounded = placement.reads_rounded(d.name, c.name)
                if d.name in mine:
                    if rounded:
                        round_edge.add((d.name, c.name))
                    continue
                b = base(d)
                pk = producer.get(b.name)
                if rounded or pk is None or pk == k or b.name in mine:
                    continue
                if b.name not in {o.name for o in segments[pk].outputs}:
                    continue
                exact_in[(d.name, c.name)] = (b.name, _view_chain(d))
                twins_wanted.setdefault(pk, set()).add(b.name)
        plans.append((exact_in, round_edge))
    for k, s in enumerate(segments):
        if s.kind != "region":
            out.append(s)
            continue
        exact_in, round_edge = plans[k]
        twins = sorted(twins_wanted.get(k, ()))
        if not exact_in and not round_edge and not twins:
            out.append(s)
            continue
        out.append(_placed_region(s, exact_in, round_edge, twins))
    return out


class _Twin:
    """Stands for an fp32 twin of a region output among a region's inputs or outputs
    (looks like an FX node to the program: a name and a meta without a dtype)."""

    def __init__(self, node: torch.fx.Node):
        self.name = node.name + TWIN
        self.meta: dict = {}  # no dtype to cast to, castlab's layout kept
        self.node = node


def _placed_region(s: Segment, exact_in: dict, round_edge: set, twins: list) -> Segment:
    seg = Segment("region", s.nodes)
    seg.inputs = list(s.inputs)
    twin_in = sorted({b for b, _ in exact_in.values()})
    by_name = {n.name: n for n in _all_args(s)}
    for b in twin_in:
        seg.inputs.append(_Twin(by_name[b]))
    seg.outputs = list(s.outputs) + [_Twin(o) for o in s.outputs if o.name in twins]
    seg.placed = (exact_in, round_edge, twins)
    seg.jit = JitFunction(_placed_function(seg, s, exact_in, round_edge, twins),
                          policy="fused", math="torch_eager")
    return seg


def _all_args(s: Segment) -> list:
    out: dict = {}
    for n in s.nodes:
        for d in _arg_nodes(n):
            out[d.name] = d
            for v in _view_chain(d):
                out[v.name] = v
            b = base(d)
            out[b.name] = b
    return list(out.values())


def _placed_function(seg: Segment, orig: Segment, exact_in: dict, round_edge: set,
                     twins: list) -> Callable:
    nodes = orig.nodes
    input_names = [n.name for n in seg.inputs]
    n_outs = len(orig.outputs)

    def region(*xs):
        env = dict(zip(input_names, xs))
        stores: dict = {}
        replayed: dict = {}
        mapping: dict = {}
        st = _graph._state

        def nominal(b: str, chain: list):
            key = (b, tuple(v.name for v in chain))
            if key not in replayed:
                node = next(i for i in seg.inputs if i.name == b + TWIN).node
                dt = _aten.castlab_dtype(node.meta["val"].dtype)
                v = clops.astype(env[b + TWIN], dt)  # not rounded: round_casts is off
                for vn in chain:
                    args, kwargs = _subst(list(vn.args), {**env, vn.args[0].name: v}), \
                        _subst(dict(vn.kwargs), env)
                    v = _aten.build(vn, args, kwargs)
                replayed[key] = v
            return replayed[key]

        try:
            for n in nodes:
                st.where = _where(n)
                local = {}
                for d in _arg_nodes(n):
                    if (d.name, n.name) in round_edge:
                        if d.name not in stores:
                            v = env[d.name]
                            stores[d.name] = clops._store(v, v.dtype)
                        local[d.name] = stores[d.name]
                    elif (d.name, n.name) in exact_in:
                        b, chain = exact_in[(d.name, n.name)]
                        local[d.name] = nominal(b, chain)
                e = {**env, **local} if local else env
                args, kwargs = _subst(list(n.args), e), _subst(dict(n.kwargs), e)
                if n.target is operator.getitem:
                    v = args[0][args[1]]
                else:
                    v = _aten.build(n, args, kwargs)
                env[n.name] = v
                if isinstance(v, _graph.Proxy):
                    mapping[n.name] = v.node
        finally:
            st.where = None
        if xs:
            seg.maps[id(xs[0].node)] = mapping
        outs = [env[o.name] for o in orig.outputs]
        outs += [clops.astype(env[o.name[:-len(TWIN)]], "float32")
                 for o in seg.outputs[n_outs:]]
        return tuple(outs)

    region.__name__ = region.__qualname__ = f"region_{nodes[0].name}_placed"
    region._castlab_arg_names = lambda k: input_names[:k]
    region._castlab_unguarded = True
    return region

