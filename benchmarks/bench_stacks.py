"""compare_stacks and align=True on 2-layer models (issue 52's CPU goal: align on a
2-layer model in under 10 minutes on 2 CPU cores; on an H200, a 24-layer
Qwen2.5-0.5B-shaped model in under 60 s and the plain comparison in under 10 s).

    PYTHONPATH=$PWD/python python benchmarks/bench_stacks.py [--device cpu|cuda]
        [--layers 2] [--hidden 256|896] [--vocab 4096|151936] [--tokens 128] [--json FILE]

Random weights, bf16, Qwen2-shaped (head dim 64 at hidden 896, else 32). Prints the capture,
the plain comparison and the aligned comparison's wall times, the alignment's runs, and
each time's ratio to its goal (above 1: within the goal)."""

from __future__ import annotations

import argparse
import json
import time

import torch
import transformers

import castlab.torch as ct

GOALS = {"cpu": {"align": 600.0}, "cuda": {"align": 60.0, "compare": 10.0}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=None,
                    help="MLP width (default: Qwen2.5-0.5B's 4864 at hidden 896, else 3x hidden)")
    ap.add_argument("--pairs", default="liger:hf_eager,vllm:torch_compile")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    heads = a.hidden // (64 if a.hidden >= 896 else 32)
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(hidden_size=a.hidden, num_attention_heads=heads,
                                   num_key_value_heads=2,
                                   intermediate_size=a.intermediate or (
                                       4864 if a.hidden == 896 else 3 * a.hidden),
                                   vocab_size=a.vocab, num_hidden_layers=a.layers,
                                   head_dim=a.hidden // heads)
    cfg._attn_implementation = "sdpa"
    m = transformers.Qwen2ForCausalLM(cfg).bfloat16().to(a.device).eval()
    ids = torch.randint(0, a.vocab, (1, a.tokens), device=a.device)
    t = time.perf_counter()
    cm = ct.capture(m, ids, kwargs={"use_cache": False})
    cap = time.perf_counter() - t
    print(f"Qwen2-shaped, {a.layers} layers, hidden {a.hidden}, vocab {a.vocab}, {a.tokens} "
          f"tokens, bf16, {a.device} (torch {torch.__version__}): capture {cap:.1f} s")
    goals = GOALS["cuda" if a.device.startswith("cuda") else "cpu"]
    rows = []
    for pair in a.pairs.split(","):
        sa, sb = pair.split(":")
        t = time.perf_counter()
        ct.compare_stacks(cm, ids, a=sa, b=sb, kwargs={"use_cache": False})
        plain = time.perf_counter() - t
        t = time.perf_counter()
        r = ct.compare_stacks(cm, ids, a=sa, b=sb, align=True, kwargs={"use_cache": False})
        aligned = time.perf_counter() - t
        row = {"a": sa, "b": sb, "compare_s": plain, "align_s": aligned,
               "runs": r.alignment.runs, "pruned": r.alignment.pruned,
               "align_goal_ratio": goals["align"] / aligned}
        line = (f"{sa} vs {sb}: compare {plain:.1f} s, compare + align {aligned:.1f} s "
                f"({r.alignment.runs} runs, {r.alignment.pruned} pruned); align goal "
                f"{goals['align']:.0f} s / time = {row['align_goal_ratio']:.2f}")
        if "compare" in goals:
            row["compare_goal_ratio"] = goals["compare"] / plain
            line += f"; compare goal {goals['compare']:.0f} s / time = {row['compare_goal_ratio']:.2f}"
        print(line, flush=True)
        rows.append(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"capture_s": cap, "rows": rows, "args": vars(a)}, f, indent=1)


if __name__ == "__main__":
    main()
