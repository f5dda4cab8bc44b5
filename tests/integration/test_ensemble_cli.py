"""`tformer translate RUN --ensemble OTHER` and `tformer eval RUN --ensemble OTHER --src --ref`: several models
translate as one (decoding/ensemble.py); what cannot be an ensemble is one line and exit 1."""

import json

from tiny_models import ON_CPU, tiny_mt_recipe
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.data.text import read_lines
from tformer_cli.decoding.load import load_ensemble
from tformer_cli.decoding.translate import translate_lines

runner = CliRunner()


def _members(translation_run):
    run = translation_run / "runs/mt"
    return run, sorted((run / "checkpoints").glob("step_*.pt"))[0]  # best.pt and the first epoch's weights


def test_translate_and_eval_decode_the_ensemble(translation_run, tmp_path):
    run, other = _members(translation_run)
    src, ref = translation_run / "valid.en", translation_run / "valid.de"
    out = tmp_path / "out.de"
    result = runner.invoke(
        app, ["translate", str(run), "--ensemble", str(other), "-i", str(src), "-o", str(out), *ON_CPU]
    )
    assert result.exit_code == 0, result.output
    ensemble = load_ensemble([run, other], device="cpu")
    lines = list(read_lines(src))
    expected = [
        hyps[0].tokens for hyps in translate_lines(ensemble.model, ensemble.tokenizer, lines, ensemble.config.decode)
    ]
    assert out.read_text().splitlines() == [ensemble.tokenizer.decode(tokens) for tokens in expected]

    scored = runner.invoke(
        app,
        ["eval", str(run), "--ensemble", str(other), "--src", str(src), "--ref", str(ref), "--test-set", "v", *ON_CPU],
    )
    assert scored.exit_code == 0, scored.output
    saved = json.loads((run / "eval_v_best_ens2_beam4.json").read_text())
    assert saved["decode"]["ensemble"] == [str(run / "checkpoints/best.pt"), str(other)]
    assert (run / "eval_v_best_ens2_beam4.hyp").read_text() == out.read_text()
    alone = runner.invoke(app, ["eval", str(run), "--src", str(src), "--ref", str(ref), "--test-set", "v", *ON_CPU])
    assert alone.exit_code == 0, alone.output
    assert json.loads((run / "eval_v_best_beam4.json").read_text())["decode"]["ensemble"] == []


def test_what_cannot_be_an_ensemble_is_one_line(translation_run, lm_run, tmp_path):
    run, other = _members(translation_run)
    src = str(translation_run / "valid.en")
    recipe = tiny_mt_recipe(tmp_path)  # another corpus: another tokenizer
    for args in (["prepare", str(recipe)], ["train", str(recipe), "run.name=other"]):
        assert runner.invoke(app, args).exit_code == 0
    cases = {
        "trained with another tokenizer than": ["translate", str(run), "--ensemble", str(tmp_path / "runs/other")],
        "is a lm model": ["translate", str(run), "--ensemble", str(lm_run / "runs/lm")],
        "of the weights as given": ["translate", str(run), "--ensemble", str(other), "--average", "2"],
        "the native engine translates an ensemble": [
            "translate",
            str(run),
            "--ensemble",
            str(other),
            "--engine",
            "ctranslate2",
        ],
        "an ensemble decodes on the dynamic path": [
            "translate",
            str(run),
            "--ensemble",
            str(other),
            "decode.static=always",
        ],
        "--ensemble translates --src": ["eval", str(run), "--ensemble", str(other)],
    }
    for message, args in cases.items():
        result = runner.invoke(app, [*args, *(["-i", src] if args[0] == "translate" else []), *ON_CPU])
        assert result.exit_code == 1, (args, result.output)
        assert len(result.stderr.splitlines()) == 1 and message in result.stderr, (args, result.stderr)
