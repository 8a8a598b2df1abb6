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

Which value is rounded for which reader is therefore not a rule castlab can guess from
the model: :func:`read_placement` compiles the captured graph with Inductor and records
each FX node's lowered value, the buffers each lowering made, the scheduler's fused
kernels and their parts, and every load the generated code makes (from memory, or from the
kernel's own store of the buffer: a looped reduction's second loop loads back, rounded,
what its first loop stored and summed in fp32), mapped back to the captured graph's nodes
(the post-grad nodes' ``from_node`` provenance). :func:`placed_segments` then computes each
castlab value as the part that stores or reads it does (:class:`_Evaluator`): a value the
part loads from a bf16/fp16 buffer is rounded there (``ops._store``), one it recomputes or
keeps from its kernel's store stays fp32, and a region output that a later region's part
recomputes reaches that region as an fp32 twin (``name@f32``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import operator
import threading
from typing import Any

import torch

from .. import _graph, _reduce
from .. import ops as clops
from .._jit import JitFunction
from . import _aten
from . import _inductor_tiles as _tiles
from . import _placement_cache as _disk
from ._partition import Segment, _arg_nodes, _subst, _where, module_path
from ._triton_choices import fuses_right, is_view

__all__ = ["InductorPlacement", "inductor_stores", "read_placement", "placed_segments",
           "placement_for", "segments_for"]

_LOW = (torch.bfloat16, torch.float16)
_lock = threading.Lock()
TWIN = "@f32"  # suffix of a region output's fp32 twin in a run's values


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One kernel of the compiled program, in launch order: ``kind`` ("generated",
    "extern" or "nop"), the captured nodes whose values it computes (``computes``), the
    buffers it writes and the buffers it loads from memory (its parts: ``parts``, the
    scheduler nodes fused into it)."""

    index: int
    kind: str
    computes: tuple
    writes: tuple
    loads: tuple
    parts: tuple


@dataclasses.dataclass
class InductorPlacement:
    """What torch.compile's Inductor stores for one captured model, inputs and device.

    ``stored``: captured node name -> (buffer, dtype name, index of the kernel writing
    it) for the values a buffer holds; ``kernels``: the compiled program's kernels.
    Per part of a kernel (a scheduler node, ``opN``): ``mem[part]``, the buffers its code
    loads from memory (rounded to the buffer's dtype), and ``cached[part]``, those it
    takes from its kernel's own store of them (fp32, as computed). ``buffer``: captured
    name -> buffer holding its value; ``home``: captured name -> the part writing it;
    ``computing``: captured name -> the generated parts whose code computes it (inlined);
    ``partial``: captured name -> buffers holding a part of its computation (a mean's
    sum), whose reader continues it from there. ``tiles``: part -> (R0_BLOCK, elements per
    thread, lanes, warps) along the row of the Triton kernel computing it, as its
    autotuner chose it (GPU only): the order of its reductions. ``lanes``: part -> the
    vector width (elements) of the C++ loop nest computing it (CPU only; 0: scalar loops,
    1: a vector across the kept dim), as Inductor's TilingSelect chose it: the accumulator
    lanes of its reductions (the width follows the loop nest's 16-bit loads, and a
    reduction reading a value its kernel keeps in a float local buffer tiles by float);
    negative where the row's last partial vector runs the scalar tail loop. ``torch``: the
    PyTorch version that compiled it. ``products``: part -> which product the last fmas of
    its launched Triton kernel fuse ("where": one whose factor is a select, such as
    rotate_half's cat; "plain": the other; _inductor_tiles.fused_product), for the adds of
    two products.
    ``rsizes``: part -> the elements its C++ reduction loops (its Triton kernel's row) run
    over: which of a composite node's reductions a part's lanes or tile belong to."""

    device: str
    torch: str
    stored: dict
    kernels: list
    buffer: dict
    home: dict
    computing: dict
    mem: dict
    cached: dict
    low: frozenset  # the buffers of a bf16/fp16 dtype
    dtypes: dict    # buffer -> its torch dtype
    loads_seen: bool  # whether the loads came from the generated code (else the scheduler)
    partial: dict     # captured name -> buffers holding a part of it (a mean's sum)
    writer: dict      # buffer -> the part writing it
    tiles: dict = dataclasses.field(default_factory=dict)  # part -> its Triton kernel's tile
    lanes: dict = dataclasses.field(default_factory=dict)  # part -> its C++ vector width
    products: dict = dataclasses.field(default_factory=dict)  # part -> its fma's product
    rsizes: dict = dataclasses.field(default_factory=dict)  # part -> its C++ reduction's size

    def describe(self, name: str) -> str:
        """Where Inductor keeps captured node `name`: its buffer, or the kernels that
        recompute it."""
        s = self.stored.get(name)
        if s is not None:
            return f"stored in {s[0]} ({s[1]}) by kernel {s[2]}"
        ks = sorted({self._kernel_of[p] for p in self.computing.get(name, ())})
        if ks:
            return "not stored: recomputed in fp32 by kernel(s) " + ", ".join(map(str, ks))
        return "not in the compiled program (a view, or folded away)"

    @property
    def _kernel_of(self) -> dict:
        return {p: k.index for k in self.kernels for p in k.parts}

    def rounded_reads(self) -> list:
        """(captured value, part) pairs where the part's code loads the value from a
        bf16/fp16 buffer: where the compiled program rounds what it hands on."""
        holders: dict = {}
        for name, b in self.buffer.items():
            holders.setdefault(b, []).append(name)
        return sorted((n, p) for p, bs in self.mem.items() for b in bs if b in self.low
                      for n in holders.get(b, ()))

    def rows(self, cm: Any) -> list:
        """One dict per value castlab computes in `cm`'s regions (captured node name, op,
        module path): whether Inductor stores it (buffer, dtype, kernel), the kernels
        that load it rounded from that buffer, and the kernels that recompute it."""
        k_of = self._kernel_of
        regional = [n for s in cm.segments if s.kind == "region" for n in s.nodes
                    if not is_view(n)]
        out = []
        for n in regional:
            st = self.stored.get(n.name)
            buf = self.buffer.get(n.name)
            loads = sorted({k_of[p] for p, bs in self.mem.items()
                            if buf is not None and buf in bs and p in k_of})
            recomputes = sorted({k_of[p] for p in self.computing.get(n.name, ())
                                 if p in k_of and (st is None or k_of[p] != st[2])})
            out.append({"node": n.name, "op": str(n.target), "module": module_path(n),
                        "buffer": st[0] if st else None, "dtype": st[1] if st else None,
                        "stored_by": st[2] if st else None,
                        "loaded_rounded_by": loads if buf in self.low else [],
                        "recomputed_by": recomputes})
        return out

    def to_frame(self, cm: Any):
        """:meth:`rows` as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.rows(cm))

    def __str__(self) -> str:
        n_gen = sum(k.kind == "generated" for k in self.kernels)
        return (f"Inductor placement ({self.device}, torch {self.torch}): "
                f"{len(self.kernels)} kernels ({n_gen} generated), {len(self.stored)} "
                f"values stored, {len(self.rounded_reads())} loads of a rounded value")


def _root_names(fx: torch.fx.Node) -> list:
    """The names of the nodes a post-grad node comes from (``from_node``), at the end of
    its provenance: export's module (``_captured_names`` maps them to the captured
    graph's)."""
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
    """torch.compile `gm` on `places` with the graph caches off, recording each FX node's
    lowered value and the scheduler's final (fused) nodes and removed buffers."""
    from torch._functorch import config as fconfig
    from torch._inductor import config as iconfig
    from torch._inductor import graph as igraph
    from torch._inductor import scheduler as isched
    from torch._inductor.codegen import common as icommon
    from torch._inductor.virtualized import V

    values: dict = {}
    created: dict = {}  # FX node -> the buffers its lowering made
    sched: list = []
    loads: list = []
    run_node, codegen = igraph.GraphLowering.run_node, isched.Scheduler.codegen
    proxy = getattr(icommon, "CSEProxy", None)
    load = getattr(proxy, "load", None)
    kernel_parts: dict = {}  # Triton kernel name -> the parts it computes
    tuners: dict = {}        # Triton kernel name -> its autotuner, once it ran
    tsched, tuner_cls = _tiles.triton_classes()
    lanes: dict = {}  # part -> the vector width of the C++ loop nest computing it
    rsizes: dict = {}  # part -> the elements its reduction loops (its Triton row) run over
    proxy_cls = _tiles.cpp_proxy_class()
    cpp_nodes = getattr(proxy_cls, "codegen_nodes", None)

    def rec_cpp_nodes(self, nodes):
        out = cpp_nodes(self, nodes)
        w = _tiles.cpp_lanes(self)
        lanes.update((n.get_name(), w) for n in nodes if n.is_reduction())
        loops = getattr(getattr(self, "loop_nest", None), "loops", None) or []
        size = _tiles.reduction_size(loops)
        if size is not None:
            rsizes.update((n.get_name(), size) for n in nodes if n.is_reduction())
        return out
    define = getattr(tsched, "define_kernel", None)
    tuner_run = getattr(tuner_cls, "run", None)

    def rec_define(self, src_code, node_schedule, kernel):
        name = define(self, src_code, node_schedule, kernel)
        # (a source defined before, such as the same RoPE kernel in every layer, returns
        # the kernel already defined: it computes these parts too)
        parts = [n for n in node_schedule if isinstance(n, isched.BaseSchedulerNode)]
        kernel_parts.setdefault(name, []).extend(n.get_name() for n in parts)
        rsizes.update(_tiles.row_lengths(kernel, parts))
        return name

    def rec_tuner_run(self, *args, **kwargs):
        tuners[getattr(self.fn, "__name__", "")] = self
        return tuner_run(self, *args, **kwargs)

    def rec_load(self, name, index):
        node = getattr(getattr(self, "kernel", None), "current_node", None)
        cache = getattr(getattr(self.kernel, "cse", None), "store_cache", {})
        if node is not None:
            loads.append((node.get_name(), name, name in cache))
        return load(self, name, index)

    def rec_run_node(self, n):
        before = len(self.buffers)
        out = run_node(self, n)
        values[n] = out
        created[n] = [b.get_name() for b in self.buffers[before:]]
        return out

    def rec_codegen(self):
        out = codegen(self)
        sched.append((list(self.nodes), set(V.graph.removed_buffers)))
        return out

    with _lock:
        igraph.GraphLowering.run_node = rec_run_node
        isched.Scheduler.codegen = rec_codegen
        if load is not None:
            proxy.load = rec_load
        if define is not None and tuner_run is not None:
            tsched.define_kernel, tuner_cls.run = rec_define, rec_tuner_run
        if cpp_nodes is not None:
            proxy_cls.codegen_nodes = rec_cpp_nodes
        try:
            torch._dynamo.reset()
            with iconfig.patch(fx_graph_cache=False, fx_graph_remote_cache=False), \
                    fconfig.patch(enable_autograd_cache=False), torch.no_grad():
                # The graph caches off, so that the scheduler runs; the autotuner's cache
                # on: a kernel whose source another compile of the model made before (the
                # user's torch.compile) launches the configuration that compile chose, and
                # the configuration decides the bits (which product an fma fuses, a
                # reduction's tile). (force_disable_caches would also change every
                # kernel's source: Inductor writes it into the kernel's metadata.)
                torch.compile(gm, dynamic=False)(*places)
        finally:
            igraph.GraphLowering.run_node = run_node
            isched.Scheduler.codegen = codegen
            if load is not None:
                proxy.load = load
            if define is not None and tuner_run is not None:
                tsched.define_kernel, tuner_cls.run = define, tuner_run
            if cpp_nodes is not None:
                proxy_cls.codegen_nodes = cpp_nodes
            torch._dynamo.reset()
    if len(sched) != 1:
        raise RuntimeError(f"castlab.torch: torch.compile made {len(sched)} Inductor graphs of "
                           "the captured graph (expected one); its placement cannot be read")
    tiles, products = {}, {}
    for name, parts in kernel_parts.items():
        tile = _tiles.tile(tuners.get(name))
        if tile is not None:
            tiles.update((p, tile) for p in parts)
        fused = _tiles.fused_product(tuners.get(name))
        if fused is not None:
            products.update((p, fused) for p in parts)
    names = _captured_names(gm)
    return (values, sched[0][0], sched[0][1], loads, created, (tiles, products), (lanes, rsizes),
            names)


def _captured_names(gm: torch.fx.GraphModule) -> dict:
    """Root name -> the captured graph's node name. A post-grad node's provenance
    (``from_node``) leads back past the captured graph to the graph it was made from (the
    exported program's module, whose nodes export named before castlab's capture renamed
    them); the captured nodes' own provenance gives the way back."""
    out: dict = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.meta.get("from_node"):
            for r in _root_names(n):
                out.setdefault(r, n.name)
    return out


def _places(cm: Any, flat: list) -> list:
    """The captured graph's inputs: its parameters and buffers, the user's in order."""
    it = iter(flat)
    return [cm._consts[n.name] if n.name in cm._consts else next(it)
            for n in cm.nodes if n.op == "placeholder"]


def read_placement(cm: Any, flat: list) -> InductorPlacement:
    """Compile captured model `cm` with torch.compile (Inductor, default settings) on the
    flat inputs `flat` and read where it stores, loads and recomputes each captured value."""
    from torch._inductor import scheduler as isched

    places = _places(cm, flat)
    values, nodes, removed, loads, created, (tiles, products), (lanes, rsizes), names = \
        _compile_and_record(cm.exported.graph_module, places)

    def _root(fx):
        return [names.get(r, r) for r in _root_names(fx)]
    # the lowered value of each captured node: that of its last post-grad node; buffers
    # its lowering made that hold no node's value hold a part of it (a mean's sum)
    last: dict = {}
    made: dict = {}
    for fx, v in values.items():
        if fx.op == "call_function":
            for r in _root(fx):
                last[r] = v
                made.setdefault(r, []).extend(created.get(fx, ()))
    buffer, dtypes = {}, {}
    for name, v in last.items():
        b = _buffer(v)
        if b is not None:
            buffer[name] = b.get_name()
            dtypes[b.get_name()] = _dtype(b)
    holders = set(buffer.values())
    partial = {name: [b for b in bs if b not in holders] for name, bs in made.items()}
    kernels, writer, part_writer, computing = [], {}, {}, {}
    mem: dict = {}
    cached: dict = {}
    for k, sn in enumerate(nodes):
        kind = ("extern" if sn.is_extern() else
                "nop" if isinstance(sn, isched.NopKernelSchedulerNode) else "generated")
        writes = tuple(sorted(sn.get_buffer_names()))
        own = set(writes)
        computes: set = set()
        parts = []
        for s in sn.get_nodes():
            pn = s.get_name()
            parts.append(pn)
            for b in s.get_outputs():
                part_writer[b.get_name()] = pn
            roots: set = set()
            for o in (getattr(s.node, "origins", None) or ()):
                roots.update(_root(o))
            computes |= roots
            if kind == "generated":
                for r in roots:
                    computing.setdefault(r, []).append(pn)
            reads = {d.name for d in s.read_writes.reads}  # (without the generated code)
            mem[pn] = reads - own
            cached[pn] = reads & own
        for b in writes:
            writer[b] = k
        loads_k = tuple(sorted({d.name for d in sn.read_writes.reads} - own))
        kernels.append(Kernel(k, kind, tuple(sorted(computes)), writes, loads_k, tuple(parts)))
    seen = {p for p, _, _ in loads}
    for p in seen:  # the generated code's own loads, where recorded
        mem[p] = {b for q, b, c in loads if q == p and not c}
        cached[p] = {b for q, b, c in loads if q == p and c}
    stored, home = {}, {}
    for name, bn in buffer.items():
        if bn in removed or bn not in writer:
            continue
        dt = dtypes.get(bn)
        stored[name] = (bn, str(dt).replace("torch.", "") if dt else "?", writer[bn])
        if bn in part_writer:
            home[name] = part_writer[bn]
    low = frozenset(b for b, dt in dtypes.items() if dt in _LOW)
    dev = sorted({str(t.device) for t in flat if isinstance(t, torch.Tensor)}) or ["cpu"]
    return InductorPlacement(",".join(dev), torch.__version__, stored, kernels, buffer, home,
                             computing, mem, cached, low, dtypes, bool(seen),
                             {n: bs for n, bs in partial.items() if bs}, part_writer,
                             tiles, lanes, products, rsizes)


def base(d: torch.fx.Node) -> torch.fx.Node:
    """The node whose value view node `d` shows (d itself when it is not a view)."""
    while is_view(d):
        d = _arg_nodes(d)[0]
    return d


def _view_chain(d: torch.fx.Node) -> list:
    """The views from base(d) to d, in order."""
    chain = []
    while is_view(d):
        chain.append(d)
        d = _arg_nodes(d)[0]
    return chain[::-1]


def inductor_stores(cm: Any, *inputs: Any, kwargs: dict | None = None) -> InductorPlacement:
    """Where torch.compile's Inductor (default settings) stores, loads and recomputes each
    value of captured model `cm` on these inputs, read from its compiled program: the
    placement the ``torch_compile`` stack runs (``stores="inductor"``). ``rows(cm)`` /
    ``to_frame(cm)`` list every value castlab's regions compute; ``describe(name)`` one.
    Capture with ``attention="traced"`` to get the program ``torch.compile(model)`` runs.

    >>> import torch, castlab.torch as ct
    >>> x = torch.randn(8, 64).to(torch.bfloat16)
    >>> w = torch.randn(64, 64).to(torch.bfloat16)
    >>> cm = ct.capture(lambda x: torch.exp(x * 2) @ w + x * 2, x)
    >>> pl = ct.inductor_stores(cm, x)                      # doctest: +SKIP
    >>> pl.describe("mul")                                  # doctest: +SKIP
    'not stored: recomputed in fp32 by kernel(s) 0'
    """
    if not (hasattr(cm, "_flat_inputs") and hasattr(cm, "exported")):
        raise TypeError(f"inductor_stores: expected a model captured by "
                        f"castlab.torch.capture, not {type(cm).__name__} (capture it first)")
    return placement_for(cm, cm._flat_inputs(inputs, kwargs))


# Placements by captured graph and input signature, shared by captures of the same model
# (the same graph code, devices, shapes, strides and dtypes compile to the same program;
# weights' values play no part): a second capture in a process reads it without compiling.
_SHARED: dict = {}
_SHARED_MAX = 16


def placement_for(cm: Any, flat: list) -> InductorPlacement:
    """`cm`'s Inductor placement for inputs like `flat` (same devices, shapes and dtypes),
    read once (a torch.compile of the captured graph) and kept with the model, in the
    process and on disk (castlab.torch._placement_cache)."""
    key = _disk.placement_key(cm.exported.graph_module.code, _places(cm, flat))
    cache = cm.__dict__.setdefault("_inductor_placements", {})
    if key not in cache:
        with _lock:
            pl = _SHARED.get(key)
        if pl is None:
            pl = _disk.load(key)
        if pl is None:
            pl = read_placement(cm, flat)
            _disk.store(key, pl)
        with _lock:
            if key not in _SHARED:
                while len(_SHARED) >= _SHARED_MAX:
                    _SHARED.pop(next(iter(_SHARED)))
                _SHARED[key] = pl
        cache[key] = pl
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
    """A copy of a captured program's `segments` whose regions compute each value as the
    compiled program's kernel part that stores or reads it does (:class:`_Evaluator`):
    values a part loads from a bf16/fp16 buffer are rounded there, values it recomputes
    or takes from its kernel's own store stay fp32. A region output that a later region's
    part recomputes also leaves its region as an fp32 twin (``name@f32``)."""
    producer: dict = {}
    for k, s in enumerate(segments):
        if s.kind == "region":
            for n in s.nodes:
                producer[n.name] = k
    twins: dict = {}      # region index -> names of its outputs wanted as fp32 twins
    twin_in: dict = {}    # region index -> names of the twins it reads
    for k in range(len(segments) - 1, -1, -1):  # requests go to earlier regions only
        s = segments[k]
        if s.kind != "region":
            continue
        ev = _Evaluator(s, placement, producer, k, None)
        for o in s.outputs:
            ev.out(o)
        for name in sorted(twins.get(k, ())):
            ev.twin(name)
        twin_in[k] = set(ev.wanted)
        for b in ev.wanted:
            twins.setdefault(producer[b], set()).add(b)
    out = []
    for k, s in enumerate(segments):
        if s.kind != "region":
            out.append(s)
            continue
        out.append(_placed_region(s, placement, producer, k, sorted(twin_in.get(k, ())),
                                  sorted(twins.get(k, ()))))
    return out


class _Twin:
    """Stands for an fp32 twin of a region output among a region's inputs or outputs
    (looks like an FX node to the program: a name and a meta without a dtype)."""

    def __init__(self, node: torch.fx.Node):
        self.name = node.name + TWIN
        self.meta: dict = {}  # no dtype to cast to, castlab's layout kept
        self.node = node


class _Evaluator:
    """A region's values as the compiled program's parts compute them. ``get(d, X)``:
    node d's value inside part X (None: no part, e.g. a value no kernel keeps): loaded
    rounded when X loads d's bf16/fp16 buffer from memory, as its storing part computed
    it when X takes it from its kernel's store, else recomputed inside X from what X
    reads. ``out(o)``: a region output as its storing part computes it; ``twin(o)``: o
    in fp32 for a later region (computed as the first part computing it does).
    `ops` (None: only find the twins this region reads, in ``wanted``): the castlab
    functions (build, store, nominal) and the values of the region's inputs."""

    def __init__(self, seg: Segment, pl: InductorPlacement, producer: dict, k: int,
                 ops: Any):
        self.seg, self.pl, self.producer, self.k, self.ops = seg, pl, producer, k, ops
        self.mine = {n.name: n for n in seg.nodes}
        self.inputs = {n.name for n in seg.inputs}
        self.memo: dict = {}
        self.wanted: set = set()

    def _build(self, n, vals: dict, x: Any = None, builder: Any = None):
        """n built on `vals` with the reduction order of part x (its Triton tile, its C++
        lanes); `builder(args, kwargs)`: another builder than n's ATen entry."""
        if self.ops is None:
            return n.name
        args, kwargs = _subst(list(n.args), vals), _subst(dict(n.kwargs), vals)
        if n.target is operator.getitem:
            return args[0][args[1]]
        _graph._state.where = _where(n)
        annot = _graph._state.annot
        if fuses_right(n, self.pl.products.get(x)):  # LLVM's fma takes the right product
            _graph._state.annot = {**(annot or {}), "fma_side": "right"}
        try:  # the reductions of part x in its Triton kernel's order
            with _tiled(self._lanes(n, x, self.pl.tiles) if x in self.pl.tiles else None,
                        self._lanes(n, x)):
                return (builder or functools.partial(_aten.build, n))(args, kwargs)
        finally:
            _graph._state.where, _graph._state.annot = None, annot

    def _ctx(self, name: str):
        x = self.pl.home.get(name) or (self.pl.computing.get(name) or [None])[0]
        if x is None and name in self.mine:  # a view the program never names: its base's
            b = base(self.mine[name])
            if b.name != name:
                return self._ctx(b.name)
        return x

    def out(self, o):
        return self.get(o, self._ctx(o.name))

    def _continued(self, d, x, src):
        """d in part x, which finishes what part src began (a mean's sum, a layer_norm's
        moments): as src computes it, except a layer_norm whose moments src sums from one
        version of its input (fp32, as computed) and x normalizes another (loaded back
        rounded from the kernel's store)."""
        if str(d.target) != "aten.layer_norm.default":
            return self.get(d, src)
        a0 = d.args[0]
        first = self.pl.writer.get(self.pl.partial[d.name][0], src)  # the mean's sum's part
        xn, xm = self.get(a0, x), self.get(a0, first)
        if self.ops is None or xn is xm:
            return self.get(d, src)
        vals = {a.name: self.get(a, x) for a in _arg_nodes(d)}
        return self._build(d, vals, first,
                           lambda a, kw: _aten._layer_norm(a, kw, moments_of=xm))

    def _lanes(self, n, x, table: dict | None = None):
        """The C++ vector width of the reduction computing n in part x: x's, or where x
        only finishes it (a layer_norm's normalization), that of the reduction part that
        computes its moments. A node whose parts reduce with different widths (a
        cross-entropy: its log-softmax's rows by 16-bit vectors, its sum over the rows by
        float ones) gets {reduced elements: width} (castlab._inductor_cpp picks by the
        reduction's length), where the lengths tell the parts apart. `table`: the parts'
        Triton tiles instead (reduce_spec picks the same way)."""
        lanes, sizes = self.pl.lanes if table is None else table, self.pl.rsizes
        parts = [p for p in self.pl.computing.get(n.name, ()) if p in lanes]
        if len({lanes[p] for p in parts}) > 1 and all(p in sizes for p in parts):
            by_n: dict = {}
            for p in parts:
                by_n.setdefault(sizes[p], set()).add(lanes[p])
            if all(len(w) == 1 for w in by_n.values()):
                return {k: next(iter(w)) for k, w in by_n.items()}
        if x in lanes:
            return lanes[x]
        return next((lanes[p] for p in parts), None)

    def twin(self, name: str):
        v = self.get(self.mine[name], self._ctx(name))
        return v if self.ops is None else self.ops["astype"](v, "float32")

    def _input(self, d, x):
        """Region input d in part x: as handed over (rounded), or from its producer
        region's fp32 twin where x recomputes it (its views replayed on it)."""
        b = base(d)
        buf = self.pl.buffer.get(b.name)
        pk = self.producer.get(b.name)
        exact = (x is not None and pk is not None and pk != self.k
                 and buf not in self.pl.mem.get(x, ()))
        if not exact:
            return d.name if self.ops is None else self.ops["env"][d.name]
        self.wanted.add(b.name)
        if self.ops is None:
            return d.name
        key = ("twin", d.name)
        if key not in self.memo:
            dt = _aten.castlab_dtype(b.meta["val"].dtype)
            v = self.ops["astype"](self.ops["env"][b.name + TWIN], dt)  # round_casts off
            for vn in _view_chain(d):
                v = self._build(vn, {vn.args[0].name: v})
            self.memo[key] = v
        return self.memo[key]

    def get(self, d, x):
        if d.name not in self.mine:
            return self._input(d, x)
        key = (d.name, x)
        if key in self.memo:
            return self.memo[key]
        pl, buf = self.pl, self.pl.buffer.get(d.name)
        h = pl.home.get(d.name)
        if x is not None and h is not None and h != x and buf in pl.mem.get(x, ()):
            v = self.get(d, h)
            if buf in pl.low and self.ops is not None:
                v = self.ops["store"](v, _aten.castlab_dtype(pl.dtypes[buf]))
        elif x is not None and h is not None and h != x and buf in pl.cached.get(x, ()):
            v = self.get(d, h)
        else:
            src = next((pl.writer[b] for b in pl.partial.get(d.name, ())
                        if x is not None and pl.writer.get(b, x) != x
                        and (b in pl.mem.get(x, ()) or b in pl.cached.get(x, ()))), None)
            if src is not None:  # x continues it from a part another part wrote
                v = self._continued(d, x, src)
            else:
                v = self._sum_of_squares(d, x)
                if v is None:
                    vals = {a.name: self.get(a, x) for a in _arg_nodes(d)}
                    v = self._build(d, vals, x)
        self.memo[key] = v
        return v


    def _sum_of_squares(self, d, x):
        """A row sum or mean of ``y * y`` (``y ** 2``: RMSNorm's variance) in part x,
        whose Triton kernel holds several contiguous elements per thread: ptxas contracts
        each thread's sum into fmas, ``fma(e0, e0, e1 * e1)`` then ``fma(ek, ek, acc)``
        (its PTX: measured on an H100, torch 2.11), before the threads' butterfly. A
        product of fp32 values is inexact, so the contraction shows (a sum of squares of
        bf16 values is exact either way). None: not such a reduction, or another layout
        (a looped kernel, a row the threads do not tile evenly): the plain order."""
        tile = self.pl.tiles.get(x)
        if tile is None or self.ops is None or str(d.target) not in _SUMS:
            return None
        sq, dims = d.args[0], d.args[1] if len(d.args) > 1 else None
        keep = d.args[2] if len(d.args) > 2 else d.kwargs.get("keepdim", False)
        if not isinstance(sq, torch.fx.Node) or sq.name not in self.mine:
            return None
        t = str(sq.target)
        if t == "aten.pow.Tensor_Scalar" and sq.args[1] == 2:
            y = sq.args[0]
        elif t == "aten.mul.Tensor" and sq.args[0] is sq.args[1]:
            y = sq.args[0]
        else:
            return None
        val = sq.meta.get("val")
        r, per, lanes, warps = tile
        if (val is None or val.dtype != torch.float32 or val.dim() == 0 or dims is None
                or [int(a) % val.dim() for a in dims] != [val.dim() - 1] or per < 2
                or val.shape[-1] > r or val.shape[-1] % per or d.kwargs.get("dtype")):
            return None
        n = int(val.shape[-1])
        yv = self.get(y, x)
        e = [yv[..., k::per] for k in range(per)]
        acc = clops.fma(e[0], e[0], e[1] * e[1])
        for k in range(2, per):
            acc = clops.fma(e[k], e[k], acc)
        with _tiled((r // per, 1, lanes, warps)):  # the threads' sums: lanes, then warps
            out = _reduce.sum(acc, -1, keepdim=bool(keep))
        # (a mean's division by the row's n, not by the threads' count: as _reduce.mean)
        return out / float(n) if str(d.target) == "aten.mean.dim" else out


_SUMS = ("aten.mean.dim", "aten.sum.dim_IntList")


@contextlib.contextmanager
def _tiled(tile: tuple | None, lanes: int | dict | None = None):
    """Every castlab node recorded inside carries `tile` (the Triton kernel's, for
    reduce_spec) and `lanes` (the C++ loop nest's vector width: ``cpp_lanes``); None:
    nothing changes."""
    st = _graph._state
    annot = st.annot
    extra = {k: v for k, v in (("triton_tile", tile), ("cpp_lanes", lanes)) if v is not None}
    if extra:
        st.annot = {**(annot or {}), **extra}
    try:
        yield
    finally:
        st.annot = annot


def _placed_region(s: Segment, pl: InductorPlacement, producer: dict, k: int,
                   twin_in: list, twins: list) -> Segment:
    seg = Segment("region", s.nodes)
    by_name = {n.name: n for n in _all_args(s)}
    seg.inputs = list(s.inputs) + [_Twin(by_name[b]) for b in twin_in]
    # a twin is wanted by a node's name: an output, or the node an output views or clones
    mine = {n.name: n for n in s.nodes}
    seg.outputs = list(s.outputs) + [_Twin(mine[b]) for b in twins]
    input_names = [n.name for n in seg.inputs]
    outs, twin_names = list(s.outputs), list(twins)

    def region(*xs):
        ops = {"env": dict(zip(input_names, xs)), "astype": clops.astype,
               "store": clops._store}
        ev = _Evaluator(s, pl, producer, k, ops)
        vals = [ev.out(o) for o in outs] + [ev.twin(name) for name in twin_names]
        if xs:
            mapping: dict = {}
            for (name, x), v in ev.memo.items():  # each value as its storing part has it
                if name in ev.mine and isinstance(v, _graph.Proxy) and (
                        name not in mapping or x == pl.home.get(name)):
                    mapping[name] = v.node
            seg.maps[id(xs[0].node)] = mapping
        return tuple(vals)

    region.__name__ = region.__qualname__ = f"region_{s.nodes[0].name}_placed"
    region._castlab_arg_names = lambda n: input_names[:n]
    region._castlab_unguarded = True
    seg.jit = JitFunction(region, policy="fused", math="torch_eager")
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
