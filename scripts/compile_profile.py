"""Which kernels make a cold GPU study slow: runs castlab.study.libraries (the cold
library matrix's work, swiglu and rope by default) in this process with an empty kernel
cache and CASTLAB_DEBUG=3 (every generated CUDA source goes to stderr, captured into a
file), then prints the longest NVRTC runs (castlab.cuda.compile_log) with the head of each
one's source, and writes them whole to --out.

Usage: python scripts/compile_profile.py [--ops swiglu,rope] [--top 6] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--ops", default="swiglu,rope")
ap.add_argument("--top", type=int, default=6)
ap.add_argument("--out", default="compile_profile_out")
a = ap.parse_args()
os.makedirs(a.out, exist_ok=True)
os.environ["CASTLAB_CACHE_DIR"] = tempfile.mkdtemp()
os.environ["CASTLAB_DEBUG"] = "3"
log_path = os.path.join(a.out, "sources.log")
err = os.dup(2)
with open(log_path, "w") as f:
    os.dup2(f.fileno(), 2)

    import castlab.cuda as cc  # noqa: E402
    from castlab.study import libraries  # noqa: E402

    ops = [o for op in a.ops.split(",") for o in (op, op + "_backward")]
    df = libraries(ops=ops, device="cuda")
    os.dup2(err, 2)
text = open(log_path).read()
sources = {m.group(1): m.group(2) for m in
           re.finditer(r"# castlab CUDA kernel (\S+)\n(.*?)(?=\n# castlab CUDA kernel |\Z)",
                       text, re.S)}
log = cc.compile_log()
print(cc._compile_profile(log, top=a.top))
for r in sorted(log, key=lambda r: r["start"] - r["end"])[:a.top]:
    src = sources.get(r["name"], "")
    with open(os.path.join(a.out, r["name"] + ".cu"), "w") as f:
        f.write(src)
    body = [ln for ln in src.splitlines() if ln.strip() and not ln.startswith("#include")]
    print(f"== {r['name']}: {r['end'] - r['start']:.2f} s, {r['source_chars']} chars")
    print("\n".join(body[:40]))
print("rows:", len(df), "timing:", df.attrs.get("timing", {}).get("warm_s"), file=sys.stderr)
