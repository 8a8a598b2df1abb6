"""The schedule of a lowered plan: what runs as one kernel, and in which launch shape.

Inductor's Triton tiles (``triton_config``: the order a Triton reduction accumulates in
follows from them), the GPU's multiprocessor count (Reduce.cuh sizes its grid by it),
the grouping of regions into Programs, and row fusion: reductions fused with the Programs
that compute their operands and the Program after them (``fuse_rows``: row steps).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from . import _C
from ._dtype import bfloat16, float16, float64
from ._graph import Node
from ._lower_steps import ProgramStep, ReduceStep, RowStep
from ._lower_views import _dtype_code
from ._optable import ORDER_CODE, REDUCE_ONLINE, REDUCE_OPS

# -- Inductor's Triton reductions --------------------------------------------------
#: (algo, row length, loaded element bytes) -> (R0_BLOCK, per thread, lanes, warps): a
#: configuration to use instead of triton_config's (a test or a study of another
#: autotuning outcome sets it).
TRITON_CONFIGS: dict = {}


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _loads_16bit_float(node: Node) -> bool:
    """Does the kernel computing this reduction hold a bf16/fp16 value (a 16-bit input it
    loads, or a cast to one): the elementwise nodes feeding it, up to the graph's inputs
    or another reduction? (Inductor's C++ tiles such a kernel by the 16-bit dtype:
    get_loop_body_lowp_fp.)"""
    seen: set = set()
    todo = list(node.inputs)
    while todo and len(seen) < 256:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if x.dtype in (bfloat16, float16):
            return True
        if x.op not in REDUCE_OPS:
            todo.extend(x.inputs)
    return False


def _read_lanes(node: Node, n: int | None) -> int | None:
    """The C++ lanes read from a compiled program for this reduction of n elements (by
    length where the program's node reduced with several widths), else None."""
    lanes = node.attrs.get("cpp_lanes")
    return lanes.get(n) if isinstance(lanes, dict) else lanes


def triton_config(algo: str | None, n: int, isz: int) -> tuple:
    """The tile of Inductor's Triton kernel for a row of `n` elements loaded as `isz`-byte
    values: (R0_BLOCK, contiguous elements per thread, lanes, warps) along the row, as
    torch 2.11's Inductor with Triton 3.6 chose them on an H200 (its heuristics, then its
    autotuning by time: another GPU or version may pick other tiles, and so another order;
    ``TRITON_CONFIGS`` overrides). Each thread holds up to 16 bytes of contiguous elements
    (Triton's coalescing), fewer when the tile has fewer.

    softmax: rows up to 4096 elements are one tile of the next power of two, on 2 warps
    with several rows per block up to 128 elements, else 8 warps, 16 from 8 KiB per tile
    (measured: bit for bit equal to torch.compile at 32 to 4096 elements, bf16, fp16 and
    fp32, except where Inductor autotuned to two tiles); longer rows loop over tiles of
    2048 on 16 warps (Inductor's only configuration above 32,768 elements, and one of the
    two it times between 4,096 and 32,768: docs/inductor_wide_rows.md 8; the tile its
    online softmax was read from, 4.5). Other sums (RMSNorm's): rows up to 1024 elements
    are one tile on 1 warp (``triton_per_``); longer rows loop over tiles of 4096 (16-bit
    rows of a multiple of 4096) or 2048 elements on 16 warps (``triton_red_``). A thread holds
    no more contiguous elements than the row length's largest power-of-two divisor (the
    rows' alignment, as Triton's coalescing pass reads it): one at an odd length (50,257)."""
    key = (algo, n, isz)
    if key in TRITON_CONFIGS:
        return tuple(TRITON_CONFIGS[key])
    if algo == "softmax":
        r = _pow2_at_least(max(n, 1)) if n <= 4096 else 2048
        if r <= 64:
            xblock, warps = 128, 2
        elif r <= 128:
            xblock, warps = 8, 2
        else:
            xblock, warps = 1, 16 if (r * isz >= 8192 or n > 4096) else 8
    elif n <= 1024:
        r, xblock, warps = _pow2_at_least(max(n, 1)), 1, 1
    else:
        r = 4096 if (isz == 2 and n % 4096 == 0) else 2048
        xblock, warps = 1, 16
    # Triton's coalescing gives a thread as many contiguous elements as the rows' start
    # is aligned to (row r starts r * n elements in)
    return triton_tile(r, xblock, warps, isz, vec=min(16 // isz, n & -n))


def triton_tile(r: int, xblock: int, warps: int, isz: int, vec: int | None = None) -> tuple:
    """(R0_BLOCK, contiguous elements per thread, lanes, warps) along the row of Triton's
    blocked layout for a tile of R0_BLOCK `r` by XBLOCK `xblock` on `warps` warps, for
    `isz`-byte elements: a tile Inductor chose (its ``.best_config``) in castlab's terms,
    for ``TRITON_CONFIGS``. `vec`: the elements per thread Triton's coalescing pass picks
    before the tile caps it (default: 16 bytes of `isz`-byte elements; see
    castlab._presets_norm for a kernel whose memory accesses disagree)."""
    per16 = max(1, vec if vec is not None else 16 // isz)
    per = max(1, min(per16, r, r * xblock // (32 * warps)))
    lanes = max(1, min(32, r // per))
    wr = max(1, min(warps, r // (per * lanes)))
    return (r, per, lanes, wr)


def num_sms(device) -> int:
    """Streaming multiprocessors of `device`'s GPU (Reduce.cuh sizes its grid by them);
    132 (H100/H200) when emulating on the CPU."""
    if not device.is_cuda:
        return 132
    return _C.cuda_sm_count(device.index or 0)


def program_groups(regs: list, stochastic: bool) -> list:
    """The regions (expr, output view, meta) of one Program each: regions of equal shape
    share one (RoPE's two halves, several outputs of one shape: one kernel that reads each
    input element once); under stochastic rounding each region has its own, since its
    random stream is indexed by the position in the Program's first output."""
    if stochastic:
        return [[r] for r in regs]
    groups: dict = {}
    for r in regs:
        groups.setdefault(tuple(r[0].shape), []).append(r)
    return list(groups.values())


# -- row steps: reductions fused with their prologues and epilogue ----------------
# SoftMax.cu's orders run fused as that kernel's own threads (ops/cuda/row_kernel.cpp
# torch_row_source: the row read from memory, any length). By default ("auto") the block
# kernel's forward (rows over 2048 elements: the vocabulary): on an H100 every length of
# tests/test_reduce_sweep_cuda.py fused equals torch eager (softmax and log_softmax, bf16,
# fp16 and fp32, last and inner dim), at 2.2-3.2x the speed of the separate steps
# (benchmarks/RESULTS.md). So does the persistent warp kernel's forward (rows up to 2,048
# elements; its lanes fold their values and combine by shuffles, kSoftmaxWarp), and the
# backward kernels' sums (the warp kernel up to 1,024 elements, cunn_SoftMaxBackward
# above): on an H100 the gradients of softmax and log_softmax fused and as separate steps
# both equal torch autograd at every length of tests/test_reduce_sweep_cuda.py's backward
# sweep (bf16, fp16, fp32; 2026-12-07), where the separate steps spent 1.8 ms of a
# [2097, 32000] backward in the generic reduce kernel (one thread a warp's part).
_FAST_ROW_MAX = {ORDER_CODE[o] for o in ("sequential", "pairwise", "torch_cpu", "triton")}
# by ReduceKind (the Welford moments: never measured fused, so not fused by default)
_FAST_ROW = {REDUCE_OPS["sum"]: {ORDER_CODE["pairwise"], ORDER_CODE["triton"]},
             REDUCE_OPS["amax"]: _FAST_ROW_MAX,
             REDUCE_OPS["amin"]: _FAST_ROW_MAX,
             REDUCE_ONLINE: {ORDER_CODE["triton"]}}


def _softmax_forward(spec: tuple) -> bool:
    """Is this reduce spec SoftMax.cu's block kernel forward (its sum or max)?"""
    return (spec[1] == ORDER_CODE["softmax_block"] and spec[0] <= REDUCE_OPS["amax"]
            and not spec[5])


def _softmax_backward(phases: list) -> bool:
    """Are these phases SoftMax.cu's backward sums (of dy * y, or of dy for log_softmax)
    in the warp or block kernel's order?"""
    orders = (ORDER_CODE["softmax_warp"], ORDER_CODE["softmax_block"])
    return all(ph.red.spec[0] == REDUCE_OPS["sum"] and ph.red.spec[1] in orders
               and (ph.red.spec[1] == orders[0] or ph.red.spec[5]) for ph in phases)


def _softmax_warp_forward(phases: list) -> bool:
    """Are these phases the persistent warp softmax's forward (its max, then its sum)?
    (The backward's phases are one sum.)"""
    warp = ORDER_CODE["softmax_warp"]
    return (len(phases) >= 2 and phases[0].red.spec[0] == REDUCE_OPS["amax"]
            and all(ph.red.spec[1] == warp and ph.red.spec[0] <= REDUCE_OPS["amax"]
                    for ph in phases))


def _rows_strides(t, rows: int, n: int) -> tuple | None:
    """(rs, cs) when the view `t` (of an index space of rows * n elements, the reduced
    dims last) places its element (r, j) at r * rs + j * cs, else None."""
    shape, st = tuple(t.shape), tuple(t._strides)
    total = 1
    for x in shape:
        total *= x
    if total != rows * n:  # another index space (a program beside the rows, not on them)
        return None
    for p in range(len(shape) + 1):
        lead = 1
        for x in shape[:p]:
            lead *= x
        if lead != rows:
            continue
        parts = []
        for dims in (range(p), range(p, len(shape))):
            live = [d for d in dims if shape[d] > 1]
            ok = all(st[a] == st[b] * shape[b] for a, b in zip(live, live[1:]))
            parts.append(st[live[-1]] if live else 0)
            if not ok:
                break
        else:
            return tuple(parts)
    return None


class _Phase(NamedTuple):
    """One reduction of a row step: the Program computing its operand (None: it reads a
    leaf), the leaves it reads, the reduce step and its row results."""

    prog: ProgramStep | None
    ins: list
    red: ReduceStep
    dst: Any


def fuse_rows(low, mode: bool | str) -> None:
    """Replace each run of reduce steps over the same [rows, n] rows (each with the
    Program computing the value it reduces) and the Program after them (the epilogue:
    RMSNorm's scaling, softmax's division) by one row step: one kernel per row on the
    GPU, row chunks that stay in cache on the CPU (ops/row_step.h). Same values, same
    order of accumulation: no bit changes. A run ends where a step would read a row result
    of the run other than its own row's, or does not fit the row layout. `low`: the
    Lowering whose steps these are; `mode`: castlab._lower.FUSE_ROWS ("auto": only
    where measured faster)."""
    steps = low.steps
    readers: dict = {}
    for st in steps:
        for leaf in st.leaves:
            readers[leaf.src] = readers.get(leaf.src, 0) + 1
    out, i = [], 0
    while i < len(steps):
        grp = _row_group(low, steps, i, readers, mode)
        if grp is None:
            out.append(steps[i])
            i += 1
            continue
        step, j, dropped = grp
        for k in dropped:  # prologue temporaries nothing reads any more
            low.temps[k] = ((0,), low.temps[k][1])
        for st in steps[i:j]:
            d = low.reduce_decisions.get(id(st))
            if d is not None:
                d.description += ("; fused with its prologue and epilogue: " +
                                  ("one kernel, thread blocks over the rows" if low.cuda
                                   else "row chunks kept in cache"))
        out.append(step)
        i = j
    low.steps = out


def _prologue(steps: list, j: int, readers: dict) -> bool:
    """Is step j a Program whose one output only the reduce step after it reads?"""
    st = steps[j]
    return (isinstance(st, ProgramStep) and j + 1 < len(steps)
            and isinstance(steps[j + 1], ReduceStep) and len(st.outs) == 1
            and st.outs[0].src == steps[j + 1].leaves[0].src and st.outs[0].src[0] == "tmp"
            and readers.get(st.outs[0].src) == 1)


def _row_group(low, steps: list, i: int, readers: dict, mode: bool | str):
    """(row step, end index, dropped temporaries) of the longest fusable run at i."""
    phases: list = []
    dropped: list = []
    qsrcs: set = set()
    rows = n = None
    j = i

    def rowable(ls: list) -> bool:
        for leaf in ls:
            rc = _rows_strides(leaf.t, rows, n)
            if rc is None:
                return False
            if leaf.src in qsrcs and (rc != (1, 0) or leaf.t._offset
                                      != low.temp_tensors[leaf.src[1]]._offset):
                return False
        return True

    while j < len(steps):
        st = steps[j]
        prog, red = None, None
        if isinstance(st, ReduceStep):
            red = st
        elif _prologue(steps, j, readers):
            prog, red = st, steps[j + 1]
        else:
            break
        src, dst = red.leaves[0], red.outs[0]
        if len(src.t.shape) != 2 or dst.src[0] != "tmp" or not src.t.is_contiguous():
            break  # (a GPU's columns: ops/cuda/reduce.cpp reads them a matrix row at a time)
        r, m = src.t.shape
        if r * m == 0 or (rows is not None and (r, m) != (rows, n)):
            break
        if phases and _dtype_code(dst.t) != _dtype_code(phases[0].dst.t):
            break  # one accumulator type per row step (var's CPU M2 is in double)
        rows, n = r, m
        ins = prog.leaves if prog else [src]
        if not rowable(ins):
            break
        phases.append(_Phase(prog, ins, red, dst))
        qsrcs.add(dst.src)
        if prog:
            dropped.append(st.outs[0].src[1])
        j += 2 if prog else 1
    if not phases:
        return None
    epi = None
    if j < len(steps) and isinstance(steps[j], ProgramStep):
        cand = steps[j]
        if all(_rows_strides(o.t, rows, n) is not None for o in cand.outs) and rowable(cand.leaves):
            epi = cand
    *head, leaves, outs = _row_spec(phases, epi, qsrcs, rows, n)
    spec = tuple(head)  # the 8 fields ops/row_step.h reads
    acc64 = _dtype_code(phases[0].dst.t) == float64.code
    if mode == "auto" and not (low.cuda and (
            _softmax_warp_forward(phases) or _softmax_backward(phases) or all(
            ph.red.spec[1] in _FAST_ROW.get(ph.red.spec[0], ()) or _softmax_forward(ph.red.spec)
            for ph in phases))):
        return None
    if low.cuda and not _C.row_kernel_fits(spec, acc64, low.device.index or 0):
        return None
    if low.cuda and any(REDUCE_OPS["moments_mean"] <= ph.red.spec[0] <= REDUCE_OPS["moments_m2"]
                        for ph in phases):
        return None  # Welford moments in a row kernel have not run on a GPU: kept apart
    end = j + (1 if epi else 0)
    return RowStep.make(leaves, outs, spec), end, dropped


def _row_spec(phases: list, epi: ProgramStep | None, qsrcs: set, rows: int, n: int) -> tuple:
    """The row step's spec (ops/row_step.h: rows, n, phases, epilogue, its leaves and
    outputs, the row and column strides of every operand), then its leaves and outputs."""
    leaves: list = []
    outs: list = []

    def operand(lst, leaf) -> int:
        key = (leaf.src, leaf.t._offset, tuple(leaf.t.shape), tuple(leaf.t._strides))
        for k, x in enumerate(lst):
            if (x.src, x.t._offset, tuple(x.t.shape), tuple(x.t._strides)) == key:
                return k
        lst.append(leaf)
        return len(lst) - 1

    spec_phases = []
    for ph in phases:
        idx = [operand(leaves, x) for x in ph.ins]
        spec_phases.append([ph.prog.program if ph.prog else None, idx, tuple(ph.red.spec),
                            ph.dst])
    epi_ins = [operand(leaves, x) for x in epi.leaves] if epi else []
    for sp in spec_phases:
        sp[3] = len(leaves) + operand(outs, sp[3])
    epi_outs = [len(leaves) + operand(outs, o) for o in epi.outs] if epi else []
    rs, cs = [], []
    for leaf in leaves + outs:
        if leaf.src in qsrcs and len(leaf.t.shape) == 1:
            a, b = 1, 0   # a row result written by the step
        else:
            a, b = _rows_strides(leaf.t, rows, n)
        rs.append(a)
        cs.append(b)
    return (rows, n, [tuple(p) for p in spec_phases], epi.program if epi else None, epi_ins,
            epi_outs, rs, cs, leaves, outs)


__all__ = ["TRITON_CONFIGS", "triton_config", "triton_tile", "num_sms", "program_groups",
           "fuse_rows"]
