"""Exports carry the recipe's decoding: Hugging Face `generate(**ids)` and the CTranslate2 README's call give
`tformer translate`'s lines; export folders get the permissions the umask gives.

The run is trained here for 200 updates on a word-for-word English-German task: enough that its
translations end well before the length limit, and that beam 4 differs from greedy on most lines. With some
CPUs' arithmetic it still loops on a held-out line (its beam runs into the length limit): there CTranslate2's
search may keep other beams (the README's "Where it can differ"), and that line is left out of the comparison.
"""

import dataclasses
import os
import random
import re
import stat

import pytest
import torch
from tiny_models import CPU, GERMAN, ON_CPU, WORDS, tiny_mt_training, word_for_word, write_pairs
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.decoding.api import SearchSettings, translate_batch
from tformer_cli.decoding.search import output_limits
from tformer_cli.run import load_run
from tformer_cli.tokenizer import EOS_ID

transformers = pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")
runner = CliRunner()


def _ok(args) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output + str(result.exception)
    return result.stdout


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A trained translation run (beam 4, len_penalty 0.6: recipes/wmt14_base.yaml) and 24 held-out lines."""
    tmp = tmp_path_factory.mktemp("export_decoding")
    rng = random.Random(0)
    english = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))) for _ in range(600)]
    write_pairs(tmp, {"train": english[:560], "valid": english[560:]}, word_for_word(GERMAN))
    common = [f"data.train={tmp}/train", f"data.valid={tmp}/valid", f"data.dir={tmp}/data", "tokenizer.vocab_size=60"]
    _ok(["prepare", "recipes/wmt14_base.yaml", *common])
    _ok(
        [
            "train",
            "recipes/wmt14_base.yaml",
            *common,
            f"run.out_dir={tmp}/runs",
            "run.name=mt",
            *tiny_mt_training(128, 200, 100),
            *CPU,
        ]
    )
    held_out = english[560:584]
    (tmp / "in.en").write_text("\n".join(held_out) + "\n")
    return tmp


def _hf_export(trained, tmp_path, settings: list[str]):
    from tformer_cli.export.hugging_face import export_hugging_face

    run = load_run(trained / "runs" / "mt", settings, device="cpu", cast=False)
    export_hugging_face(run, tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    return run, tok, transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf")


def test_hf_generate_with_no_arguments_is_tformer_translate_with_beam(trained, tmp_path):
    """len_penalty 0: the one length penalty Hugging Face and tformer share (export/hf_generation.py)."""
    settings = ["decode.len_penalty=0"]
    run, tok, model = _hf_export(trained, tmp_path, settings)
    config = model.generation_config
    assert (config.num_beams, config.early_stopping, config.length_penalty) == (4, True, 0.0)
    assert config.max_new_tokens == run.config.model.max_len  # 1 * max_len + 50, capped at the decoder's positions
    lines = (trained / "in.en").read_text().splitlines()
    out = model.generate(**tok(lines, return_tensors="pt", padding=True))  # the whole batch, padded
    theirs = tok.batch_decode(out, skip_special_tokens=True)
    translate = ["translate", trained / "runs" / "mt", "-i", trained / "in.en", *ON_CPU]
    ours = _ok([*translate, *settings]).splitlines()
    assert theirs == ours
    greedy = _ok([*translate, "decode.beam=1"]).splitlines()
    assert sum(a != b for a, b in zip(ours, greedy, strict=True)) >= len(lines) // 2  # the beam search matters


@pytest.mark.parametrize(
    "settings",
    [[], ["decode.max_len_a=0", "decode.max_len_b=4"], ["decode.beam=1"]],
    ids=["recipe (beam 4, GNMT 0.6)", "every line at its limit", "greedy"],
)
def test_hf_custom_generate_is_tformer_translate_exactly(trained, tmp_path, monkeypatch, settings):
    """Loaded with trust_remote_code=True, the export's custom_generate/generate.py searches as tformer: its length
    penalty and per-sentence limit, which the stock `generate` cannot express."""
    monkeypatch.setattr(transformers.dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    run, tok, stock = _hf_export(trained, tmp_path, settings)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    lines = (trained / "in.en").read_text().splitlines()
    ids = tok(lines, return_tensors="pt", padding=True)
    theirs = tok.batch_decode(model.generate(**ids), skip_special_tokens=True)
    ours = _ok(["translate", trained / "runs" / "mt", "-i", trained / "in.en", *ON_CPU, *settings]).splitlines()
    assert theirs == ours
    if settings == []:  # where the stock search ranks differently: the custom one is what made them equal
        assert tok.batch_decode(stock.generate(**ids), skip_special_tokens=True) != theirs


def test_hf_generation_config_carries_the_recipes_search(trained, tmp_path):
    run, _, model = _hf_export(trained, tmp_path, ["decode.nbest=2", "decode.max_len_a=0.5", "decode.max_len_b=7"])
    config = model.generation_config
    assert (config.num_beams, config.early_stopping, config.num_return_sequences) == (4, True, 2)
    assert config.length_penalty == 0.6  # the recipe's alpha; HF's formula differs (see the model card)
    assert config.max_new_tokens == int(0.5 * run.config.model.max_len + 7)
    assert config.suppress_tokens == [0, 2] and config.forced_eos_token_id == 3  # PAD, BOS; EOS
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "model.generate(**ids)  # tformer translate's search: beam 4" in card
    assert "((5 + length) / 6) ** 0.6" in card


def _looping(run_dir, lines: list[str]) -> set[int]:
    """The lines on which tformer's beam search ends a hypothesis at the line's length limit: the model loops there
    (it has not learned to end that sentence), and CTranslate2, whose log-probabilities are higher by those of PAD
    and BOS (left out of its softmax), may keep another beam."""
    run = load_run(run_dir, device="cpu", cast=False)
    settings = SearchSettings.from_decode(run.config.decode, run.config.model.max_len)
    settings = dataclasses.replace(settings, nbest=settings.beam)  # every finished hypothesis
    looping = set()
    for i, line in enumerate(lines):
        src = torch.tensor([run.tokenizer.encode([line])[0] + [EOS_ID]])
        limit = int(output_limits(run.model, src, settings)[0])  # the search's own limit
        hyps = translate_batch(run.model, src, settings)[0]
        if any(len(h.tokens) >= limit for h in hyps):
            looping.add(i)
    return looping


def test_the_ctranslate2_readme_call_is_tformer_translate(trained, tmp_path):
    """The README's Python, run as written, gives `tformer translate`'s lines (beam 4, len_penalty 0.6), but where
    the model loops (`_looping`: at most a few lines)."""
    run_dir, source = trained / "runs" / "mt", trained / "in.en"
    _ok(["export", run_dir, "--format", "ctranslate2", "-o", tmp_path / "ct2"])
    readme = (tmp_path / "ct2" / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    assert "beam_size=4," in code and "** 0.6" in code
    scope = {"DIR": str(tmp_path / "ct2")}
    exec(code, scope)  # the README's own code
    lines = [*source.read_text().splitlines(), ""]
    ours = _ok(["translate", run_dir, "-i", source, *ON_CPU]).splitlines()
    looping = _looping(run_dir, lines[:-1])
    assert len(looping) <= len(lines) // 8, f"the model loops on lines {sorted(looping)}: train it longer"
    theirs = scope["translate"](lines)
    kept = [i for i in range(len(lines)) if i not in looping]
    assert [theirs[i] for i in kept] == [[*ours, ""][i] for i in kept]
    greedy = _ok(["translate", run_dir, "-i", source, *ON_CPU, "decode.beam=1"]).splitlines()
    lengths = _ok(["translate", run_dir, "-i", source, *ON_CPU, "decode.len_penalty=0"]).splitlines()
    assert ours != greedy and ours != lengths  # the search and the ranking both matter on these lines


def test_export_folders_get_the_umasks_permissions(trained, tmp_path):
    old = os.umask(0o022)
    try:
        for fmt in ("hf", "ctranslate2"):
            _ok(["export", trained / "runs" / "mt", "--format", fmt, "-o", tmp_path / fmt])
            paths = [tmp_path / fmt, *(tmp_path / fmt).rglob("*")]
            modes = {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in paths}
            assert modes == {str(p): oct(0o755 if p.is_dir() else 0o644) for p in paths}
    finally:
        os.umask(old)
