"""bench/time_to_bleu.py: both systems trained for the same seconds on made-up data, scored at every mark, and the
table, plot and JSON written; the schedule scaled to the budget; the peer's schedule and weight smoothing as
Marian's."""

import json
import math
import sys
from pathlib import Path

import pytest
import yaml
from sacrebleu.metrics import BLEU

BENCH = Path(__file__).parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import _peers  # noqa: E402
import time_to_bleu  # noqa: E402

from tformer_cli.config import load_config  # noqa: E402


@pytest.mark.slow  # trains both systems on a wall clock
def test_smoke_run_scores_both_systems_at_every_mark(tmp_path, monkeypatch):
    autocasts = []  # the precision of each of the peer's forward passes
    autocast = _peers.autocast
    monkeypatch.setattr(_peers, "autocast", lambda precision: autocasts.append(precision) or autocast(precision))
    out = tmp_path / "report" / "ttb.md"
    args = ["--smoke", "--work", str(tmp_path / "work"), "--out", str(out), "--tformer-average", "0", "2"]
    # tformer trains on the CPU on every machine, as the peer does (it translates there already): run.device auto
    # would take a GPU where there is one. A recipe override, first: --tformer-average would take it as an N.
    report = time_to_bleu.main(["run.device=cpu", *args])

    assert [system.error for system in report.systems if system.error] == []  # a failing system's row says why
    names = [system.name for system in report.systems]
    assert names == ["tformer", "tformer, last 2 checkpoints averaged", "HF MarianMTModel"]
    references = (tmp_path / "work" / "corpus" / "newstest2014.de").read_text().splitlines()
    for system in report.systems:
        assert [m.minutes for m in system.marks] == time_to_bleu.SMOKE_MINUTES
        assert system.parameters > 0 and system.tokens_per_s > 0
        for earlier, mark in zip([None, *system.marks[:-1]], system.marks, strict=True):
            assert mark.seconds >= mark.minutes * 60  # trained until the clock passed the mark, not longer by far
            assert mark.seconds < mark.minutes * 60 + 5
            assert mark.updates > (earlier.updates if earlier else 0)  # the later mark went on training
            hypotheses = Path(mark.hypotheses).read_text().splitlines()
            assert len(hypotheses) == len(references)  # one output line per test line
            assert math.isclose(mark.bleu, BLEU().corpus_score(hypotheses, [references]).score)
            assert math.isclose(mark.bleu_lc, BLEU(lowercase=True).corpus_score(hypotheses, [references]).score)
    averaged = report.systems[1]
    assert [m.averaged for m in averaged.marks] == [1, 2]  # only one step checkpoint kept at the first mark
    assert report.systems[0].marks[-1].updates == averaged.marks[-1].updates  # one run, two ways to decode it

    # the peer ran at the precision the tformer run chose and recorded
    recorded = yaml.safe_load((tmp_path / "work" / "tformer" / "config.yaml").read_text())["train"]["precision"]
    assert set(autocasts) == {recorded} and ("bf16 autocast" in report.systems[2].settings) == (recorded == "bf16")

    assert report.signatures["cased"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert "case:lc" in report.signatures["lowercased"]
    table = out.read_text()
    for name in names:
        assert f"| {name} |" in table
    assert "BLEU at 0.03 min | BLEU at 0.06 min" in table and "fewer averaged: 1 at 0.03 min" in table
    saved = json.loads(out.with_suffix(".json").read_text())
    assert [[m["minutes"] for m in s["marks"]] for s in saved["systems"]] == [time_to_bleu.SMOKE_MINUTES] * 3
    assert out.with_suffix(".png").stat().st_size > 0


def test_the_rate_is_the_median_of_the_logged_updates_and_none_logged_is_an_error_naming_the_file(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"split": "train", "tokens_per_s": r} for r in (10.0, 30.0, 20.0)] + [{"split": "valid", "loss": 1.0}]
    metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert time_to_bleu.training_rate(metrics) == 20.0
    metrics.write_text(json.dumps(rows[-1]) + "\n")  # a run stopped before its first logged update
    with pytest.raises(RuntimeError, match="metrics.jsonl: no training update logged"):
        time_to_bleu.training_rate(metrics)


def test_the_schedule_is_scaled_to_the_budget_unless_given():
    config = load_config(None, ["train.max_updates=4800", "train.warmup_steps=400", "train.max_minutes=60"])
    assert time_to_bleu.scaled_schedule(config, [], 15) == ["train.max_updates=1200", "train.warmup_steps=100"]
    assert time_to_bleu.scaled_schedule(config, [], 60) == ["train.max_updates=4800", "train.warmup_steps=400"]
    assert time_to_bleu.scaled_schedule(config, ["train.warmup_steps=50"], 30) == ["train.max_updates=2400"]
    assert time_to_bleu.scaled_schedule(config, ["train.max_updates=10"], 30) == []
    with pytest.raises(SystemExit, match="give train.max_updates"):
        time_to_bleu.scaled_schedule(load_config(None), [], 30)


def test_the_peer_follows_marians_schedule_and_smoothing():
    assert [_peers.lr_factor(step, 400) for step in (1, 200, 400, 1600)] == [1 / 400, 0.5, 1.0, 0.5]
    import torch

    model = torch.nn.Linear(2, 1, bias=False)
    smoothed = _peers.Smoothed(model, floor=1e-4)
    with torch.no_grad():
        model.weight.fill_(1.0)
    start = smoothed.avg[0].clone()
    smoothed.update(0)  # decay max(1e-4, 1 - 1/10) = 0.9 at the first update
    assert torch.allclose(smoothed.avg[0], start + 0.9 * (1.0 - start))
    copy = smoothed.copy_of(model)
    assert torch.equal(copy.weight, smoothed.avg[0]) and not copy.training and model.weight.eq(1.0).all()


@pytest.mark.slow  # trains the peer until it has learnt a batch: many seconds
def test_the_peer_learns_a_batch_and_its_beam_search_returns_it():
    """tformer's batches (BOS-shifted decoder input, EOS-ended targets) fit Marian's forward, and `translate`
    (generate with tformer's special ids) gives back what the peer learnt."""
    import numpy as np
    import torch

    from tformer_cli.data.batching import pad_rows
    from tformer_cli.schema import DecodeConfig
    from tformer_cli.tokenizer import BOS_ID, EOS_ID

    torch.manual_seed(0)
    config = load_config(None, ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64"])
    model = _peers.marian_model(config, vocab=20)
    rng = np.random.default_rng(1)
    targets = [np.append(rng.integers(4, 20, n), EOS_ID) for n in (3, 5, 4, 6)]
    sources = [np.append(t[-2::-1], EOS_ID) for t in targets]  # the target reversed
    batch = (pad_rows(sources), pad_rows([np.insert(t[:-1], 0, BOS_ID) for t in targets]), pad_rows(targets))
    settings = _peers.PeerSettings(lr=1e-2)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr, betas=settings.betas, eps=settings.eps)
    for _ in range(150):
        assert _peers.update(model, optimizer, [batch], settings, "bf16") == sum(len(t) for t in targets)

    class Ids:  # the token ids as the "text"
        def encode(self, lines):
            return [[int(i) for i in line.split()] for line in lines]

        def decode(self, ids):
            return " ".join(str(i) for i in ids if i not in (0, BOS_ID, EOS_ID))

    lines = [" ".join(str(i) for i in s[:-1]) for s in sources]
    translated = _peers.translate(model.eval(), Ids(), lines, DecodeConfig(), 4, settings, "fp32")
    assert translated == [" ".join(str(i) for i in t[:-1]) for t in targets]


def test_the_report_names_no_folder_of_the_machine(tmp_path, monkeypatch):
    """Paths in the JSON: under the data root as $TFORMER_DATA/..., under the checkout relative to it."""
    monkeypatch.setenv("TFORMER_DATA", str(tmp_path / "data"))
    assert (
        time_to_bleu.shown(tmp_path / "data" / "multi30k" / "test_2016_flickr")
        == "$TFORMER_DATA/multi30k/test_2016_flickr"
    )
    assert (
        time_to_bleu.shown(BENCH.parent / "runs" / "time_to_bleu" / "marian_15min.de")
        == "runs/time_to_bleu/marian_15min.de"
    )
    assert time_to_bleu.shown(tmp_path / "elsewhere") == str((tmp_path / "elsewhere").resolve())
    monkeypatch.delenv("TFORMER_DATA")
    assert time_to_bleu.shown(tmp_path / "data" / "x") == str((tmp_path / "data" / "x").resolve())


@pytest.mark.slow  # trains on a wall clock
def test_side_by_side_runs_each_system_in_a_process_of_its_own_at_once(tmp_path, monkeypatch):
    started = []  # each process as it starts, and whether the ones before it were still running then
    popen = time_to_bleu.subprocess.Popen

    def recorded(cmd, *args, **kwargs):
        proc = popen(cmd, *args, **kwargs)
        if any(str(part).endswith("time_to_bleu.py") for part in cmd):  # a system's process (not platform's uname)
            proc.running_before = [earlier.poll() is None for earlier in started]
            started.append(proc)
        return proc

    monkeypatch.setattr(time_to_bleu.subprocess, "Popen", recorded)
    work, out = tmp_path / "work", tmp_path / "ttb.md"
    args = ["--smoke", "--side-by-side", "--threads", "1", "--work", str(work), "--out", str(out)]
    report = time_to_bleu.main(["run.device=cpu", *args])

    assert len(started) == 2 and started[1].running_before == [True]  # the peer began while tformer was training
    assert [system.error for system in report.systems if system.error] == []
    assert [system.name for system in report.systems] == ["tformer", "HF MarianMTModel"]
    for folder in ("tformer", "marian"):  # the data this process prepared: neither checks it again, which would lock
        assert "prepare:" not in (work / folder / "time_to_bleu.log").read_text()  # it while the other reads it
        assert not (work / folder / "data").exists()
    references = (work / "corpus" / "newstest2014.de").read_text().splitlines()
    for system, folder in zip(report.systems, ("tformer", "marian"), strict=True):
        assert [m.minutes for m in system.marks] == time_to_bleu.SMOKE_MINUTES
        for mark in system.marks:
            hypotheses = Path(mark.hypotheses).read_text().splitlines()
            assert f"/{folder}/" in mark.hypotheses and len(hypotheses) == len(references)  # its own folder
            assert math.isclose(mark.bleu, BLEU().corpus_score(hypotheses, [references]).score)
    assert report.signatures["cased"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    table = out.read_text()
    assert "| tformer |" in table and "| HF MarianMTModel |" in table and "Side by side" in table
    assert "at the same time, 1 thread each" in table  # one thread, not "1 thread(s)" or "1 threads"


@pytest.mark.slow  # trains on a wall clock
def test_side_by_side_a_process_that_fails_is_a_row_saying_so_and_the_other_stands(tmp_path, monkeypatch):
    child_args = time_to_bleu.child_args

    def broken_tformer(args, bench, system, work):  # a setting its recipe refuses: it exits before any report
        return [*child_args(args, bench, system, work), *(["model.no_such_key=1"] if system == "tformer" else [])]

    monkeypatch.setattr(time_to_bleu, "child_args", broken_tformer)
    args = ["--smoke", "--side-by-side", "--threads", "1", "--work", str(tmp_path / "work")]
    report = time_to_bleu.main(["run.device=cpu", *args, "--out", str(tmp_path / "ttb.md")])

    tformer, marian = report.systems
    assert tformer.name == "tformer" and tformer.error.startswith("its process exited 1 with no report (log: ")
    assert "tformer/time_to_bleu.log" in tformer.error and not tformer.marks
    assert marian.error is None and [m.minutes for m in marian.marks] == time_to_bleu.SMOKE_MINUTES
    assert "| tformer | failed: its process exited 1" in (tmp_path / "ttb.md").read_text()


def test_the_machine_line_names_the_threads_once_in_good_grammar():
    one, two = time_to_bleu.describe_machine(1), time_to_bleu.describe_machine(2)
    assert one.count("thread") == 1 and "1 thread per system" in one
    assert two.count("thread") == 1 and "2 threads per system" in two
    assert one.count("torch") == 1 and "cores" in one


def sweep_row(system: str, lr: float, bleu: float | None) -> time_to_bleu.SweepRow:
    mark = None if bleu is None else time_to_bleu.Mark(15, 901.0, 100, bleu, bleu + 0.3, "hyp", 2.0)
    return time_to_bleu.SweepRow(system, lr, mark, None if mark else "its process exited 1")


def test_the_sweep_picks_each_systems_highest_validation_bleu():
    rows = [sweep_row("tformer", 3e-3, 20.0), sweep_row("tformer", 1e-3, 20.0), sweep_row("tformer", 2e-3, 19.0)]
    rows += [sweep_row("marian", 3e-4, 10.0), sweep_row("marian", 1e-3, 18.5), sweep_row("marian", 2e-3, None)]
    assert time_to_bleu.best_rates(rows) == {"tformer": 1e-3, "marian": 1e-3}  # a tie: the lower rate
    assert time_to_bleu.best_rates([sweep_row("marian", 1e-3, None)]) == {}  # every run failed: none chosen
    report = time_to_bleu.Report("m", "c", "model", "test (9 lines)", "t", {}, [15, 30], [], [], sweep=rows)
    report.sweep_set = "val (5 lines)"
    table = time_to_bleu.sweep_table(report)
    assert (
        "| tformer | 0.001 | **20.00 (20.30)** | 100 |" in table
        and "| tformer | 0.003 | 20.00 (20.30) | 100 |" in table
    )
    assert "| HF MarianMTModel | 0.002 | failed: its process exited 1 | |" in table
    assert any("stopped at its first mark, 15 minutes, then scored on val (5 lines)" in line for line in table)


@pytest.mark.parametrize(
    ("given", "error"),
    [
        (["--sweep-lr", "tformer", "1e-3", "2e-3", "--sweep-lr", "marian", "1e-3"], "as many rates"),
        (["--systems", "marian", "--sweep-lr", "tformer", "1e-3"], "the systems raced are marian"),
        (["--sweep-lr", "tformer"], "one or more learning rates > 0"),
        (["--sweep-lr", "tformer", "0"], "one or more learning rates > 0"),
        (["--sweep-lr", "tformer", "1e-3", "x=1"], "learning rates are numbers"),
    ],
)
def test_a_sweep_that_cannot_run_is_refused_in_one_line(given, error):
    with pytest.raises(SystemExit, match=error):
        time_to_bleu.parse(given)


def test_a_rounds_own_process_keeps_the_races_budget_and_scores_the_validation_set(tmp_path):
    args = time_to_bleu.parse(["--side-by-side", "--threads", "1", "--budget", "60", "--score-on", "valid"])
    bench = time_to_bleu.Bench(Path("r.yaml"), ["train.lr=0.002"], None, [15], tmp_path, 1, Path("v.en"), [])
    child = time_to_bleu.parse(time_to_bleu.child_args(args, bench, "tformer", tmp_path / "tformer"))
    assert (child.budget, child.score_on, child.minutes, child.overrides) == (60, "valid", [15], ["train.lr=0.002"])


@pytest.mark.slow  # trains on a wall clock
def test_the_sweep_scores_each_rate_on_validation_and_races_the_best(tmp_path, monkeypatch):
    picked = {"tformer": 3e-3, "marian": 1e-3}  # the rates the sweep's (made-up) scores favour
    monkeypatch.setattr(time_to_bleu, "best_rates", lambda rows: picked if rows else {})
    work, out = tmp_path / "work", tmp_path / "ttb.md"
    sweep = ["--sweep-lr", "tformer", "1e-3", "3e-3", "--sweep-lr", "marian", "1e-3", "2e-3"]
    report = time_to_bleu.main(["run.device=cpu", "--smoke", "--work", str(work), "--out", str(out), *sweep])

    assert [(row.system, row.lr) for row in report.sweep] == [
        ("tformer", 1e-3), ("marian", 1e-3), ("tformer", 3e-3), ("marian", 2e-3)
    ]  # fmt: skip
    assert [row.error for row in report.sweep] == [None] * 4
    for i, row in enumerate(report.sweep):
        assert row.mark.minutes == time_to_bleu.SMOKE_MINUTES[0]  # stopped at the race's first mark
        valid = (work / "sweep" / f"round{i // 2 + 1}" / "corpus" / "newstest2013.de").read_text().splitlines()
        assert len(Path(row.mark.hypotheses).read_text().splitlines()) == len(valid)  # scored on validation
    for i, lr in enumerate((1e-3, 3e-3)):  # each round's tformer trained at its own rate
        config = yaml.safe_load((work / "sweep" / f"round{i + 1}" / "tformer" / "config.yaml").read_text())
        assert config["train"]["lr"] == lr
    raced = yaml.safe_load((work / "tformer" / "config.yaml").read_text())
    assert raced["train"]["lr"] == picked["tformer"]  # the race took the sweep's rates
    assert "lr 0.001," in report.systems[1].settings  # the peer's
    assert [m.minutes for m in report.systems[0].marks] == time_to_bleu.SMOKE_MINUTES  # the race ran on
    assert "Learning rates swept before the race" in out.read_text()
    assert len(json.loads(out.with_suffix(".json").read_text())["sweep"]) == 4
