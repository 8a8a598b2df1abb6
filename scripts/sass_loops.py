"""The loops of a kernel's SASS and the instructions in each (issue 49: where castlab's
SoftMax.cu row kernel spends instructions beside torch's), from `nvdisasm -c` or
`cuobjdump -sass` text. No GPU needed: nvdisasm and cuobjdump come from PyPI
(`pip download nvidia-cuda-nvdisasm nvidia-cuda-cuobjdump`, unzip, `nvidia/cu13/bin`).

    # castlab's kernel: its source (_C._row_kernel_source), compiled as NVRTC does
    nvcc -arch=sm_90 -cubin --fmad=false -I. -std=c++17 -o k.cubin k.cu
    nvdisasm -c k.cubin > k.sass
    # torch's: the kernel's mangled name from `grep -a -o` on libtorch_cuda.so, then
    cuobjdump -sass -arch sm_90 -fun NAME libtorch_cuda.so > t.sass
    python scripts/sass_loops.py k.sass t.sass

A loop is a backward branch's range; its count is static (both sides of a branch inside
it), so read the path a vector word takes off the opcodes printed with it.
"""

from __future__ import annotations

import collections
import re
import sys

_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_TARGET = re.compile(r"BRA\s+(?:`\((\.L_x_\d+)\)|(0x[0-9a-f]+))")


def loops(text: str) -> tuple[int, list[tuple[int, int, collections.Counter]]]:
    """(instruction count, [(start, end, opcode counts)]) of one SASS listing."""
    ins, labels, pending = [], {}, []
    for line in text.splitlines():
        m = _LABEL.match(line.strip())
        if m:
            pending.append(m.group(1))
            continue
        m = _INSTR.match(line)
        if m:
            addr = int(m.group(1), 16)
            for p in pending:
                labels[p] = addr
            pending = []
            ins.append((addr, m.group(2)))
    index = {a: i for i, (a, _) in enumerate(ins)}
    found = []
    for i, (addr, text_) in enumerate(ins):
        m = _TARGET.search(text_)
        if not m:
            continue
        target = labels.get(m.group(1)) if m.group(1) else int(m.group(2), 16)
        if target is None or target > addr or target not in index:
            continue
        body = [t for _, t in ins[index[target]:i + 1]]
        ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", b).split()[0].split(".")[0]
                                  for b in body)
        found.append((target, addr, ops))
    return len(ins), found


def main() -> None:
    for path in sys.argv[1:]:
        with open(path) as f:
            total, found = loops(f.read())
        print(f"{path}: {total} instructions")
        for start, end, ops in found:
            top = ", ".join(f"{k} {v}" for k, v in ops.most_common(12))
            print(f"  loop {start:#06x}-{end:#06x}: {sum(ops.values()):4d}  {top}")


if __name__ == "__main__":
    main()
