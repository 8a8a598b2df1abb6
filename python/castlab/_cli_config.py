"""``castlab study --config FILE`` (TOML) and the study's settings from it and the command
line: chains, their inputs and shapes, and the checks of each value."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from typing import Any

from . import cuda, study
from ._cli_parser import _FLOAT_DTYPES, CLIError, _dtype_name, _one_of, _valid_presets, _warn
from .study import CHAINS, DEFAULT, QUICK

CONFIG_KEYS = {"chains", "dtypes", "policies", "math", "presets", "extra_presets", "rounding",
               "shapes", "seeds", "seed", "input", "scale", "device", "quick", "out", "grad",
               "attribute"}


_MAX_CONFIG_BYTES = 1 << 24


def load_config(path: str) -> dict:
    """Read a study TOML file; errors name the file and line."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            raise CLIError("reading --config needs Python 3.11+ or `pip install tomli`") from None
    if os.path.exists(path) and not os.path.isfile(path):  # a folder, /dev/zero, a FIFO
        raise CLIError(f"config file {path!r} is not a regular file")
    if os.path.isfile(path) and os.path.getsize(path) > _MAX_CONFIG_BYTES:
        raise CLIError(f"config file {path!r} is {os.path.getsize(path)} bytes; a study "
                       f"config is at most {_MAX_CONFIG_BYTES} bytes")
    try:
        with open(path, "rb") as f:
            cfg = tomllib.load(f)
    except FileNotFoundError:
        raise CLIError(f"config file {path!r} not found") from None
    except OSError as e:
        raise CLIError(f"cannot read config file {path!r}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise CLIError(f"{path}: invalid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise CLIError(f"{path}: invalid TOML: not UTF-8 text ({e.reason})") from None
    cfg = cfg.get("study", cfg)
    if not isinstance(cfg, dict):
        raise CLIError(f"{path}: [study] must be a table of settings")
    unknown = set(cfg) - CONFIG_KEYS
    if unknown:
        raise CLIError(f"{path}: unknown setting(s) {sorted(unknown)}; valid: "
                       + ", ".join(sorted(CONFIG_KEYS - {"presets"})))
    if "presets" in cfg:  # the old name of math (one release)
        if "math" in cfg:
            raise CLIError(f"{path}: math and presets (its old name) both give the math "
                           "presets: give math")
        _warn(f"{path}: presets is deprecated; use math")
        cfg["math"] = cfg.pop("presets")
    return cfg


def _form(chain: str) -> str:
    return f"{chain}=" + "x".join(str(d) for d in CHAINS[chain].default_shape)


def _shape_entries(items: list[str] | None) -> list[tuple[str, str | None, tuple]]:
    """--shape values as (the value, its key or None, dims): ``AxB`` (every chain),
    ``KEY=AxB`` (a chain, an input name or CHAIN.NAME: told apart once the chains are
    known, by ``_apply_shapes``)."""
    out = []
    for it in items or []:
        k, eq, v = it.rpartition("=")
        key = k.strip() if eq else None
        if eq and not key:
            raise CLIError(f"--shape {it!r}: nothing before '='; expected AxB, CHAIN=AxB, "
                           "NAME=AxB or CHAIN.NAME=AxB (e.g. swiglu=1024x2048, x=4x4096)")
        if not eq and (v.strip() in CHAINS or ":" in v):
            name = v.strip()
            raise CLIError(f"--shape {it!r} names a chain but no shape: write CHAIN=AxB, e.g. "
                           + (_form(name) if name in CHAINS else f"{name}=64x4096"))
        form = _form(key) if key in CHAINS else f"{key}=64x4096" if key else "64x4096"
        try:
            dims = tuple(int(x) for x in v.strip().lower().split("x"))
        except ValueError:
            raise CLIError(f"--shape {it!r}: bad shape {v!r}" + (f" for {key}" if key else "")
                           + f": expected positive integers joined by 'x', e.g. {form}") from None
        out.append((it, key, dims))
    return out


def _chain_key(key: str, names: list[str]) -> bool:
    """Whether a --shape key names a chain: one of this study's, a built-in, or a
    pkg.module:function / path/file.py:function spec (a ':' with no '.' after it)."""
    return key in names or key in CHAINS or (":" in key and "." not in key.rsplit(":", 1)[1])


def _checked_shape_of(ch: Any, dims: tuple, where: str) -> tuple:
    try:
        return study._check_chain_shape(ch, dims)
    except (TypeError, ValueError) as e:
        raise CLIError(f"{where}: {e}") from None


def _apply_shapes(chains: list, shapes: dict, items: list[str] | None) -> tuple[list, dict]:
    """Apply the --shape values to the study's chains (Chain objects): the chains (a
    pkg.module:function chain given per-input shapes gets Input specs) and the shapes
    per chain name. The most specific value wins: CHAIN.NAME, then NAME, then CHAIN,
    then a bare shape. A built-in chain's shape is its first input's (x)."""
    entries = _shape_entries(items)
    if not entries:
        return chains, shapes
    names = [ch.name for ch in chains]
    params = {ch.name: study.input_names(ch) for ch in chains}
    bare, per_chain, per_name, per_input = None, {}, {}, {}
    for it, key, dims in entries:
        if key is None:
            bare = (it, dims)
        elif _chain_key(key, names):
            if key not in names and key not in CHAINS:
                raise CLIError(f"--shape {it!r}: chain {key!r} is not in this study (chains: "
                               + ", ".join(names) + ")")
            if key not in names:  # a built-in not studied: checked, as before, not used
                _checked_shape(key, dims, f"--shape {it!r}")
                continue
            per_chain[key] = (it, dims)
        elif "." in key and _chain_key(key.rsplit(".", 1)[0], names):
            cname, iname = key.rsplit(".", 1)
            if cname not in names:
                raise CLIError(f"--shape {it!r}: chain {cname!r} is not in this study "
                               "(chains: " + ", ".join(names) + ")")
            if iname not in params[cname]:
                raise CLIError(f"--shape {it!r}: chain {cname!r} has no input {iname!r}; its "
                               "inputs: " + ", ".join(params[cname]))
            per_input[(cname, iname)] = (it, dims)
        else:
            if not any(key in ps for ps in params.values()):
                raise CLIError(f"--shape {it!r}: unknown chain or input name {key!r}; this "
                               "study's chains and their inputs: " + "; ".join(
                                   f"{n}({', '.join(ps)})" for n, ps in params.items()))
            per_name[key] = (it, dims)
    shapes = dict(shapes or {})
    out = []
    for ch in chains:
        ps = params[ch.name]

        def given(i: int, ps=ps, ch=ch):
            return per_input.get((ch.name, ps[i])) or per_name.get(ps[i])

        whole = per_chain.get(ch.name) or bare
        if study._is_builtin(ch):  # one shape, its first input's; the others follow it
            for i in range(1, len(ps)):
                if (ch.name, ps[i]) in per_input:
                    it = per_input[(ch.name, ps[i])][0]
                    raise CLIError(f"--shape {it!r}: {ch.name}'s input {ps[i]!r} is made from "
                                   f"its {ps[0]!r}; give --shape {ch.name}.{ps[0]}=... or "
                                   f"--shape {ch.name}=...")
            pick = given(0) or whole
            if pick is not None:
                where = f"--shape {pick[0]!r}"
                if (ch.name, ps[0]) not in per_input and pick is per_name.get(ps[0]):
                    where += (f" (it gives every chain's input {ps[0]!r}; --shape "
                              f"{ch.name}.{ps[0]}=... gives {ch.name}'s alone)")
                shapes[ch.name] = _checked_shape_of(ch, pick[1], where)
            out.append(ch)
            continue
        if whole is not None:
            shapes[ch.name] = _checked_shape_of(ch, whole[1], f"--shape {whole[0]!r}")
        named = {i: given(i) for i in range(len(ps)) if given(i) is not None}
        if not named:
            out.append(ch)
            continue
        for it, dims in named.values():
            _checked_shape_of(ch, dims, f"--shape {it!r}")
        if ch.inputs is not None:  # specs from --config: the named inputs get new shapes
            specs = list(ch.inputs)
            for i, (it, dims) in named.items():
                if specs[i].fixed:
                    raise CLIError(f"--shape {it!r}: input {ps[i]!r} of chain {ch.name!r} is "
                                   "read from a file or given as a tensor; its shape is the "
                                   "file's")
                specs[i] = dataclasses.replace(specs[i], shape=tuple(dims))
        else:
            specs = []
            for i, n in enumerate(ps):
                dims = named[i][1] if i in named else (whole[1] if whole else None)
                if dims is None:
                    raise CLIError(f"--shape: input {n!r} of chain {ch.name!r} has no shape; "
                                   f"give --shape {n}=AxB, --shape {ch.name}.{n}=AxB or "
                                   f"--shape {ch.name}=AxB (every input)")
                specs.append(study.Input(shape=tuple(dims)))
        out.append(study.chain(ch, inputs=specs))
    return out, shapes


def _checked_shape(chain: str, dims: Any, where: str) -> tuple:
    try:
        if chain not in CHAINS and ":" in chain:
            return study._check_dims(dims, f"shape for {chain}")
        return study.check_shape(chain, dims)
    except (TypeError, ValueError) as e:
        raise CLIError(f"{where}: {e}") from None


CHAIN_KEYS = ("chain", "name", "shape", "inputs")


INPUT_KEYS = ("shape", "dtype", "distribution", "scale", "file", "key")


def _config_chains(items: list, path: str) -> tuple[list, dict]:
    """The chains of a config file (names, specs or tables with per-input specs) as
    ``study.run`` takes them, and the shapes the tables give."""
    base = os.path.dirname(os.path.abspath(path))
    chains: list = []
    shapes: dict = {}
    for i, it in enumerate(items):
        where = f"{path}: chains[{i}]"
        if isinstance(it, str):
            chains.append(_resolve_chain(it, where, base))
            continue
        if not isinstance(it, dict):
            raise CLIError(f"{where} must be a chain name or a table like "
                           f'{{ chain = "pkg.module:function", inputs = [...] }}, got {it!r}')
        unknown = sorted(set(it) - set(CHAIN_KEYS))
        if unknown:
            raise CLIError(f"{where}: unknown key(s) {unknown}; valid: " + ", ".join(CHAIN_KEYS))
        spec = it.get("chain")
        if not isinstance(spec, str) or not spec:
            raise CLIError(f'{where}.chain must be a string: a built-in name or '
                           f'"pkg.module:function", got {spec!r}')
        name = it.get("name")
        if name is not None and (not isinstance(name, str) or not name):
            raise CLIError(f"{where}.name must be a non-empty string, got {name!r}")
        ins = it.get("inputs")
        specs = None
        if ins is not None:
            if not isinstance(ins, list) or not ins:
                raise CLIError(f"{where}.inputs must be a non-empty list of tables, e.g. "
                               "[{ shape = [64, 4096] }, { file = \"x.npy\" }], got "
                               f"{ins!r}")
            specs = [_config_input(x, f"{where}.inputs[{j}]", base) for j, x in enumerate(ins)]
        try:
            ch = study.chain(spec if spec in CHAINS else _resolve_chain(spec, where, base),
                             inputs=specs, name=name)
        except (TypeError, ValueError) as e:
            raise CLIError(f"{where}: {e}") from None
        if "shape" in it:
            shp = it["shape"]
            if ch.name in CHAINS and ch.make_inputs is not None:
                shapes[ch.name] = _checked_shape(ch.name, shp, f"{where}.shape")
            else:
                try:
                    shapes[ch.name] = study._check_dims(shp, f"{where}.shape")
                except (TypeError, ValueError) as e:
                    raise CLIError(f"{e} (expected a list of positive integers, e.g. "
                                   "[64, 4096])") from None
        chains.append(ch)
    return chains, shapes


def _config_input(x: Any, where: str, base: str) -> Any:
    if not isinstance(x, dict):
        raise CLIError(f"{where} must be a table like {{ shape = [64, 4096], dtype = "
                       f'"float32" }} or {{ file = "x.npy" }}, got {x!r}')
    unknown = sorted(set(x) - set(INPUT_KEYS))
    if unknown:
        raise CLIError(f"{where}: unknown key(s) {unknown}; valid: " + ", ".join(INPUT_KEYS))
    kw = dict(x)
    if "shape" in kw:
        shp = kw["shape"]
        if not isinstance(shp, list) or not shp or not all(
                isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shp):
            raise CLIError(f"{where}.shape must be a list of positive integers, e.g. "
                           f"[64, 4096], got {shp!r}")
        kw["shape"] = tuple(shp)
    if "dtype" in kw:
        kw["dtype"] = _dtype_name(kw["dtype"])
        _one_of(f"{where}.dtype", kw["dtype"], _FLOAT_DTYPES)
    if "distribution" in kw:
        _one_of(f"{where}.distribution", kw["distribution"], study.DISTRIBUTIONS)
    if "scale" in kw:
        sc = kw["scale"]
        if (isinstance(sc, bool) or not isinstance(sc, (int, float)) or not math.isfinite(sc)
                or sc <= 0):
            raise CLIError(f"{where}.scale must be a positive finite number, e.g. 2.0, got "
                           f"{sc!r}")
    for k in ("file", "key"):
        if k in kw and (not isinstance(kw[k], str) or not kw[k]):
            raise CLIError(f"{where}.{k} must be a non-empty string, got {kw[k]!r}")
    if "file" in kw:
        f = kw["file"]
        kw["file"] = f if os.path.isabs(f) else os.path.normpath(os.path.join(base, f))
    try:  # a file is read from its resolved path, named as written
        return study.Input(label=x.get("file"), **kw)
    except (TypeError, ValueError) as e:
        raise CLIError(f"{where}: {e}") from None


def _resolve_chain(spec: str, where: str, base: str | None = None) -> Any:
    if spec in CHAINS:
        return spec
    try:
        return study.chain(spec, base=base)
    except (TypeError, ValueError) as e:
        raise CLIError(f"{where}: {e}" if where else str(e)) from None


def _study_settings(args: argparse.Namespace) -> dict:
    """The study's settings: the defaults, then the config file, then the command line
    (the math presets under "math", chains as Chain objects with --shape applied)."""
    st: dict[str, Any] = dict(QUICK if args.quick else DEFAULT)
    st["math"] = st.pop("presets")
    st["quick"] = bool(args.quick)
    st["out"] = "castlab-study"
    if args.config is not None:  # (--config '' names no file: refused, not ignored)
        if not args.config.strip():
            raise CLIError("--config needs a TOML file, got an empty name")
        cfg = load_config(args.config)
        if "shapes" in cfg:
            if not isinstance(cfg["shapes"], dict):
                raise CLIError(f"{args.config}: shapes must be a table, e.g. "
                               "shapes = { swiglu = [1024, 2048] }")
            cfg["shapes"] = {k: _checked_shape(k, v, f"{args.config}: shapes.{k}")
                             for k, v in cfg["shapes"].items()}
        if "seed" in cfg:
            cfg["seeds"] = [cfg.pop("seed")]
        if "extra_presets" in cfg and isinstance(cfg["extra_presets"], list):
            cfg["extra_presets"] = {"swiglu": cfg["extra_presets"]}
        if "out" in cfg and not isinstance(cfg["out"], str):
            raise CLIError(f"{args.config}: out must be a string (a folder), got {cfg['out']!r}")
        if "scale" in cfg:
            try:
                cfg["scale"] = study.check_scale(cfg["scale"])
            except (TypeError, ValueError) as e:
                raise CLIError(f"{args.config}: {e}") from None
        for key in ("chains", "dtypes", "policies", "math", "rounding", "seeds"):
            if key in cfg and (not isinstance(cfg[key], list) or not cfg[key]):
                raise CLIError(f"{args.config}: {key} must be a non-empty list, got {cfg[key]!r}")
        for key in ("quick", "grad", "attribute"):
            if key in cfg and not isinstance(cfg[key], bool):
                raise CLIError(f"{args.config}: {key} must be true or false, got {cfg[key]!r}")
        valid = {"dtypes": _FLOAT_DTYPES, "policies": ("eager", "fused", "fp64"),
                 "math": tuple(_valid_presets()),
                 "rounding": ("nearest", "toward_zero", "stochastic")}
        if "dtypes" in cfg:
            cfg["dtypes"] = [_dtype_name(v) for v in cfg["dtypes"]]
        for key, ok in valid.items():
            for j, v in enumerate(cfg.get(key, [])):
                _one_of(f"{args.config}: {key}[{j}]", v, ok)
        for j, v in enumerate(cfg.get("seeds", [])):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**64:
                raise CLIError(f"{args.config}: seeds[{j}] must be an integer in [0, 2**64), "
                               f"got {v!r}")
        if "input" in cfg:
            _one_of(f"{args.config}: input", cfg["input"], study.DISTRIBUTIONS)
        if "extra_presets" in cfg:
            ep = cfg["extra_presets"]
            if not isinstance(ep, dict) or not all(
                    isinstance(v, list) and all(m in _valid_presets() for m in v)
                    for v in ep.values()):
                raise CLIError(f"{args.config}: extra_presets must be a list of presets "
                               "(for swiglu) or a table { chain = [presets] }, e.g. "
                               f'extra_presets = ["inductor"], got {ep!r}')
        if "chains" in cfg:
            cfg["chains"], cshapes = _config_chains(cfg["chains"], args.config)
            if cshapes:
                cfg["shapes"] = dict(cfg.get("shapes") or {}, **cshapes)
        st.update(cfg)
    if args.out is not None:  # an explicit --out wins over the config file
        st["out"] = args.out
    for key in ("chains", "dtypes", "policies", "math", "rounding", "input", "scale",
                "device", "seeds"):
        v = getattr(args, key)
        if v is not None:
            st[key] = v
    st["grad"] = bool(args.grad or st.get("grad", False))
    st["attribute"] = bool(args.attribute or st.get("attribute", False))
    if args.extra_presets is not None:
        st["extra_presets"] = {"swiglu": list(args.extra_presets)}
    _shape_entries(args.shape)  # a malformed --shape is refused before any chain is imported
    chains = [_resolve_chain(c, "--chains" if args.chains else "") if isinstance(c, str)
              else c for c in st["chains"]]
    st["chains"], st["shapes"] = _apply_shapes([study.chain(c) for c in chains],
                                               st.get("shapes"), args.shape)
    for s in st["seeds"]:
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2**64:
            raise CLIError(f"seed {s!r} is out of range: seeds are integers in [0, 2**64)")
    dev = st.get("device")
    if dev not in (None, "cpu", "cuda"):
        raise CLIError(f"unknown device {dev!r}; valid: cpu, cuda")
    if dev == "cuda":
        try:
            ok = cuda.is_available()
            why = "" if ok else cuda.unavailable_reason()
        except Exception as e:  # noqa: BLE001
            ok, why = False, str(e)
        if not ok:
            raise CLIError(f"--device cuda: no usable GPU ({why})")
    return st
