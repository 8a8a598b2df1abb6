"""``castlab stacks``: one Hugging Face causal LM under two stacks (issue 52,
:func:`castlab.torch.compare_stacks`), from a ``config.json`` (random weights, seeded) or
a local model folder with safetensors weights, on random token ids (seeded).

castlab.torch needs PyTorch, and castlab's command line works without it: this module
loads castlab.torch (and transformers) only when the command runs (:func:`_torch_api`),
so ``castlab --help`` and the other commands never import torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import time
from typing import Any

from ._cli_files import _check_out, _refuse_old_results
from ._cli_parser import CLIError, _Run
from .study import _jsonable

#: The files ``castlab stacks`` writes into --out (the first two are its results).
STACKS_FILES = ("results.csv", "summary.json", "run.json", "layers.png", "logprob_hist.png")
#: The dtypes the model runs in.
STACKS_DTYPES = ("bfloat16", "float16", "float32")


def _torch_api() -> tuple:
    """(torch, castlab.torch, transformers), imported now: the command needs them, the
    rest of the CLI does not (castlab never imports torch for its other commands). The
    one castlab module loaded inside a function, declared in tests/test_layering.py's
    OPTIONAL_IMPORTS."""
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        raise CLIError("stacks: needs PyTorch (pip install 'castlab[torch]' or torch)") from None
    try:
        transformers = importlib.import_module("transformers")
    except ImportError:
        raise CLIError("stacks: needs transformers to build the model (pip install "
                       "transformers)") from None
    return torch, importlib.import_module("castlab.torch"), transformers


def _check_stack(flag: str, name: str, known: list) -> None:
    if name not in known:
        raise CLIError(f"stacks: {flag} {name!r}: unknown stack; known stacks: "
                       + ", ".join(known))


def _model_source(path: str) -> tuple[str, bool]:
    """(what to load from: the model folder when it holds safetensors weights, else its
    config.json; whether it holds weights) of --config (a config.json file or a model
    folder); a missing, unreadable or non-Hugging Face config is refused."""
    if not os.path.exists(path):
        raise CLIError(f"stacks: --config {path!r}: no such file or folder")
    if os.path.isdir(path):
        folder, cfg = path, os.path.join(path, "config.json")
        if not os.path.isfile(cfg):
            raise CLIError(f"stacks: --config {path!r}: the folder holds no config.json")
    else:
        folder, cfg = os.path.dirname(path) or ".", path
    try:
        with open(cfg) as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError) as e:
        raise CLIError(f"stacks: --config {cfg!r}: cannot read it: "
                       f"{getattr(e, 'strerror', None) or e}") from None
    except json.JSONDecodeError as e:
        raise CLIError(f"stacks: --config {cfg!r} is not valid JSON ({e})") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise CLIError(f"stacks: --config {cfg!r} is not a Hugging Face model config (no "
                       "model_type)")
    weights = os.path.isdir(path) and any(n.endswith(".safetensors") for n in os.listdir(path))
    return (folder if weights else cfg), weights


def _build_model(args: argparse.Namespace, torch: Any, transformers: Any) -> tuple:
    """(the model in --dtype on --device, in eval mode; its config; 'random weights,
    seed N' or 'safetensors weights'). Random weights are drawn after
    ``torch.manual_seed(--seed)``."""
    src, weights = _model_source(args.config)
    dtype = getattr(torch, args.dtype)
    try:
        cfg = transformers.AutoConfig.from_pretrained(src, local_files_only=True)
        if weights:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                src, config=cfg, local_files_only=True, use_safetensors=True)
            how = "safetensors weights"
        else:
            torch.manual_seed(args.seed)
            model = transformers.AutoModelForCausalLM.from_config(cfg)
            how = f"random weights, seed {args.seed}"
    except (ValueError, KeyError, OSError, TypeError, AttributeError) as e:
        raise CLIError(f"stacks: --config {args.config!r}: cannot build a causal LM: "
                       + " ".join(str(e).split())) from None
    vocab = getattr(cfg, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 1:
        raise CLIError(f"stacks: --config {args.config!r}: the model has no vocab_size, "
                       "which the random token ids need")
    limit = getattr(cfg, "max_position_embeddings", None)
    if isinstance(limit, int) and args.tokens > limit:
        raise CLIError(f"stacks: --tokens {args.tokens} exceeds the model's "
                       f"max_position_embeddings ({limit})")
    return model.to(device=args.device, dtype=dtype).eval(), cfg, how


def _inputs(args: argparse.Namespace, torch: Any, vocab: int) -> tuple:
    """(token ids, labels or None): --batch x --tokens uniform ids (and labels, with
    --labels) from a generator seeded with --seed."""
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, vocab, (args.batch, args.tokens), generator=g)
    labels = torch.randint(0, vocab, (args.batch, args.tokens), generator=g) \
        if args.labels else None
    return (ids.to(args.device), None if labels is None else labels.to(args.device))


def _device(args: argparse.Namespace, torch: Any) -> str:
    if args.device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        raise CLIError("stacks: --device cuda: PyTorch sees no usable CUDA GPU")
    return args.device


def _alignment_dict(al: Any) -> dict | None:
    if al is None:
        return None
    return {"summary": al.summary(), "sets": [list(s) for s in al.sets],
            "fields": list(al.fields), "inert": [list(x) for x in al.inert],
            "kl": al.kl, "err_b": al.err_b, "err_a": al.err_a, "all_equal": al.all_equal,
            "effects": [dict(dataclasses.asdict(e), verdict=e.verdict) for e in al.effects],
            "runs": al.runs, "pruned": al.pruned, "seconds": round(al.seconds, 3)}


def _token_frame(r: Any) -> Any:
    """The per-token table: batch and position instead of the logits' index."""
    df = r.to_frame("tokens")
    idx = df.pop("index")
    df.insert(0, "position", [i[-1] for i in idx])
    df.insert(0, "batch", [i[0] if len(i) > 1 else 0 for i in idx])
    return df


def _write(r: Any, args: argparse.Namespace, meta: dict, run: _Run) -> list[str]:
    """results.csv, summary.json and (unless --no-plots) the two plots; their paths."""
    out = args.out
    written = [os.path.join(out, "results.csv"), os.path.join(out, "summary.json")]
    _token_frame(r).to_csv(written[0], index=False)
    summary = dict(meta, a=r.a.name, b=r.b.name, label_source=r.label_source,
                   summary=r.summary, closer=r.closer(), first=r.first, layers=r.layers,
                   inert=r.inert, alignment=_alignment_dict(r.alignment),
                   elapsed_s=round(r.seconds, 3), run=run.record)
    with open(written[1], "w") as f:
        json.dump(_jsonable(summary), f, indent=2)
    if not args.no_plots:
        for name, fig in (("layers.png", r.plot_layers()),
                          ("logprob_hist.png", r.plot_logprob_hist())):
            written.append(os.path.join(out, name))
            fig.savefig(written[-1], dpi=110)
    return written


def cmd_stacks(args: argparse.Namespace) -> int:
    """``castlab stacks``: build the model, compare stacks --a and --b on it (with
    --align, align B to A), print the report and write its files to --out."""
    torch, ct, transformers = _torch_api()
    known = ct.stacks()
    _check_stack("--a", args.a, known)
    _check_stack("--b", args.b, known)
    requested = args.device
    args.device = _device(args, torch)
    _refuse_old_results(args.out, STACKS_FILES[:2], args.overwrite)
    _check_out(args.out, STACKS_FILES)
    model, cfg, how = _build_model(args, torch, transformers)
    config = {"config": args.config, "a": args.a, "b": args.b, "tokens": args.tokens,
              "batch": args.batch, "labels": bool(args.labels), "align": bool(args.align),
              "seed": args.seed, "dtype": args.dtype, "device": args.device,
              "weights": how, "out": args.out, "overwrite": bool(args.overwrite),
              "plots": not args.no_plots}
    run = _Run("stacks", args.device, requested, config, [args.seed], args.out)
    with run:
        ids, labels = _inputs(args, torch, cfg.vocab_size)
        name = type(model).__name__
        print(f"model: {name} from {args.config} ({how}), {args.dtype}, {args.batch} x "
              f"{args.tokens} tokens" + (", random labels" if labels is not None else ""),
              flush=True)
        t0 = time.perf_counter()
        try:
            r = ct.compare_stacks(model, ids, a=args.a, b=args.b, labels=labels,
                                  align=args.align)
        except ct.CaptureError as e:
            raise CLIError(f"stacks: cannot capture {name}: " + " ".join(str(e).split())) \
                from None
        print(r)
        meta = {"model": name, "config": args.config, "weights": how,
                "dtype": args.dtype, "device": args.device, "batch": args.batch,
                "tokens_per_row": args.tokens, "seed": args.seed}
        written = _write(r, args, meta, run)
        run.extra["tokens_scored"] = r.summary["tokens"]
    written.append(run.path)
    print("wrote " + ", ".join(written) + f"  ({time.perf_counter() - t0:.1f} s)")
    return 0
