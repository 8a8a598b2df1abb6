"""The graph IR: nodes, the tracing state, and the front end of every op.

Each op is defined once here as a *node builder*: it checks dtypes and shapes (as
PyTorch would), computes the result dtype and shape, and returns a :class:`Node`. Eager
calls build a one-op graph over concrete tensors and run it at once; traced calls append
the node to the graph being recorded.
"""

from __future__ import annotations

import linecache
import operator
import os
import sys
import threading
from typing import Any

import numpy as np

from . import _C
from ._device import CPU, as_device, device
from ._dtype import as_dtype, bool_, dtype, float32, int64, promote_types
from ._optable import names

# Op categories, from the op table (ops/op_table.h).
UNARY_FLOAT = names("unary_float")
UNARY_SIGNED = names("unary_signed")
BINARY_ARITH = names("binary")
COMPARE = names("compare")
TERNARY = names("ternary")
CONDITIONAL = names("conditional")
ELEMENTWISE = set(names("unary_float", "unary_signed", "binary", "compare", "ternary",
                        "conditional") + ("astype",))
VIEW_OPS = ("slice", "select", "permute", "expand", "reshape", "unsqueeze", "squeeze")


class Node:
    """One value of a graph: an input, a scalar constant, or the result of an op."""

    __slots__ = ("op", "inputs", "attrs", "shape", "dtype", "device", "index", "tensor",
                 "value", "where")

    def __init__(self, op: str, inputs: tuple, shape: tuple, dt: dtype | None, device: Any,
                 attrs: dict | None = None):
        self.op = op
        self.inputs = inputs
        self.attrs = attrs or {}
        self.shape = tuple(shape)
        self.dtype = dt
        self.device: device = as_device(device)
        self.index = -1       # position in the traced graph
        self.tensor = None    # 'input' nodes: the concrete tensor (eager or example input)
        self.value = None     # 'scalar' nodes: the Python number
        self.where = None     # (file, line, source text) of the user code that recorded it

    def __repr__(self) -> str:
        return f"Node({self.op}, {self.dtype}, {list(self.shape)})"


# ---------------------------------------------------------------- tracing state

class _TraceState(threading.local):
    graph: list | None = None
    captured: list = []        # concrete tensors a traced function closed over
    captured_nodes: list = []
    n_inputs: int = 0
    annot: dict | None = None  # attrs every recorded node gets (gradient phase, kernel)
    where: tuple | None = None  # source location recorded nodes get instead of the caller's


_state = _TraceState()


def tracing() -> bool:
    return _state.graph is not None


class Proxy:
    """A symbolic tensor seen by a function while ``castlab.jit`` traces it. Its tensor
    methods and operators are castlab._tensor.TensorMethods', copied onto this class when
    that module is imported (they call the ops, a layer above this module)."""

    __slots__ = ("node",)
    __array_priority__ = 1000

    def __init__(self, node: Node):
        self.node = node

    @property
    def shape(self) -> tuple:
        """The traced value's shape (known while tracing)."""
        return self.node.shape

    @property
    def dtype(self) -> dtype:
        """The traced value's dtype."""
        return self.node.dtype

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.node.shape)

    def dim(self) -> int:
        """The number of dimensions."""
        return len(self.node.shape)

    def size(self, d: int | None = None):
        """The shape (a tuple), or the size of dimension ``d``."""
        return self.node.shape if d is None else self.node.shape[d]

    def numel(self) -> int:
        """The number of elements."""
        n = 1
        for s in self.node.shape:
            n *= s
        return n

    @property
    def device(self) -> device:
        """The device the traced value will live on."""
        return self.node.device

    def __repr__(self) -> str:
        return f"Proxy(t{self.node.index}: {self.node.dtype.short}{list(self.node.shape)})"

    def _value_error(self, what: str):
        w = user_location()
        loc = f" at {w[0]}:{w[1]}: {w[2]}" if w else ""
        raise TypeError(
            f"{what} of a traced tensor is not available while castlab.jit traces{loc}. "
            "A traced function may not branch on tensor values (Python control flow on "
            "data); compute both branches and use castlab.where, or run it eagerly.")

    def __bool__(self):
        self._value_error("the truth value")

    def __float__(self):
        self._value_error("float()")

    def __int__(self):
        self._value_error("int()")

    def __index__(self):
        self._value_error("index()")

    def item(self):
        """Raises: a traced tensor has no values."""
        self._value_error(".item()")

    def tolist(self):
        """Raises: a traced tensor has no values."""
        self._value_error(".tolist()")

    def numpy(self):
        """Raises: a traced tensor has no values."""
        self._value_error(".numpy()")

    def __array__(self, *a, **k):
        self._value_error("conversion to NumPy")

    def __len__(self):
        if not self.node.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.node.shape[0]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _in_package(filename: str) -> bool:
    if filename.startswith("<"):
        return False
    d = os.path.dirname(os.path.abspath(filename))
    return d == _PACKAGE_DIR or d.startswith(_PACKAGE_DIR + os.sep)


def user_location() -> tuple | None:
    """(file, line, source text) of the innermost frame outside castlab's package
    directory: the user's code (even in a folder that happens to be named castlab)."""
    f = sys._getframe(1)
    while f is not None and _in_package(f.f_code.co_filename):
        f = f.f_back
    if f is None:
        return None
    fn, ln = f.f_code.co_filename, f.f_lineno
    return (fn, ln, linecache.getline(fn, ln).strip())


def record(node: Node) -> Node:
    g = _state.graph
    node.index = len(g)
    st = _state
    node.where = st.where if st.where is not None else user_location()
    if st.annot:
        node.attrs = {**node.attrs, **st.annot}
    g.append(node)
    return node


# ---------------------------------------------------------------- node builders

def _category(d: dtype) -> int:
    return 2 if d.is_floating_point else (0 if d is bool_ else 1)


def _scalar_category(v: Any) -> int:
    if isinstance(v, bool):
        return 0
    if isinstance(v, int):
        return 1
    return 2


def result_type(operands: list) -> dtype:
    """PyTorch's result type: dimensioned tensors, then 0-d tensors, then Python scalars."""
    dim_t = None
    zero_t = None
    sc = -1
    for o in operands:
        if isinstance(o, Node) and o.op != "scalar":
            if len(o.shape) > 0:
                dim_t = o.dtype if dim_t is None else promote_types(dim_t, o.dtype)
            else:
                zero_t = o.dtype if zero_t is None else promote_types(zero_t, o.dtype)
        else:
            v = o.value if isinstance(o, Node) else o
            sc = max(sc, _scalar_category(v))
    res = dim_t
    if zero_t is not None:
        if res is None or _category(zero_t) > _category(res):
            res = zero_t
    if sc >= 0:
        if res is None or sc > _category(res):
            res = {0: bool_, 1: int64, 2: float32}[sc]
    return res


def broadcast(shapes: list[tuple]) -> tuple:
    out: tuple = ()
    for s in shapes:
        out = tuple(_C.broadcast_shapes(list(out), list(s)))
    return out


def scalar_node(v: Any, device: Any) -> Node:
    if not isinstance(v, (bool, int, float)):
        raise TypeError(f"expected a tensor or a Python number, got {type(v).__name__}")
    n = Node("scalar", (), (), None, device)
    n.value = v
    return n


def _check_devices(nodes: list[Node], op: str) -> device:
    devs = {n.device for n in nodes if n.op != "scalar"}
    if len(devs) > 1:
        raise ValueError(f"{op}: expected all tensors on the same device, got "
                         + " and ".join(sorted(map(str, devs))))
    return devs.pop() if devs else CPU


def elementwise(op: str, args: list[Node], attrs: dict | None = None) -> Node:
    """Validate an elementwise op and build its node (shape: broadcast; dtype: PyTorch's)."""
    device = _check_devices(args, op)
    for a in args:
        if a.op == "scalar":
            a.device = device
    tensors = [a for a in args if a.op != "scalar"]
    shape = broadcast([a.shape for a in tensors])
    if op in UNARY_FLOAT:
        d = args[0].dtype
        if d is bool_:
            raise TypeError(f"{op} is not supported for bool tensors")
        out = d if d.is_floating_point else float32
    elif op in UNARY_SIGNED:
        d = args[0].dtype
        if not d.is_floating_point:
            raise TypeError(f"{op} is not supported for {d.name} tensors in castlab "
                            "(castlab computes floating-point ops; cast with .astype(cl.float32))")
        out = d
    elif op in BINARY_ARITH or op in TERNARY:
        rt = result_type(args)
        if not rt.is_floating_point:
            if op == "div":
                rt = float32
            else:
                raise TypeError(f"{op} of {rt.name} values is not supported in castlab "
                                "(castlab computes floating-point ops; cast with .astype(cl.float32))")
        out = rt
    elif op in COMPARE:
        result_type(args)  # validates promotion
        out = bool_
    elif op in CONDITIONAL:
        cond = args[0]
        if cond.op == "scalar" or cond.dtype is not bool_:
            raise TypeError(f"{op}: the condition must be a bool tensor (e.g. from a comparison)")
        out = result_type(args[1:])
    elif op == "astype":
        out = as_dtype(attrs["dtype"])
    else:
        raise ValueError(f"unknown elementwise op {op!r}")
    if op in UNARY_FLOAT + UNARY_SIGNED + ("astype",) and args[0].op == "scalar":
        raise TypeError(f"{op} expects a tensor, got a Python number")
    return Node(op, tuple(args), shape, out, device, attrs)


def view_node(op: str, x: Node, shape: tuple, attrs: dict) -> Node:
    return Node(op, (x,), shape, x.dtype, x.device, attrs)


def cat_node(parts: list[Node], dim: int, shape: tuple, dt: dtype) -> Node:
    device = _check_devices(parts, "cat")
    return Node("cat", tuple(parts), shape, dt, device, {"dim": dim})


def _index_dim(fn: str, d: Any, what: str) -> int:
    """An integer-like dim (int, NumPy integer, anything with __index__) as an int;
    bools (Python's or NumPy's) and floats are refused."""
    if isinstance(d, (bool, np.bool_)):
        raise TypeError(f"{fn}: {what}, not a bool ({d!r})")
    if isinstance(d, int):
        return int(d)
    try:
        return operator.index(d)
    except TypeError:
        raise TypeError(f"{fn}: {what}, not {type(d).__name__} ({d!r})") from None


def reduce_dims(fn: str, shape: tuple, dim: Any) -> tuple:
    """PyTorch's reading of a reduction's ``dim``: None (or an empty sequence, as amax's
    default) for every dimension, an int, or a sequence of distinct ints; negative dims
    count from the end. A 0-d tensor accepts dim 0 and -1. Returns the sorted dims."""
    nd = len(shape)
    if dim is None:
        return tuple(range(nd))
    if not isinstance(dim, (tuple, list)):
        dim = _index_dim(fn, dim, "dim must be an int, a sequence of ints or None")
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:
        return tuple(range(nd))
    lo, hi = (-1, 0) if nd == 0 else (-nd, nd - 1)
    out = []
    for d in dims:
        d = _index_dim(fn, d, "dim must contain ints")
        if not lo <= d <= hi:
            raise IndexError(f"{fn}: Dimension out of range (expected to be in range of "
                             f"[{lo}, {hi}], but got {d})")
        d = d % nd if nd else 0
        if d in out:
            raise ValueError(f"{fn}: dim {d} appears multiple times in the list of dims")
        out.append(d)
    return tuple(sorted(d for d in out if nd))


def reduce_node(op: str, x: Node, dims: tuple, keepdim: bool, dt: dtype) -> Node:
    """A row reduction (sum, amax, amin) of a floating-point x over `dims` (sorted,
    non-negative); castlab._reduce checks the dtype, naming the function called."""
    if op != "sum":
        for d in dims:
            if x.shape[d] == 0:
                raise IndexError(f"{op}(): Expected reduction dim {d} to have non-zero size.")
    shape = tuple(1 if i in dims else s for i, s in enumerate(x.shape) if keepdim or i not in dims)
    return Node(op, (x,), shape, dt, x.device, {"dims": tuple(dims), "keepdim": bool(keepdim)})


# ---------------------------------------------------------------- kernel expansions

#: Ops that stand for one of PyTorch's kernels whose arithmetic depends on how the graph
#: is lowered (var and layer_norm: Welford's algorithm under the torch orders, two passes
#: under castlab's own): op name -> expand(ctx, node, *inputs) -> Proxy, which records the
#: kernel's nodes with the op builders. castlab._reduce registers them; the lowering calls
#: :func:`expand` with what it knows (the order, the device, the operands' alignment).
EXPANSIONS: dict = {}


def expand(node: Node, ctx: Any) -> tuple:
    """(result, new nodes in order): the nodes `node` stands for under `ctx` (a fresh
    sub-graph of its inputs). Every new node carries node's kernel and position (index,
    source line); all but the result are inside the kernel, so the eager policy rounds
    only the result."""
    st = _state
    saved = (st.graph, st.annot, st.where)
    st.graph, st.where = [], node.where
    keep = {k: node.attrs[k] for k in ("phase", "triton_tile", "cpp_lanes") if k in node.attrs}
    st.annot = keep or None
    try:
        out = EXPANSIONS[node.op](ctx, node, *[Proxy(a) for a in node.inputs]).node
        new = st.graph
    finally:
        st.graph, st.annot, st.where = saved
    kernel = {k: node.attrs[k] for k in ("kernel", "kernel_id") if k in node.attrs}
    kernel.update(getattr(ctx, "attrs", None) or {})  # what the expansion says of them all
    for n in new:
        n.index = node.index
        n.attrs = {**n.attrs, **kernel}
        if n is not out:
            n.attrs["kernel_inner"] = True
    if node.attrs.get("kernel_inner"):
        out.attrs["kernel_inner"] = True
    return out, new
