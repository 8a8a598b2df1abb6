"""Cast policies: where a graph rounds to a storage dtype (:class:`Policy`), and the
field checks :class:`~castlab.Math` shares. Imported through :mod:`castlab.policy`."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable
from typing import Any

from ._dtype import as_dtype, dtype, float64
from ._optable import (
    OPS,
    REDUCE_OPS,
)

__all__ = ["Policy", "as_policy"]


def _cached_hash(obj) -> int:
    """Hash of a frozen dataclass's fields, computed once."""
    h = obj.__dict__.get("_hash")
    if h is None:
        h = hash(tuple(getattr(obj, f.name) for f in dataclasses.fields(obj)))
        object.__setattr__(obj, "_hash", h)
    return h


_ROUNDING = {"nearest": 0, "toward_zero": 1, "stochastic": 2}
_ROUNDING_ALIASES = {"nearest_even": "nearest"}   # normalised once, at construction
_UNSET: Any = None                                # "not given": the name's own value


def _check_bool(cls: str, field: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{cls}: {field} must be True or False, not {type(v).__name__} {v!r}")
    return v


def _check_choice(cls: str, field: str, v: Any, valid) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{cls}: {field} must be a str (one of {', '.join(map(repr, valid))}), "
                        f"not {type(v).__name__} {v!r}")
    if v not in valid:
        raise ValueError(f"{cls}: unknown {field} {v!r}; valid: " + ", ".join(map(repr, valid)))
    return v


_PHASES = ("forward", "backward")  # selectors for every node of a gradient graph's phase


def _selector_ops() -> frozenset:
    return frozenset(OPS) | {"astype"} | frozenset(REDUCE_OPS)


def _check_selector(s: Any):
    """One round_after selector: an op name (str) or a node index (int >= 0)."""
    if isinstance(s, bool) or isinstance(s, float) or not isinstance(s, (str, int)):
        try:
            if isinstance(s, bool):
                raise TypeError
            s = operator.index(s)  # NumPy integers
        except TypeError:
            raise TypeError("Policy: round_after selectors must be op names (str) or node "
                            f"indices (int >= 0), not {type(s).__name__} {s!r}") from None
    if isinstance(s, str):
        if s in ("all", "none"):
            raise ValueError(f"Policy: round_after={s!r} stands alone, not inside a tuple of "
                             "selectors")
        if s not in _selector_ops() and s not in _PHASES:
            raise ValueError(f"Policy: round_after: unknown op {s!r}; valid op names: "
                             + ", ".join(sorted(_selector_ops()))
                             + "; phases of a gradient graph: " + ", ".join(_PHASES))
        return s
    if s < 0:
        raise ValueError(f"Policy: round_after: node index {s} is negative; node k is t{{k}} "
                         "in trace()'s listing (k >= 0)")
    return int(s)


def _normalise_round_after(ra: Any):
    if ra is None:
        return "none"
    if isinstance(ra, str):
        if ra in ("all", "none"):
            return ra
        return (_check_selector(ra),)
    if isinstance(ra, (bool, float, int)) or hasattr(ra, "__index__"):
        return (_check_selector(ra),)
    if not isinstance(ra, Iterable) or isinstance(ra, (bytes, dict)):
        raise TypeError("Policy: round_after must be 'all', 'none', an op name, a node index, "
                        f"or a sequence of op names and node indices, not {type(ra).__name__}")
    out: list = []
    for s in ra:
        s = _check_selector(s)
        if s not in out:
            out.append(s)
    return tuple(out) if out else "none"


def _fields_html(obj: Any, kind: str) -> str:
    """A small two-column HTML table of a Policy's or Math's fields (Jupyter's view)."""
    import html

    defaults = {"compute": "default (PyTorch's op-math)", "output": "default (each output's dtype)"}

    def fmt(name: str, v: Any) -> str:
        if v is None and name in defaults:
            return defaults[name]
        if isinstance(v, dtype):
            return v.name
        if isinstance(v, tuple):
            return ", ".join(str(x) for x in v) if v else "()"
        return str(v)

    rows = "".join(
        f"<tr><td style='padding:1px 8px;text-align:left;color:#555'>{html.escape(f.name)}</td>"
        f"<td style='padding:1px 8px;text-align:left'>{html.escape(fmt(f.name, getattr(obj, f.name)))}"
        "</td></tr>" for f in dataclasses.fields(obj))
    return ("<table style='border-collapse:collapse;font-family:monospace'>"
            f"<caption style='text-align:left'>castlab.{kind} <b>{html.escape(obj.name)}</b>"
            "</caption>" + rows + "</table>")


# What each named policy IS: the fields its name fixes (the others are free modifiers).
_NAMED_FIELDS: dict = {
    "eager": {"round_after": "all"},
    "fused": {"round_after": "none"},
    "fp64": {"round_after": "none", "compute": float64, "output": float64,
             "round_casts": False},
}


@dataclasses.dataclass(frozen=True)
class Policy:
    """Where a traced graph rounds values to a storage dtype.

    Named policies: ``"eager"`` rounds every op's result to its dtype (PyTorch eager);
    ``"fused"`` computes in op-math and rounds only the outputs (Inductor, Thunder,
    nvFuser); ``"fp64"`` widens inputs exactly, computes in fp64 and rounds nothing (the
    golden reference). A name is what the policy does: ``Policy("eager")`` is
    ``Policy.eager()``, and a field that contradicts the name is refused. Any other name
    labels a custom policy, which rounds after chosen nodes and/or computes in a chosen
    dtype.

    >>> cl.Policy("eager") == cl.Policy.eager()
    True
    >>> p = cl.Policy("custom", round_after=("silu",))            # round only silu's result
    >>> p = cl.Policy("custom", compute="float64", round_after="all")  # fp64 math, bf16 rounding
    >>> p.describe()
    'custom round_after=all compute=f64'

    Args:
        name: "eager", "fused", "fp64" (reserved: they fix round_after, and fp64 also
            compute, output and round_casts) or any other label for a custom policy.
        round_after: "all", "none", or node selectors: op names ("silu"), node
            indices: node k is ``t{k}`` in ``trace()``'s listing (``round_after=(2,)``
            rounds ``t2``), or, in a gradient graph, a phase: "forward" (the recomputed
            forward values, i.e. the saved activations) or "backward".
            ``round_after=("backward",)`` keeps saved activations in fp32 and rounds
            every backward op. Selectors are checked against the graph when it is lowered.
        compute: dtype to compute every op in, float32 or float64 (default: PyTorch's
            op-math, fp32 for bf16/fp16/fp8/fp32 and fp64 for fp64).
        output: floating dtype of the floating outputs (default: each output node's dtype).
        rounding: "nearest" (to even, default; alias "nearest_even"), "toward_zero" or
            "stochastic".
        seed: seed of stochastic rounding, an int in [0, 2**64) (same bits on every device).
        saturate: fp8 conversions clamp to the largest finite value (default) instead
            of producing NaN (e4m3fn) / Inf (e5m2).
        round_casts: whether explicit ``astype`` casts in the user's code round
            (default True; False mirrors fusers that elide down/up-cast pairs).
    """

    name: str = "fused"
    round_after: Any = _UNSET
    compute: dtype | None = None
    output: dtype | None = None
    rounding: str = "nearest"
    seed: int = 0
    saturate: bool = True
    round_casts: Any = _UNSET

    def __hash__(self) -> int:  # cached: policies are dictionary keys on every call
        return _cached_hash(self)

    def __post_init__(self):
        def put(field, value):
            object.__setattr__(self, field, value)

        if not isinstance(self.name, str):
            raise TypeError(f"Policy: name must be a str, not {type(self.name).__name__}")
        if not self.name:
            raise ValueError("Policy: name must not be empty (use 'eager', 'fused', 'fp64' "
                             "or a label of your own such as 'custom')")
        low = self.name.strip().lower()
        if low in _NAMED_FIELDS and low != self.name:
            raise ValueError(f"Policy: name {self.name!r} is too close to the reserved name "
                             f"{low!r}; write {low!r} for that policy or pick another label")
        # rounding: aliases normalised once
        r = _check_choice("Policy", "rounding", self.rounding,
                          tuple(_ROUNDING) + tuple(_ROUNDING_ALIASES))
        put("rounding", _ROUNDING_ALIASES.get(r, r))
        # seed
        seed = self.seed
        if isinstance(seed, bool) or not hasattr(seed, "__index__"):
            raise TypeError(f"Policy: seed must be an int in [0, 2**64), not "
                            f"{type(seed).__name__} {seed!r}")
        seed = operator.index(seed)
        if not 0 <= seed < 2**64:
            raise ValueError(f"Policy: seed must be in [0, 2**64), got {seed}")
        put("seed", seed)
        _check_bool("Policy", "saturate", self.saturate)
        if self.round_casts is not _UNSET:
            _check_bool("Policy", "round_casts", self.round_casts)
        # dtypes
        for field, valid in (("compute", ("float32", "float64")), ("output", None)):
            v = getattr(self, field)
            if v is None:
                continue
            try:
                d = as_dtype(v)
            except TypeError:
                if isinstance(v, str):
                    d = None
                else:
                    raise TypeError(f"Policy: {field} must be a dtype or a dtype name, not "
                                    f"{type(v).__name__} {v!r}") from None
            if d is None or (valid is not None and d.name not in valid) or (
                    valid is None and not d.is_floating_point):
                choices = ", ".join(valid) if valid else "a floating dtype (float64, float32, " \
                    "bfloat16, float16, float8_e4m3fn, float8_e5m2, ...)"
                raise ValueError(f"Policy: {field} dtype {v!r} is not valid; valid: {choices}")
            put(field, d)
        put("round_after", _normalise_round_after(self.round_after)
            if self.round_after is not _UNSET else _UNSET)
        # a reserved name is the named policy
        fixed = _NAMED_FIELDS.get(self.name)
        if fixed is not None:
            for field, value in fixed.items():
                given = getattr(self, field)
                if given is _UNSET or (given is None and field in ("compute", "output")):
                    put(field, value)
                elif given != value:
                    raise ValueError(
                        f"Policy: the name {self.name!r} is reserved: it means "
                        + ", ".join(f"{k}={v.name if isinstance(v, dtype) else v!r}"
                                    for k, v in fixed.items())
                        + f", and {field}={given.name if isinstance(given, dtype) else given!r}"
                        " contradicts it. For a custom policy, pick another name: "
                        f"Policy('custom', {field}=...)")
        if self.round_after is _UNSET:
            put("round_after", "none")
        if self.round_casts is _UNSET:
            put("round_casts", True)

    def check_graph(self, nodes: list) -> None:
        """Check the round_after selectors against a traced graph's nodes (``t{k}`` is
        ``nodes[k]``): every index must exist, and the op names must select something."""
        ra = self.round_after
        if isinstance(ra, str):
            return
        ops: list = []
        for n in nodes:
            for name in (n.op, n.attrs.get("phase")):
                if name is not None and (name in _selector_ops() or name in _PHASES) \
                        and name not in ops:
                    ops.append(name)
        count = len(nodes)

        def where() -> str:
            o = ", ".join(ops) if ops else "none"
            i = f"node indices 0-{count - 1}" if count else "no op nodes"
            return f"(ops in this graph: {o}; {i})"

        for s in ra:
            if not isinstance(s, str) and s >= count:
                raise ValueError(f"Policy: round_after: node index {s} out of range {where()}")
        # An op name absent from this graph is fine while another selector matches (one
        # policy may serve several chains: round after silu and mul, in SwiGLU and RoPE);
        # a policy whose op names all miss would silently round nothing.
        names = [s for s in ra if isinstance(s, str)]
        if names and len(names) == len(ra) and not any(s in ops for s in names):
            raise ValueError(f"Policy: round_after: unknown op {names[0]!r} {where()}")

    @staticmethod
    def eager(**kw) -> Policy:
        """Round after every op, as PyTorch eager."""
        return Policy("eager", **kw)

    @staticmethod
    def fused(**kw) -> Policy:
        """Compute in op-math, round only the outputs, as torch.compile/Thunder/nvFuser."""
        return Policy("fused", **kw)

    @staticmethod
    def fp64(**kw) -> Policy:
        """Golden reference: exact widening to fp64, fp64 math, fp64 outputs."""
        return Policy("fp64", **kw)

    @property
    def rounding_code(self) -> int:
        return _ROUNDING[self.rounding]

    def rounds_after(self, index: int, op: str, phase: str | None = None,
                     inner: bool = False) -> bool:
        """Does this policy round node t{index} (op `op`)? `phase`: "forward" or
        "backward" in a gradient graph; `inner`: the node is inside one of PyTorch's
        fused backward kernels that computes in op-math (silu_backward, ...), which
        rounds only its result: such a node is rounded only when selected by index."""
        ra = self.round_after
        if ra == "none":
            return False
        if inner:
            return ra != "all" and index in ra
        if ra == "all":
            return True
        return op in ra or index in ra or (phase is not None and phase in ra)

    def describe(self) -> str:
        parts = [self.name]
        if self.name not in ("eager", "fused", "fp64") or self.round_after not in ("all", "none"):
            parts.append(f"round_after={self.round_after}")
        if self.compute is not None and self.name != "fp64":
            parts.append(f"compute={self.compute.short}")
        if self.output is not None and self.name != "fp64":
            parts.append(f"output={self.output.short}")
        if self.rounding != "nearest":
            parts.append(f"rounding={self.rounding}" + (f"(seed={self.seed})" if self.rounding == "stochastic" else ""))
        if not self.round_casts and self.name != "fp64":
            parts.append("round_casts=False")
        return " ".join(parts)

    def _repr_html_(self) -> str:
        """Jupyter's view: a table of the fields.

        >>> "round_after" in cl.Policy("eager")._repr_html_()
        True
        """
        return _fields_html(self, "Policy")


_NAMED_POLICIES = {"eager": Policy.eager, "fused": Policy.fused, "fp64": Policy.fp64}
# One instance per name (policies are frozen): building and validating one took ~3 us,
# and a fresh one hashed again as a plan-cache key, on every `run(..., policy="fused")`.
_NAMED_POLICY_OBJECTS: dict = {}


def as_policy(p: Any) -> Policy:
    """A Policy from a Policy or a name ("eager", "fused", "fp64")."""
    if isinstance(p, Policy):
        return p
    if isinstance(p, str):
        pol = _NAMED_POLICY_OBJECTS.get(p)
        if pol is not None:
            return pol
        try:
            pol = _NAMED_POLICY_OBJECTS[p] = _NAMED_POLICIES[p]()
            return pol
        except KeyError:
            raise ValueError(f"unknown policy {p!r}; valid: "
                             + ", ".join(_NAMED_POLICIES) + " or a castlab.Policy(...)") from None
    raise TypeError(f"policy must be a name or castlab.Policy, not {type(p).__name__}")
