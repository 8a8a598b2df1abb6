"""Attention as the model calls it eagerly: undo what tracing does to SDPA.

Hugging Face attention (and code written like it) calls
``scaled_dot_product_attention`` differently when it is traced: eagerly it passes no mask
and ``is_causal=True`` (with the grouped K/V heads and ``enable_gqa=True`` where its
version supports that); under ``torch.export`` and ``torch.compile`` it cannot ask whether
the mask may be skipped (that question reads tensor values), so it builds the causal mask
explicitly and repeats K/V per query head (``repeat_kv``: unsqueeze, expand, reshape). The
results are the same numbers, but on a GPU the two calls run other kernels, whose bits
differ: the captured graph is not the program the model runs eagerly.

:func:`eager_sdpa_rewrites` finds the SDPA calls of a captured graph whose mask is a
constant causal mask (no user input reaches it, and its value on the example inputs is
the lower triangle) and lists the eager calls they may stand for: the grouped K/V with
``enable_gqa=True`` (where K/V are ``repeat_kv``'d), then the repeated K/V with
``is_causal=True``. ``capture`` keeps the first that makes PyTorch running the graph give
the model's eager outputs bit for bit on the example inputs, and none when none does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx.operator_schemas import normalize_function

SDPA = "aten.scaled_dot_product_attention.default"
_RESHAPES = ("aten.reshape.default", "aten.view.default", "aten._unsafe_view.default",
             "aten.clone.default")


def _shape(n: Any) -> tuple | None:
    v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def _bound(n: torch.fx.Node) -> dict | None:
    pair = normalize_function(n.target, n.args, n.kwargs, normalize_to_only_use_kwargs=True)
    return None if pair is None else dict(pair.kwargs)


def _unrepeated(x: Any) -> tuple:
    """``(source, n_rep)`` when FX node `x` is `source` [B, Hkv, L, D] repeated `n_rep`
    times per head as ``repeat_kv`` does (unsqueeze(2) -> expand -> reshape, possibly
    through a clone); ``(x, 1)`` otherwise."""
    want = _shape(x)
    y = x
    while isinstance(y, torch.fx.Node) and str(y.target) in _RESHAPES:
        y = y.args[0]
    if not (isinstance(y, torch.fx.Node) and str(y.target) == "aten.expand.default"):
        return x, 1
    u = y.args[0]
    if not (isinstance(u, torch.fx.Node) and str(u.target) == "aten.unsqueeze.default"
            and u.args[1] in (2, -3)):
        return x, 1
    src = u.args[0]
    s, e = _shape(src), _shape(y)
    if (want is None or s is None or e is None or len(s) != 4 or len(e) != 5
            or e[:2] != s[:2] or e[3:] != s[2:] or want != (s[0], s[1] * e[2], s[2], s[3])):
        return x, 1
    return src, e[2]


def _reaches(n: torch.fx.Node, names: set) -> bool:
    """Whether any placeholder in `names` is an ancestor of `n`."""
    seen, todo = set(), [n]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        if m.op == "placeholder" and m.name in names:
            return True
        todo.extend(m.all_input_nodes)
    return False


def sdpa_sites(nodes: list, user: set) -> list:
    """The SDPA calls that may be a traced ``is_causal`` call: a mask no user input
    reaches, no dropout, query length = key length > 1. One dict each: ``node``, the
    bound arguments ``args``, the K/V sources and repeat counts ``k0, kn, v0, vn``, the
    query ``length``."""
    sites = []
    for n in nodes:
        if n.op != "call_function" or str(n.target) != SDPA:
            continue
        b = _bound(n)
        if b is None or not isinstance(b.get("attn_mask"), torch.fx.Node):
            continue
        if b.get("is_causal") or b.get("enable_gqa") or b.get("dropout_p", 0.0) != 0.0:
            continue
        q, k = _shape(b["query"]), _shape(b["key"])
        if q is None or k is None or len(q) != 4 or q[-2] != k[-2] or q[-2] < 2:
            continue
        if _reaches(b["attn_mask"], user):
            continue
        k0, kn = _unrepeated(b["key"])
        v0, vn = _unrepeated(b["value"])
        sites.append({"node": n, "args": b, "k0": k0, "kn": kn, "v0": v0, "vn": vn,
                      "length": q[-2]})
    return sites


def is_causal_mask(m: Any, length: int) -> bool:
    """Whether mask value `m` (bool, or floating with 0 and -inf/the dtype's lowest
    where masked) lets query i see keys 0..i exactly, for every batch and head."""
    if not isinstance(m, torch.Tensor) or m.dim() < 2 or tuple(m.shape[-2:]) != (length, length):
        return False
    tril = torch.ones(length, length, dtype=torch.bool, device=m.device).tril()
    if m.dtype == torch.bool:
        return bool(torch.equal(m, tril.expand(m.shape)))
    if not m.is_floating_point():
        return False
    seen = m == 0
    hidden = m <= torch.finfo(m.dtype).min
    return bool(torch.equal(seen, tril.expand(m.shape)) and torch.equal(hidden, ~seen))


def candidates(sites: list, masks: dict) -> list:
    """The eager calls the causal `sites` may stand for, most likely first: each
    ``(calls, description)``, `calls` a list of ``(node, args, kwargs)``. `masks`: the
    mask values on the example inputs, by mask node name."""
    causal = [s for s in sites
              if is_causal_mask(masks.get(s["args"]["attn_mask"].name), s["length"])]
    if not causal:
        return []

    def call(s, k, v, gqa):
        a = s["args"]
        kw = {"dropout_p": 0.0, "is_causal": True, "scale": a.get("scale")}
        if gqa:
            kw["enable_gqa"] = True
        return (s["node"], (a["query"], k, v), kw)

    out = []
    if all(s["kn"] > 1 and s["kn"] == s["vn"] for s in causal):
        out.append(([call(s, s["k0"], s["v0"], True) for s in causal],
                    "is_causal=True on the grouped K/V heads (enable_gqa=True), no mask "
                    "(traced: an explicit causal mask, K/V repeated per head)"))
    out.append(([call(s, s["args"]["key"], s["args"]["value"], False) for s in causal],
                "is_causal=True, no mask (traced: an explicit causal mask)"))
    return out


def apply(calls: list) -> list:
    """Set each SDPA node's arguments to a candidate's; returns the calls that undo it."""
    undo = []
    for n, args, kwargs in calls:
        undo.append((n, n.args, n.kwargs))
        n.args, n.kwargs = args, kwargs
    return undo[::-1]


def drop_dead(graph: torch.fx.Graph, skip: tuple) -> None:
    """Erase the nodes no output needs any more (the masks and repeats a rewrite left
    behind), with the shape assertions (`skip` ops) on them."""
    live: set = set()
    order = list(graph.nodes)
    for n in reversed(order):
        if n.op in ("output", "placeholder") or n in live:
            live.add(n)
            live.update(n.all_input_nodes)
        elif n.op == "call_function" and str(n.target) not in skip and n.is_impure():
            live.add(n)
            live.update(n.all_input_nodes)
    for n in order:  # an assertion stays with the value it checks
        if str(n.target) in skip and all(a in live for a in n.all_input_nodes):
            live.add(n)
    for n in reversed(order):
        if n not in live:
            graph.erase_node(n)
