"""``castlab stacks`` (issue 52): one Hugging Face causal LM under two stacks from the
command line, on the tiny Llama config the README ships (examples/tiny_llama/config.json:
2 layers, hidden 64, vocabulary 128), a few tokens, on the CPU: the files it writes, its
one-line errors, and its place in ``castlab --help``."""

from __future__ import annotations

import json
import pathlib
import re

import pandas as pd
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_cli_vocabulary import _main, _refused  # noqa: E402

import castlab.torch as ct  # noqa: E402
from castlab import _cli_parser, cli  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tiny_llama" / "config.json"
FAST = ["--tokens", "8", "--batch", "2", "--device", "cpu"]


def test_stacks_end_to_end_writes_its_files(capsys, tmp_path):
    out = tmp_path / "o"
    rc, text, err = _main(["stacks", "--config", TINY, *FAST, "--align", "--out", out],
                          capsys)
    assert rc == 0, err
    lines = text.splitlines()
    assert re.match(r"^castlab stacks on cpu \(.+\)", lines[0]), lines[0]
    assert lines[1] == (f"model: LlamaForCausalLM from {TINY} (random weights, seed 0), "
                        "bfloat16, 2 x 8 tokens")
    assert lines[2].startswith("compare_stacks on LlamaForCausalLM: A = liger, B = vllm; "
                               "14 tokens scored")
    assert "alignment of vllm (B) to liger (A): switch rope to liger's" in text
    assert lines[-1].startswith(f"wrote {out}/results.csv, {out}/summary.json")
    df = pd.read_csv(out / "results.csv")
    assert list(df.columns) == ["batch", "position", "label", "lp_a", "lp_b", "lp_ref", "delta",
                                "kl", "flip", "err_a", "err_b"]
    assert len(df) == 14 and set(df.batch) == {0, 1} and df.position.max() == 6
    assert (df.lp_a <= 0).all() and (df.kl >= 0).all()
    assert (df.delta - (df.lp_a - df.lp_b)).abs().max() < 1e-12
    s = json.loads((out / "summary.json").read_text())
    assert s["a"] == "liger" and s["b"] == "vllm" and s["summary"]["tokens"] == 14
    assert s["summary"]["logits_differ"] > 0 and s["first"]["kind"] == "rope"
    assert s["alignment"]["sets"] == [["rope"]] and s["alignment"]["effects"][0]["verdict"]
    assert s["run"]["command"] == "stacks"
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "finished" and run["seeds"] == [0]
    assert run["config"]["a"] == "liger" and run["config"]["align"] is True
    for png in ("layers.png", "logprob_hist.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.inductor  # the torch_compile stack compiles the model (its stores)
def test_stacks_labels_seed_and_out_rule(capsys, tmp_path):
    out = tmp_path / "o"
    argv = ["stacks", "--config", TINY.parent, *FAST, "--labels", "--a", "hf_eager",
            "--b", "torch_compile", "--dtype", "fp32", "--seed", "3", "--no-plots",
            "--out", out]
    rc, text, err = _main(argv, capsys)
    assert rc == 0, err
    assert "float32, 2 x 8 tokens, random labels" in text and "16 tokens scored" in text
    first = pd.read_csv(out / "results.csv")
    assert len(first) == 16 and not (out / "layers.png").exists()
    assert "alignment" not in text
    _refused(argv, r"--out '.+' already holds results \(results\.csv, summary\.json\); pass "
             "--overwrite", capsys)
    rc, _, err = _main([*argv, "--overwrite"], capsys)
    assert rc == 0, err
    pd.testing.assert_frame_equal(first, pd.read_csv(out / "results.csv"))  # seeded


def test_stacks_reads_safetensors_weights(capsys, tmp_path):
    import torch
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(TINY)
    torch.manual_seed(5)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "m")
    assert list((tmp_path / "m").glob("*.safetensors"))
    base = ["stacks", *FAST, "--seed", "5", "--no-plots"]
    rc, text, err = _main([*base, "--config", tmp_path / "m", "--out", tmp_path / "a"], capsys)
    assert rc == 0, err
    assert "(safetensors weights)" in text
    rc, _, err = _main([*base, "--config", TINY, "--out", tmp_path / "b"], capsys)
    assert rc == 0, err  # the same weights, drawn again from seed 5: the same table
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "a" / "results.csv"),
                                  pd.read_csv(tmp_path / "b" / "results.csv"))


def test_stacks_errors_are_one_line(capsys, tmp_path):
    o = ["--out", tmp_path / "o"]
    known = ", ".join(ct.stacks())
    assert _refused(["stacks", "--config", TINY, "--a", "sglang", *o],
                    r"--a 'sglang': unknown stack; known stacks: ", capsys).endswith(known)
    _refused(["stacks", "--config", TINY, "--b", "nope", *o], r"--b 'nope': unknown stack", capsys)
    _refused(["stacks", *o], r"the following arguments are required: --config", capsys)
    _refused(["stacks", "--config", tmp_path / "none.json", *o], r"no such file or folder", capsys)
    (tmp_path / "empty").mkdir()
    _refused(["stacks", "--config", tmp_path / "empty", *o], r"holds no config\.json", capsys)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    _refused(["stacks", "--config", bad, *o], r"is not valid JSON", capsys)
    bad.write_text('{"hidden_size": 64}')
    _refused(["stacks", "--config", bad, *o], r"not a Hugging Face model config", capsys)
    bad.write_text('{"model_type": "vit"}')  # no causal-LM head for it
    _refused(["stacks", "--config", bad, *o], r"cannot build a causal LM: ", capsys)
    _refused(["stacks", "--config", TINY, "--tokens", "0", *o],
             r"--tokens: expected an integer in \[2, ", capsys)
    _refused(["stacks", "--config", TINY, "--batch", "two", *o],
             r"--batch: expected an integer, got 'two'", capsys)
    _refused(["stacks", "--config", TINY, "--dtype", "fp8_e4m3", *o],
             r"--dtype: expected bfloat16, float16 or float32", capsys)
    _refused(["stacks", "--config", TINY, "--seed", "-1", *o], r"--seed: expected an integer", capsys)
    _refused(["stacks", "--config", TINY, "--tokens", "4096", *o],
             r"--tokens 4096 exceeds the model's max_position_embeddings \(512\)", capsys)
    assert not (tmp_path / "o" / "run.json").exists()


def test_help_lists_stacks_and_its_stack_names_are_castlab_torchs(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    assert "\n  stacks " in text[text.index("commands:"):]
    assert list(_cli_parser.STACK_NAMES) == ct.stacks()


def test_the_readme_config_is_the_shipped_one():
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- file: tiny_llama/config.json -->\n```json\n(.*?)```", readme, re.S)
    assert m and json.loads(m.group(1)) == json.loads(TINY.read_text())
