"""Speed of castlab.torch (issue 17): capture time of a Qwen2.5-0.5B-shaped HF Qwen2
(random init, bf16), a captured forward under each policy as a ratio to PyTorch's eager
forward of the same model, and the time of castlab.torch.drift.

    python benchmarks/bench_torch_capture.py                      # CPU, 2 layers, seq 32
    python benchmarks/bench_torch_capture.py --device cuda --layers 24 --seq 512 \\
        --vocab 151936 --drift none --json out.json               # the issue's GPU figures

Times are the median of `--repeat` calls after one warm-up call (which traces, lowers and,
on a GPU, compiles the kernels); GPU times are synchronised. Ratios < 1.5 are the issue's
target for every policy; drift over 24 layers at sequence 512 should take under a minute
on the H200 (`--drift none`: per-node errors only; `rounding`: also each node's share of
the output error, one rerun of the rest of the model per castlab node, much longer).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import castlab.torch as ct


def _model(layers: int, vocab: int, device: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=896, num_attention_heads=14, num_key_value_heads=2,
                      intermediate_size=4864, vocab_size=vocab, num_hidden_layers=layers,
                      max_position_embeddings=4096)
    cfg._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(cfg).to(torch.bfloat16).to(device).eval()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _median(f, repeat: int, device: str) -> float:
    f()
    _sync(device)
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        _sync(device)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=151936 // 16)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--drift", default="none", choices=["skip", "none", "rounding"])
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    m = _model(a.layers, a.vocab, a.device)
    ids = torch.randint(0, a.vocab, (1, a.seq), device=a.device)
    kw = {"use_cache": False}
    res: dict = {"device": a.device, "layers": a.layers, "seq": a.seq, "vocab": a.vocab}
    t0 = time.perf_counter()
    cm = ct.capture(m, ids, kwargs=kw)
    res["capture_s"] = time.perf_counter() - t0
    print(f"capture: {res['capture_s']:.2f} s  ({cm})")
    with torch.no_grad():
        base = _median(lambda: m(ids, **kw), a.repeat, a.device)
    res["torch_eager_s"] = base
    print(f"{'run':<24} {'seconds':>10} {'x torch eager':>14}")
    print(f"{'torch eager (bf16)':<24} {base:>10.4f} {1.0:>14.2f}")
    for pol, mth in (("eager", "torch_eager"), ("fused", "inductor"), ("fp64", "torch_eager")):
        t = _median(lambda pol=pol, mth=mth: cm.run(ids, kwargs=kw, policy=pol, math=mth),
                    a.repeat, a.device)
        res[f"{pol}_s"] = t
        print(f"{'castlab ' + pol + '/' + mth:<24} {t:>10.4f} {t / base:>14.2f}")
    if a.drift != "skip":
        t0 = time.perf_counter()
        ct.drift(cm, (ids,), a="eager", b="fused/inductor", kwargs=kw,
                 contributions=None if a.drift == "none" else a.drift)
        _sync(a.device)
        res[f"drift_{a.drift}_s"] = time.perf_counter() - t0
        print(f"drift (contributions={a.drift}): {res[f'drift_{a.drift}_s']:.1f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
