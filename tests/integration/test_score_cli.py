"""`tformer score RUN --src --ref`: one `line<TAB>log p<TAB>tokens` per given pair on stdout, the total on
stderr; a language model or a missing file side is one line and exit 1."""

import math

from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.data.text import read_lines
from tformer_cli.decoding.load import load_for_decoding
from tformer_cli.scoring import score_pairs

runner = CliRunner()


def test_score_prints_each_pair_and_the_total(translation_run):
    src, ref = translation_run / "valid.en", translation_run / "valid.de"
    result = runner.invoke(app, ["score", str(translation_run / "runs/mt"), "--src", str(src), "--ref", str(ref)])
    assert result.exit_code == 0, result.output
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert [int(r[0]) for r in rows] == list(range(1, len(list(read_lines(src))) + 1))
    run = load_for_decoding(translation_run / "runs/mt")  # on the device the command took (auto)
    expected = list(score_pairs(run, read_lines(src), read_lines(ref), names=(src, ref)))
    assert [(float(r[1]), int(r[2])) for r in rows] == [(round(p.logprob, 4), p.tokens) for p in expected]
    total, tokens = sum(p.logprob for p in expected), sum(p.tokens for p in expected)
    assert result.stderr.strip() == (
        f"scored {len(rows):,} pairs: log p {total:.4f} over {tokens:,} tokens, {total / tokens:.4f} per token "
        f"(perplexity {math.exp(-total / tokens):.4f})"
    )
    # the model scores its training language pairs better than shuffled ones
    shuffled = translation_run / "shuffled.de"
    lines = list(read_lines(ref))
    shuffled.write_text("\n".join(lines[1:] + lines[:1]) + "\n")
    worse = runner.invoke(app, ["score", str(translation_run / "runs/mt"), "--src", str(src), "--ref", str(shuffled)])
    assert worse.exit_code == 0, worse.output
    assert sum(float(line.split("\t")[1]) for line in worse.stdout.splitlines()) < total


def test_score_refuses_a_language_model_and_a_missing_side(translation_run, lm_run):
    src = str(translation_run / "valid.en")
    lm = runner.invoke(app, ["score", str(lm_run / "runs/lm"), "--src", src, "--ref", src])
    assert lm.exit_code == 1
    assert len(lm.stderr.splitlines()) == 1 and "scoring pairs needs a translation model" in lm.stderr
    missing = runner.invoke(app, ["score", str(translation_run / "runs/mt"), "--src", src])
    assert missing.exit_code == 1
    (line,) = missing.stderr.splitlines()
    assert line.startswith("error: Missing option '--ref'.") and line.endswith("score --help)"), line
