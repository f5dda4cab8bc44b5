"""`tformer export --format ctranslate2` and `tformer translate --engine ctranslate2` on tiny trained runs.

The translation models are trained here for a few hundred updates on a word-for-word English-German
task, so that their outputs are real sentences (and, the embeddings untied, PAD and BOS learned to be
improbable: see decoding/ctranslate2.py on how CTranslate2 leaves them out of the softmax).
"""

import json
import random
import shutil
import sys

import ctranslate2
import pytest
import sentencepiece as spm
import torch
from tiny_models import CPU, GERMAN, ON_CPU, WORDS, word_for_word, write_pairs
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.decoding import ctranslate2 as engine_module
from tformer_cli.decoding.rules import length_penalty
from tformer_cli.decoding.search import generate
from tformer_cli.decoding.settings import SearchSettings
from tformer_cli.decoding.translate import translate_lines
from tformer_cli.run import load_run
from tformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID

runner = CliRunner()


def _ok(args):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output + str(result.exception)
    return result


def _one_line_error(args, expected: str):
    result = runner.invoke(app, [str(a) for a in args])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert expected in lines[0], lines[0]
    assert result.stdout == ""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A pre-LN and a post-LN translation run (runs/pre, runs/post) and held-out English lines."""
    tmp = tmp_path_factory.mktemp("ct2")
    rng = random.Random(0)
    english = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))) for _ in range(600)]
    write_pairs(tmp, {"train": english[:560], "valid": english[560:]}, word_for_word(GERMAN))
    common = [f"data.train={tmp}/train", f"data.valid={tmp}/valid", f"data.dir={tmp}/data", "tokenizer.vocab_size=60"]
    _ok(["prepare", "recipes/wmt14_base.yaml", *common])
    for norm in ("pre", "post"):
        _ok(
            ["train", "recipes/wmt14_base.yaml", *common, f"run.out_dir={tmp}/runs", f"run.name={norm}"]
            + [f"model.norm_placement={norm}", "model.d_model=32", "model.n_heads=4", "model.n_layers=2"]
            + ["model.d_ff=64", "model.dropout=0.0", "model.share_all_embeddings=false", "model.tie_embeddings=false"]
            + ["train.schedule=constant", "train.lr=3e-3", "train.warmup_steps=10", "train.max_tokens=300"]
            + ["train.max_updates=300", "train.epochs=100", "train.valid_every=100", "train.update_freq=1"]
            + ["train.precision=fp32", "train.best_metric=loss", "train.label_smoothing=0.0", "run.threads=1"]
            + CPU
        )
    held_out = english[560:]
    (tmp / "in.en").write_text("\n".join([*held_out[:12], "", *held_out[12:]]) + "\n")
    return tmp


def _pad_bos_shift(model, source: list[int], tokens: list[int]) -> float:
    """How much higher CTranslate2's log-probability of `tokens` is: sum of -log(1 - p(PAD) - p(BOS))."""
    with torch.no_grad():
        logits = model(torch.tensor([source]), torch.tensor([[BOS_ID] + tokens[:-1]]))[0]
    left_out = torch.softmax(logits.double(), -1)[:, [PAD_ID, BOS_ID]].sum(-1)
    return float(-torch.log1p(-left_out).sum())


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("settings", [["decode.beam=1"], ["decode.beam=4", "decode.nbest=2"]], ids=["greedy", "beam"])
def test_ctranslate2_finds_tformers_hypotheses(runs, norm, settings):
    run = load_run(runs / "runs" / norm, settings, device="cpu", cast=False)
    cfg = run.config.decode
    lines = (runs / "in.en").read_text().splitlines()
    native = translate_lines(run.model, run.tokenizer, lines, cfg)
    theirs = translate_lines_ct2(run, lines)
    assert [[h.tokens for h in hyps] for hyps in theirs] == [[h.tokens for h in hyps] for hyps in native]
    assert sum(len(h) for h in native) == (len(lines) - 1) * cfg.nbest  # one empty line
    for line, ours, other in zip(lines, native, theirs, strict=True):
        source = run.tokenizer.encode([line])[0] + [EOS_ID]
        for a, b in zip(ours, other, strict=True):
            assert len(a.tokens) < len(source) + cfg.max_len_b  # ended by EOS, not by the length limit
            penalty = 1.0 if cfg.beam == 1 else length_penalty(len(a.tokens), cfg.len_penalty)
            assert b.score == pytest.approx(a.score + _pad_bos_shift(run.model, source, a.tokens) / penalty, abs=1e-4)


def translate_lines_ct2(run, lines):
    return engine_module.translate_lines(
        engine_module.load_engine(run, None, "cpu"), run.tokenizer, lines, run.config.decode
    )


def test_greedy_cut_at_a_short_limit_as_tformer_cuts_it(runs):
    run = load_run(
        runs / "runs" / "post", ["decode.beam=1", "decode.max_len_a=0", "decode.max_len_b=3"], "cpu", cast=False
    )
    lines = (runs / "in.en").read_text().splitlines()
    native = translate_lines(run.model, run.tokenizer, lines, run.config.decode)
    theirs = translate_lines_ct2(run, lines)
    assert [[h.tokens for h in hyps] for hyps in theirs] == [[h.tokens for h in hyps] for hyps in native]
    cut = [hyps[0] for hyps in native if hyps and len(hyps[0].tokens) == 3]
    assert len(cut) > len(lines) // 2  # most translations are longer than 3 tokens: cut, EOS forced
    for a, b in zip(native, theirs, strict=True):
        assert [h.score for h in b] == pytest.approx([h.score for h in a], abs=0.02)


def test_beam_at_a_short_limit_ends_every_hypothesis_there(runs):
    settings = ["decode.beam=3", "decode.nbest=3", "decode.max_len_a=0", "decode.max_len_b=3"]
    run = load_run(runs / "runs" / "pre", settings, device="cpu", cast=False)
    lines = (runs / "in.en").read_text().splitlines()
    for line, hyps in zip(lines, translate_lines_ct2(run, lines), strict=True):
        assert len(hyps) == (3 if line else 0)
        assert all(h.tokens[-1] == EOS_ID and len(h.tokens) <= 3 for h in hyps)
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


@pytest.mark.parametrize("nbest", [1, 2])
def test_the_cli_writes_what_the_native_engine_writes(runs, nbest):
    run, source, settings = runs / "runs" / "post", runs / "in.en", [f"decode.nbest={nbest}"]  # beam 4
    native = _ok(["translate", run, "-i", source, *ON_CPU, *settings]).stdout.splitlines()
    theirs = _ok(["translate", run, "-i", source, *ON_CPU, "--engine", "ctranslate2", *settings]).stdout.splitlines()
    assert len(theirs) == len(native) == len(source.read_text().splitlines()) * nbest  # the empty line's block too
    if nbest == 1:
        assert theirs == native
    else:  # line, score, text: the scores differ by the PAD and BOS probabilities (see the test above)
        for a, b in zip(native, theirs, strict=True):
            (line_a, score_a, text_a), (line_b, score_b, text_b) = a.split("\t"), b.split("\t")
            assert (line_a, text_a) == (line_b, text_b) and abs(float(score_a) - float(score_b)) < 0.01


def test_the_engine_export_is_built_once_per_checkpoint(runs):
    run, source = runs / "runs" / "pre", runs / "in.en"
    folder = run / "ctranslate2" / "best_float32"
    shutil.rmtree(folder, ignore_errors=True)  # an earlier test may have built it
    first = _ok(["translate", run, "-i", source, *ON_CPU, "--engine", "ctranslate2"])
    assert f"building the CTranslate2 export {folder}" in first.stderr
    again = _ok(["translate", run, "-i", source, *ON_CPU, "--engine", "ctranslate2"])
    assert "building" not in again.stderr and again.stdout == first.stdout
    marker = json.loads((folder / "tformer_export.json").read_text())
    marker["checkpoints"][0]["sha256"] = "0" * 64  # as if best.pt had changed since
    (folder / "tformer_export.json").write_text(json.dumps(marker))
    rebuilt = _ok(["translate", run, "-i", source, *ON_CPU, "--engine", "ctranslate2"])
    assert "building the CTranslate2 export" in rebuilt.stderr and rebuilt.stdout == first.stdout
    int8 = _ok(["translate", run, "-i", source, *ON_CPU, "--engine", "ctranslate2", "--quantization", "int8"])
    assert len(int8.stdout.splitlines()) == len(first.stdout.splitlines())
    assert json.loads((run / "ctranslate2" / "best_int8" / "tformer_export.json").read_text())["quantization"] == "int8"


def test_an_exported_folder_translates_without_tformer(runs, tmp_path):
    run = runs / "runs" / "post"
    _ok(["export", run, "--format", "ctranslate2", "-o", tmp_path / "ct2"])
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "ct2" / "spm.model"))
    translator = ctranslate2.Translator(str(tmp_path / "ct2"))
    lines = (runs / "in.en").read_text().splitlines()[:12]
    results = translator.translate_batch([sp.encode(line, out_type=str) for line in lines], beam_size=1)
    theirs = [sp.decode(r.hypotheses[0]) for r in results]
    assert theirs == _ok(["translate", run, "-i", runs / "in.en", *ON_CPU, "decode.beam=1"]).stdout.splitlines()[:12]


def test_a_language_model_export_scores_and_continues_as_tformer(lm_run, tmp_path):
    _ok(["export", lm_run / "runs" / "lm", "--format", "ctranslate2", "-o", tmp_path / "lm"])
    run = load_run(lm_run / "runs" / "lm", device="cpu", cast=False)
    generator = ctranslate2.Generator(str(tmp_path / "lm"))
    text = [EOS_ID] + run.tokenizer.encode(["the cat is red and the dog is on the house"])[0]
    scored = generator.score_batch([run.tokenizer.pieces(text)])[0].log_probs
    with torch.no_grad():
        logits = run.model(torch.tensor([text]))[0, :-1]
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(text[1:])[:, None]).squeeze(1)
    torch.testing.assert_close(torch.tensor(scored), expected, atol=1e-4, rtol=0)
    ours = generate(run.model, torch.tensor([text[:4]]), SearchSettings(max_new_tokens=30))[0, 4:].tolist()
    theirs = generator.generate_batch(
        [run.tokenizer.pieces(text[:4])], max_length=30, sampling_topk=1, include_prompt_in_result=False, end_token=[]
    )[0].sequences_ids[0]
    assert theirs == ours


def test_what_the_ctranslate2_paths_refuse_in_one_line(runs, lm_run, classifier_run, tmp_path):
    run, source = runs / "runs" / "post", runs / "in.en"
    _one_line_error(
        ["translate", run, "-i", source, *ON_CPU, "--engine", "onnx"], "'onnx' is not one of 'native', 'ctranslate2'"
    )
    _one_line_error(
        ["translate", run, "-i", source, *ON_CPU, "--quantization", "int8"], "--quantization applies to --engine"
    )
    _one_line_error(
        ["translate", run, "-i", source, *ON_CPU, "--engine", "ctranslate2", "decode.precision=bf16"],
        "decode.precision=bf16 applies to --engine native",
    )
    _one_line_error(
        ["translate", run, "-i", source, *ON_CPU, "--engine", "ctranslate2", "--quantization", "int4"],
        "'int4' is not one of 'int8', 'int8_float16', 'float16'",
    )
    _one_line_error(
        ["export", run, "--format", "onnx", "-o", tmp_path / "x"],
        "'onnx' is not one of 'safetensors', 'hf', 'ctranslate2'",
    )
    _one_line_error(["export", run, "--quantization", "int8", "-o", tmp_path / "x.safetensors"], "--format ctranslate2")
    _one_line_error(
        ["export", classifier_run, "--format", "ctranslate2", "-o", tmp_path / "x"],
        "model.kind=classifier is not supported by the CTranslate2 export",
    )
    _one_line_error(
        ["export", lm_run / "runs" / "lstm", "--format", "ctranslate2", "-o", tmp_path / "x"],
        "model.kind=lstm is not supported by the CTranslate2 export",
    )
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    _one_line_error(["export", run, "--format", "ctranslate2", "-o", tmp_path / "mine"], "not a tformer export")
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


def test_without_ctranslate2_the_error_names_the_extra(runs, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # `import ctranslate2` raises ImportError
    _one_line_error(
        ["translate", runs / "runs" / "post", "-i", runs / "in.en", *ON_CPU, "--engine", "ctranslate2"],
        'this needs the `ctranslate2` package: pip install "tformer-cli[export]"',
    )
