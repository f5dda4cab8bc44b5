"""`tformer perplexity` of a long text: the first N tokens alone, a stop that prints the partial result over the
tokens scored so far (the same numbers as the first N), and bf16 weights close to fp32's."""

import json
import os
import re
import signal

import pytest
from typer.testing import CliRunner

from tformer_cli import log
from tformer_cli.cli import app
from tformer_cli.tokenizer import Tokenizer

runner = CliRunner()


def _eval(run, text, *args):
    return runner.invoke(app, ["perplexity", str(run), str(text), "run.device=cpu", *args])


def _saved(run, name):
    return json.loads((run / name).read_text())


def test_the_first_tokens_of_a_text_score_as_the_lines_they_cover(lm_run, tmp_path):
    run, lines = lm_run / "runs/lm", (lm_run / "train.txt").read_text().splitlines()
    tokenizer = Tokenizer(lm_run / "data/spm.model")
    n = sum(len(row) + 1 for row in tokenizer.encode(lines[:40]))  # the first 40 lines, each with its end of line
    (tmp_path / "head.txt").write_text("\n".join(lines[:40]) + "\n")
    first = _eval(run, lm_run / "train.txt", "--first-tokens", str(n))
    assert first.exit_code == 0, first.output
    total = sum(len(row) + 1 for row in tokenizer.encode(lines))
    assert f"the first {n:,} of {total:,} tokens" in first.stdout
    head = _eval(run, tmp_path / "head.txt")
    assert head.exit_code == 0, head.output
    cut, whole = _saved(run, f"eval_train.txt_best_blocks_first{n}.json"), _saved(run, "eval_head.txt_best_blocks.json")
    assert (cut["tokens"], cut["words"], cut["bytes"]) == (whole["tokens"], whole["words"], whole["bytes"])
    assert cut["ppl_word"] == pytest.approx(whole["ppl_word"], rel=1e-9)
    refused = _eval(run, lm_run / "train.txt", "--first-tokens", "-3")
    assert refused.exit_code == 1 and "--first-tokens -3" in refused.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_prints_the_partial_result_over_what_was_scored(lm_run, monkeypatch, signum):
    run, text = lm_run / "runs/lm", lm_run / "train.txt"
    advance = log.LineProgress.advance

    def stopped_after_the_first_batch(self, n):
        advance(self, n)
        if self.done == n:
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(log.LineProgress, "advance", stopped_after_the_first_batch)
    stopped = _eval(run, text, "--stride", "8")
    monkeypatch.undo()
    name = signal.Signals(signum).name
    assert stopped.exit_code == 128 + signum, stopped.output
    assert f"stopped by {name}: the result below is partial" in stopped.stderr
    scored = int(re.search(rf"partial \({name}\): the first ([\d,]+) of", stopped.stdout)[1].replace(",", ""))
    partial = _saved(run, f"eval_train.txt_best_stride8_first{scored}.json")
    assert partial["partial"] == name and 0 < scored < partial["text_tokens"]
    again = _eval(run, text, "--stride", "8", "--first-tokens", str(scored))  # the same tokens, not stopped
    assert again.exit_code == 0, again.output
    first = _saved(run, f"eval_train.txt_best_stride8_first{scored}.json")
    assert first["partial"] is None
    assert (first["nll"], first["words"], first["bytes"]) == pytest.approx(
        (partial["nll"], partial["words"], partial["bytes"]), rel=1e-12
    )
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are given back


def test_bf16_weights_score_a_text_close_to_fp32(lm_run):
    run, text = lm_run / "runs/lm", lm_run / "valid.txt"
    for precision in ("fp32", "bf16"):
        result = _eval(run, text, f"decode.precision={precision}")
        assert result.exit_code == 0, result.output
    fp32, bf16 = _saved(run, "eval_valid.txt_best_blocks.json"), _saved(run, "eval_valid.txt_best_blocks_bf16.json")
    assert bf16["precision"] == "bf16" and bf16["tokens"] == fp32["tokens"]
    assert bf16["ppl_token"] == pytest.approx(fp32["ppl_token"], rel=0.01)  # docs/api.md: within 1%
    assert bf16["ppl_token"] != fp32["ppl_token"]  # the bf16 weights were used
