"""The StreamRec recipes end to end (tests/integration/conftest.py trains both tiny through the CLI):
validation records every metric by rule beside the Bayes-optimal one, and `tformer eval` recomputes them."""

import json

import pytest
import torch
from tiny_models import ON_CPU
from typer.testing import CliRunner

from tformer_cli.cli import app

runner = CliRunner()
RULE_METRICS = [f"{m}{r}" for m in ("accuracy", "hit10", "mrr") for r in ("", "_local", "_long", "_random")]


@pytest.mark.parametrize("kind", ["lm", "lstm"])
def test_validation_records_metrics_by_rule_and_eval_recomputes_them(sessions_run, kind):
    run = sessions_run / "runs" / kind
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in records if r["split"] == "valid"]
    assert len(valid) == 2  # one per epoch
    for record in valid:
        assert {"loss", "ppl", "bayes_loss", *RULE_METRICS, *(f"bayes_{m}" for m in RULE_METRICS)} <= set(record)
    assert valid[0]["bayes_mrr"] == valid[1]["bayes_mrr"]  # the data's, not the model's
    best = torch.load(run / "checkpoints/best.pt", map_location="cpu", weights_only=True)
    assert best["config"]["data"]["kind"] == "sessions" and best["tokenizer_fingerprint"] is None
    result = runner.invoke(app, ["eval", str(run), *ON_CPU])  # where it was trained (auto would take a GPU)
    assert result.exit_code == 0, result.output
    saved = json.loads((run / "eval_valid_best.json").read_text())
    for key, value in best["metrics"].items():  # what training validated best.pt with
        assert saved[key] == pytest.approx(value, rel=1e-6, nan_ok=True), key
    assert best["metrics"]["mrr"] == max(r["mrr"] for r in valid)  # best.pt: the best validation MRR


def test_the_test_split_is_scored_apart_from_validation(sessions_run):
    run = sessions_run / "runs/lm"
    for split in ("valid", "test"):
        result = runner.invoke(app, ["eval", str(run), "--split", split])
        assert result.exit_code == 0, result.output
    valid = json.loads((run / "eval_valid_best.json").read_text())
    test = json.loads((run / "eval_test_best.json").read_text())
    assert (test["split"], test["sessions"], valid["split"], valid["sessions"]) == ("test", 20, "valid", 20)
    assert test["bayes_mrr"] != valid["bayes_mrr"]  # other sessions


def test_a_split_that_does_not_exist_or_does_not_apply_is_refused(sessions_run, tmp_path):
    result = runner.invoke(app, ["eval", str(sessions_run / "runs/lm"), "--split", "train"])
    assert result.exit_code == 1 and "'train' is not one of 'valid', 'test'" in result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    (tmp_path / "text.txt").write_text("a line\n")
    given = ["--src", str(tmp_path / "text.txt"), "--ref", str(tmp_path / "text.txt")]
    result = runner.invoke(app, ["eval", str(sessions_run / "runs/lm"), "--split", "test", *given])
    assert result.exit_code == 1 and "instead of the run's --split" in result.stderr, result.stderr
