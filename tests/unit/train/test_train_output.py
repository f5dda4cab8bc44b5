"""What the training loop leaves and says (train/loop.py): train.log's lines, an ETA that honours the time budget,
curves.png at validations, a stop said as a stop, validation translations, and nothing silently wrong on a rerun
or a resume with another recipe."""

import json
import os
import random
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
from tiny_models import WORDS

from tformer_cli.config import load_config
from tformer_cli.errors import TformerError
from tformer_cli.metrics import bleu_chrf
from tformer_cli.run.checkpoints import load_checkpoint
from tformer_cli.train import loop
from tformer_cli.train.store import CheckpointStore
from tformer_cli.train.tasks import ClassifierTask

TINY = Path(__file__).parents[3] / "recipes" / "tiny_classifier.yaml"
# 16 updates an epoch; a constant schedule (lr 3e-3 from update 5), a record per update
COMMON = ["run.threads=1", "train.schedule=constant", "train.warmup_steps=5", "train.log_every=1", "train.epochs=3"]


def _config(tmp_path: Path, *overrides: str):
    return load_config(TINY, [f"run.out_dir={tmp_path}", *COMMON, *overrides])


def _said(run: Path) -> list[str]:
    """train.log's lines without their date and time."""
    return [line.split(" ", 2)[2] for line in (run / "train.log").read_text().splitlines()]


def _records(run: Path, split: str) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["split"] == split]


def _update_at(monkeypatch, step: int, action) -> None:
    """Call `action()` when update `step` is done."""
    real_update, done = loop.update, [0]

    def update(*args):
        result = real_update(*args)
        done[0] += result[1] == "ok"
        if done[0] == step:
            action()
        return result

    monkeypatch.setattr(loop, "update", update)


def test_train_log_has_a_line_per_interval_and_each_validation_and_grows_on_resume(tmp_path):
    run = tmp_path / "run"
    short = "train.warmup_steps=2"  # within the 4 updates (a longer warm-up is warned of: waste.py)
    loop.train(_config(tmp_path, "train.max_updates=4", "train.valid_every=2", "train.log_every=2", short), run)
    first = _said(run)
    assert first[0] == f"training {run}: 4 updates"
    assert [line.split(" loss")[0] for line in first[1:]] == [
        "update 2/4 epoch 1",
        "epoch 1 (part) update 2: valid",
        "update 4/4 epoch 1",
        "epoch 1 (part) update 4: valid",
    ]
    assert all(" lr " in line and " examples/s " in line and " elapsed 0:00:" in line for line in first[1::2])
    loop.train(_config(tmp_path, "train.max_updates=6", "train.valid_every=2", "train.log_every=2", short), run)
    again = _said(run)
    assert again[: len(first)] == first  # appended
    assert again[len(first)] == f"resuming {run} at update 4 (epoch 1, batch 4)"
    assert again[-2].startswith("update 6/6 epoch 1 loss")


def test_the_total_and_the_time_left_honour_the_time_budget_from_the_first_interval(tmp_path, monkeypatch):
    """6 s per update and train.max_minutes=0.5: after one update the line says 5 updates and 24 s are left."""
    clock = [1000.0]
    monkeypatch.setattr(loop, "time", SimpleNamespace(time=lambda: clock[0]))
    real_update = loop.update

    def update_taking_6_seconds(*args):
        clock[0] += 6.0
        return real_update(*args)

    monkeypatch.setattr(loop, "update", update_taking_6_seconds)
    loop.train(_config(tmp_path, "train.max_minutes=0.5", "train.valid_every=0"), tmp_path / "run")
    lines = [line for line in _said(tmp_path / "run") if line.startswith("update ")]
    assert lines[0].startswith("update 1/5 epoch 1 ") and lines[0].endswith(" elapsed 0:00:06 eta 0:00:24")
    assert lines[-1].startswith("update 5/5 ") and lines[-1].endswith(" elapsed 0:00:30 eta 0:00:00")


def test_an_intervals_throughput_leaves_the_validation_time_out(tmp_path, monkeypatch):
    """2 s per update of 32 examples is 16 examples/s, however long the validation in the interval took."""
    clock = [1000.0]
    monkeypatch.setattr(loop, "time", SimpleNamespace(time=lambda: clock[0]))
    real_update, real_evaluate = loop.update, ClassifierTask.evaluate

    def update_taking_2_seconds(*args):
        clock[0] += 2.0
        return real_update(*args)

    def evaluate_taking_100_seconds(*args):
        clock[0] += 100.0
        return real_evaluate(*args)

    monkeypatch.setattr(loop, "update", update_taking_2_seconds)
    monkeypatch.setattr(ClassifierTask, "evaluate", evaluate_taking_100_seconds)
    loop.train(_config(tmp_path, "train.max_updates=4", "train.log_every=2", "train.valid_every=2"), tmp_path / "run")
    lines = [line for line in _said(tmp_path / "run") if line.startswith("update ")]
    assert [line.split(" examples/s ")[1].split()[0] for line in lines] == ["16", "16"]


def test_a_validation_draws_curves_png_before_the_run_ends(tmp_path, monkeypatch):
    def crash():
        raise KeyboardInterrupt  # as a kill would: nothing after this update runs

    _update_at(monkeypatch, 3, crash)
    # a validation late enough into the run for a picture (this run is seconds long: as if one cost nothing)
    monkeypatch.setattr("tformer_cli.train.report.FIRST_COST", 0.0)
    with pytest.raises(KeyboardInterrupt):
        loop.train(_config(tmp_path, "train.valid_every=2"), tmp_path / "run")
    assert (tmp_path / "run/curves.png").is_file()


def test_a_requested_stop_saves_draws_and_says_how_to_go_on(tmp_path, monkeypatch):
    _update_at(monkeypatch, 3, lambda: os.kill(os.getpid(), signal.SIGTERM))
    with pytest.raises(loop.Preempted) as stop:
        loop.train(_config(tmp_path, "train.valid_every=0"), tmp_path / "run")
    said = "stopped at update 3 (checkpoint saved); rerun the same command to resume"
    assert (str(stop.value), stop.value.exit_code) == (said, 143)
    assert _said(tmp_path / "run")[-1] == said
    assert (tmp_path / "run/checkpoints/step_00000003.pt").is_file() and (tmp_path / "run/curves.png").is_file()


def _files(run: Path) -> dict[str, tuple[int, bytes]]:
    """Every file of the run but its lock (which names the last process that held it), with its time and bytes."""
    files = [f for f in run.rglob("*") if f.is_file() and f.name != ".lock"]
    return {str(f.relative_to(run)): (f.stat().st_mtime_ns, f.read_bytes()) for f in files}


def test_a_finished_run_run_again_says_so_and_changes_nothing(tmp_path, capsys):
    run, config = tmp_path / "run", _config(tmp_path, "train.max_updates=4", "train.valid_every=2")
    result = loop.train(config, run)
    before = _files(run)
    capsys.readouterr()
    assert loop.train(config, run) == result
    assert loop.train(config, run) == result
    assert f"{run} finished at update 4; nothing to do" in capsys.readouterr().err
    assert _files(run) == before
    assert [r["step"] for r in _records(run, "valid")] == [2, 4]


def test_a_resume_with_another_learning_rate_uses_it_and_records_from_which_update(tmp_path, capsys):
    run = tmp_path / "run"
    loop.train(_config(tmp_path, "train.max_updates=6", "train.valid_every=0"), run)
    loop.train(_config(tmp_path, "train.max_updates=9", "train.valid_every=0", "train.lr=1e-3"), run)
    lrs = [6e-4, 1.2e-3, 1.8e-3, 2.4e-3, 3e-3, 3e-3, 1e-3, 1e-3, 1e-3]  # warm-up to 3e-3, then 1e-3 from update 7
    assert [r["lr"] for r in _records(run, "train")] == pytest.approx(lrs)
    err = capsys.readouterr().err
    assert "train.lr 0.003 -> 0.001 from update 7" in err and "train.max_updates 6 -> 9 from update 7" in err
    header = (run / "config.yaml").read_text().splitlines()[:4]
    assert header[2:] == ["#   train.lr 0.003 -> 0.001 from update 7", "#   train.max_updates 6 -> 9 from update 7"]
    assert load_config(run / "config.yaml", []).train.lr == 1e-3  # the header is comments
    latest = load_checkpoint(run / "checkpoints" / CheckpointStore(run).index["latest"])
    assert [(c["key"], c["update"]) for c in latest["changes"]] == [("train.lr", 7), ("train.max_updates", 7)]
    loop.train(_config(tmp_path, "train.max_updates=12", "train.valid_every=0", "train.lr=1e-3"), run)
    latest = load_checkpoint(run / "checkpoints" / CheckpointStore(run).index["latest"])
    assert [(c["key"], c["update"]) for c in latest["changes"]][2:] == [("train.max_updates", 10)]  # kept, added to


def test_a_resume_with_other_betas_uses_them(tmp_path):
    run = tmp_path / "run"
    loop.train(_config(tmp_path, "train.max_updates=2", "train.valid_every=0"), run)
    loop.train(_config(tmp_path, "train.max_updates=3", "train.valid_every=0", "train.betas=[0.8,0.95]"), run)
    latest = load_checkpoint(run / "checkpoints" / CheckpointStore(run).index["latest"])
    assert [tuple(group["betas"]) for group in latest["optimizer"]["param_groups"]] == [(0.8, 0.95)]


def test_a_key_that_cannot_change_mid_run_is_refused_before_anything_is_written(tmp_path):
    run = tmp_path / "run"
    loop.train(_config(tmp_path, "train.max_updates=2", "train.valid_every=0"), run)
    before = _files(run)
    with pytest.raises(TformerError, match="cannot change mid-run: train.best_metric"):
        loop.train(_config(tmp_path, "train.max_updates=4", "train.valid_every=0", "train.best_metric=loss"), run)
    assert _files(run) == before


def _nan_from(monkeypatch, call: int) -> None:
    real_loss = ClassifierTask.loss_on
    calls = [0]

    def flaky(self, model, *inputs):
        calls[0] += 1
        loss, stats = real_loss(self, model, *inputs)
        if calls[0] >= call:
            return loss * float("nan"), type(stats)(float("nan"), stats.correct, stats.count)
        return loss, stats

    monkeypatch.setattr(ClassifierTask, "loss_on", flaky)


def test_the_non_finite_stop_names_the_last_checkpoint(tmp_path, monkeypatch):
    _nan_from(monkeypatch, 4)
    config = _config(tmp_path, "train.max_nonfinite=2", "train.valid_every=2")
    with pytest.raises(TformerError) as stop:
        loop.train(config, tmp_path / "run")
    assert str(stop.value).endswith(f"the last good checkpoint is {tmp_path / 'run/checkpoints/step_00000002.pt'}")


def test_the_non_finite_stop_says_when_there_is_no_checkpoint(tmp_path, monkeypatch):
    _nan_from(monkeypatch, 1)
    with pytest.raises(TformerError) as stop:
        loop.train(_config(tmp_path, "train.max_nonfinite=2", "train.valid_every=2"), tmp_path / "run")
    assert str(stop.value).endswith("check the data; no checkpoint was saved yet")


@pytest.fixture(scope="module")
def translation(prepared_pairs):
    """`overrides -> Config` for a prepared corpus of 60 pairs (50 to train): the target is the source reversed."""
    rng = random.Random(0)
    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))) for _ in range(60)]
    pairs = [(s, " ".join(reversed(s.split()))) for s in sentences]
    return prepared_pairs(pairs, 50, "train.max_tokens=128", "run.threads=1")


def test_validation_writes_the_translations_it_scored_and_shows_two(translation, tmp_path, monkeypatch):
    run = tmp_path / "run"
    config = translation("train.max_updates=2", "train.valid_every=2", "train.valid_bleu_lines=5")
    result = loop.train(config, run)
    hyps = (run / "valid_00000002.hyp").read_text().splitlines()
    assert len(hyps) == 5
    valid = config.data.valid
    sources = Path(f"{valid}.en").read_text().splitlines()[:5]
    references = Path(f"{valid}.de").read_text().splitlines()[:5]
    assert result["bleu"] == pytest.approx(float(bleu_chrf(hyps, references)["bleu"]))  # the file is what was scored
    said = _said(run)
    at = said.index(next(line for line in said if line.startswith("  sample 1  source:")))
    assert said[at : at + 6] == [
        f"  sample 1  source:     {sources[0]}",
        f"            reference:  {references[0]}",
        f"            hypothesis: {hyps[0]}",
        f"  sample 2  source:     {sources[1]}",
        f"            reference:  {references[1]}",
        f"            hypothesis: {hyps[1]}",
    ]
    assert said[at + 6] == f"  all 5 scored translations: {run / 'valid_00000002.hyp'}"


def test_without_validation_bleu_there_are_no_translations(translation, tmp_path):
    loop.train(translation("train.max_updates=2", "train.valid_every=2"), tmp_path / "run")
    assert not list((tmp_path / "run").glob("valid_*.hyp"))
    assert not any("sample" in line for line in _said(tmp_path / "run"))


def test_each_resume_is_recorded_in_the_checkpoints_for_the_curves(tmp_path):
    run = tmp_path / "run"
    for updates in (3, 6, 9):
        loop.train(_config(tmp_path, f"train.max_updates={updates}", "train.valid_every=0"), run)
    latest = load_checkpoint(run / "checkpoints" / CheckpointStore(run).index["latest"])
    assert latest["resumes"] == [3, 6]
