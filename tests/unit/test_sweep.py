"""The sweep's grid, names, bad settings, resume rule and table (tformer_cli/sweep.py), without training."""

import csv
import itertools
import json
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from tformer_cli.errors import ConfigError, TformerError
from tformer_cli.files import write_json
from tformer_cli.run.layout import SWEEP_RECORD, TRAIN_LOG
from tformer_cli.sweep import (
    Setting,
    _what_trains,
    columns,
    expand_grid,
    is_finished,
    markdown,
    one_at_a_time,
    parse_settings,
    plan,
    result_row,
    run_name,
    split_values,
    table_name,
    write_csv,
    write_curves,
)

TINY = Path(__file__).parents[2] / "recipes" / "tiny_classifier.yaml"


def test_values_split_at_top_level_commas_only():
    assert split_values("1e-3,3e-3") == ["1e-3", "3e-3"]
    assert split_values("[0.9,0.98],[0.9,0.999]") == ["[0.9,0.98]", "[0.9,0.999]"]
    assert split_values("'a,b',\"c,d\",{x: 1, y: 2}") == ["'a,b'", '"c,d"', "{x: 1, y: 2}"]
    assert split_values("5e-4") == ["5e-4"]


def test_settings_keep_their_order_and_one_value_is_fixed():
    settings = parse_settings(["train.lr=1e-3,3e-3", "train.epochs=2", "train.betas=[0.9,0.98]"])
    assert settings == [
        Setting("train.lr", ("1e-3", "3e-3")),
        Setting("train.epochs", ("2",)),
        Setting("train.betas", ("[0.9,0.98]",)),
    ]
    assert [s.swept for s in settings] == [True, False, False]


def test_the_grid_is_the_cartesian_product_first_key_slowest():
    settings = parse_settings(["a=1,2", "fixed=x", "b=p,q,r"])
    grid = expand_grid(settings)
    assert grid == [
        {"a": "1", "fixed": "x", "b": "p"},
        {"a": "1", "fixed": "x", "b": "q"},
        {"a": "1", "fixed": "x", "b": "r"},
        {"a": "2", "fixed": "x", "b": "p"},
        {"a": "2", "fixed": "x", "b": "q"},
        {"a": "2", "fixed": "x", "b": "r"},
    ]
    assert [list(point) for point in grid] == [["a", "fixed", "b"]] * 6  # each point lists the keys as given
    assert expand_grid([]) == [{}]  # no setting: one run, of the recipe as it is


def test_one_at_a_time_varies_each_key_alone_from_the_first_values():
    settings = parse_settings(["a=1,2", "fixed=x", "b=p,q,r"])
    assert one_at_a_time(settings) == [
        {"a": "1", "fixed": "x", "b": "p"},  # every key at its first value: the base of the ablation
        {"a": "2", "fixed": "x", "b": "p"},
        {"a": "1", "fixed": "x", "b": "q"},
        {"a": "1", "fixed": "x", "b": "r"},
    ]  # 1 + (2-1) + (3-1) runs, each a point of the grid
    assert all(point in expand_grid(settings) for point in one_at_a_time(settings))
    assert one_at_a_time(parse_settings(["fixed=x"])) == [{"fixed": "x"}]


def test_an_ablation_plans_the_grids_names_and_its_own_table(tmp_path):
    args = ["model.d_ff=32,64", "train.lr=1e-3,3e-3", f"run.out_dir={tmp_path}"]
    ablation, grid = plan(TINY, args, ablation=True), plan(TINY, args)
    assert [p.name for p in ablation.points] == [
        "tiny_classifier,model.d_ff=32,train.lr=1e-3",
        "tiny_classifier,model.d_ff=64,train.lr=1e-3",
        "tiny_classifier,model.d_ff=32,train.lr=3e-3",
    ]
    assert {p.name for p in ablation.points} < {p.name for p in grid.points}  # finished runs are shared
    assert [(p.config.model.d_ff, p.config.train.lr) for p in ablation.points] == [(32, 1e-3), (64, 1e-3), (32, 3e-3)]
    assert ablation.table == tmp_path / "sweep_tiny_classifier,model.d_ff,train.lr,one-at-a-time"
    assert grid.table == tmp_path / "sweep_tiny_classifier,model.d_ff,train.lr"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train.lr"], "sweep setting 'train.lr': expected key=a,b,c"),
        (["=1,2"], "sweep setting '=1,2': expected key=a,b,c"),
        (["train.lr=1,2", "train.lr=3"], "train.lr is given twice"),
        (["train.lr=1", " train.lr=2"], "train.lr is given twice"),
        (["train.lr="], "sweep setting 'train.lr=': no value"),
        (["train.lr=1,,2"], "an empty value between commas"),
        (["train.lr=1,"], "an empty value between commas"),
        (["train.lr=1,2,1"], "'1' is listed twice"),
        (["run.name=a,b"], "run.name cannot be swept"),
        (["run.out_dir=a,b"], "run.out_dir cannot be swept"),
    ],
)
def test_bad_settings_are_one_line_errors(args, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        parse_settings(args)
    assert "\n" not in str(caught.value)


def test_a_name_reads_as_the_settings_given():
    assert run_name("tiny", {"train.lr": "5e-4", "model.dropout": "0.1"}) == "tiny,train.lr=5e-4,model.dropout=0.1"
    assert run_name("tiny", {}) == "tiny"


def test_odd_characters_make_one_safe_folder_name_that_reads_back():
    value = "a/b c,d=e%f\\g'[1,2]'é\n"
    name = run_name("my run", {"data.train": value})
    assert set(name) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-~+%,=")
    assert name.count(",") == 1 and name.count("=") == 1  # only the separators
    base, setting = name.split(",")
    assert unquote(base) == "my run" and unquote(setting.split("=")[1]) == value


def test_different_settings_never_share_a_name():
    values = ["1", "1,x=2", "1%2Cx%3D2", "a/b", "a%2Fb", "a b", "a+b", "", ",", "=", "%", "é", "E", "1.0", "1e0"]
    settings = [{"k": v} for v in values]
    settings += [{"k": "1", "x": "2"}, {"k": "1", "x": "2,y=3"}, {"k": "1", "x": "2", "y": "3"}]
    settings += [{"k": a, "x": b} for a, b in itertools.product(["a", "a,x=b"], ["b", ""])]
    names = [run_name("base", s) for s in settings]
    assert len(set(names)) == len(names)
    assert len({run_name(b, {"x": "1"}) for b in ("a", "a,x=1", "a%2Cx%3D1")}) == 3  # nor different bases


def test_the_table_is_named_after_the_fixed_values_and_the_swept_keys():
    settings = parse_settings(["train.lr=1e-3,3e-3", "train.epochs=2", "run.threads=1", "model.d_ff=32,64"])
    assert table_name("tiny", settings) == "sweep_tiny,train.lr,train.epochs=2,model.d_ff"


def test_plan_names_and_validates_every_point(tmp_path):
    args = ["model.d_ff=32,64", f"run.out_dir={tmp_path}", "train.epochs=1", "run.threads=1,2"]
    sweep = plan(TINY, args)
    names = [p.name for p in sweep.points]
    assert names == [
        "tiny_classifier,model.d_ff=32,train.epochs=1,run.threads=1",  # run.out_dir: not in the name
        "tiny_classifier,model.d_ff=32,train.epochs=1,run.threads=2",  # run.threads: swept, so named
        "tiny_classifier,model.d_ff=64,train.epochs=1,run.threads=1",
        "tiny_classifier,model.d_ff=64,train.epochs=1,run.threads=2",
    ]
    last = sweep.points[-1]
    assert last.config.run.name == last.name and last.run_dir == tmp_path / last.name
    assert (last.config.model.d_ff, last.config.train.epochs, last.config.run.threads) == (64, 1, 2)
    assert last.swept == {"model.d_ff": "64", "run.threads": "2"}
    assert last.overrides[-1] == f"run.name={last.name}"
    assert sweep.table == tmp_path / "sweep_tiny_classifier,model.d_ff,train.epochs=1,run.threads"


def test_a_fixed_run_name_is_the_base(tmp_path):
    sweep = plan(TINY, ["run.name=lr", "train.lr=1e-3,3e-3"])
    assert [p.name for p in sweep.points] == ["lr,train.lr=1e-3", "lr,train.lr=3e-3"]
    assert [p.overrides.count(f"run.name={p.name}") for p in sweep.points] == [1, 1]
    assert not any(o == "run.name=lr" for p in sweep.points for o in p.overrides)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train.lrr=1,2"], re.escape("override 'train.lrr=1': unknown key 'train.lrr'; did you mean 'train.lr'?")),
        (["model.d_model=32,30"], "run tiny_classifier,model.d_model=30: .*must be a multiple of model.n_heads"),
        (["train.epochs=1,two"], "run tiny_classifier,train.epochs=two: .*train.epochs expects int"),
        ([f"model.d_ff={'1' * 300}"], "longer than the 255 bytes"),
    ],
)
def test_every_point_is_validated_before_anything_runs(tmp_path, args, message):
    with pytest.raises(ConfigError, match=message) as caught:
        plan(TINY, [*args, f"run.out_dir={tmp_path}"])
    assert "\n" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def _finish(point, status="finished", config=None, seconds=12.5, parameters=1234):
    point.run_dir.mkdir(parents=True, exist_ok=True)
    record = {"status": status, "exit_code": 0 if status == "finished" else 1, "seconds": seconds}
    record |= {"parameters": parameters, "config": _what_trains(config or point.config)}
    write_json(point.run_dir / SWEEP_RECORD, record)


def test_only_a_run_finished_with_the_same_config_counts_as_finished(tmp_path):
    point = plan(TINY, [f"run.out_dir={tmp_path}", "train.lr=1e-3"]).points[0]
    assert not is_finished(point)  # no record
    _finish(point, status="failed")
    assert not is_finished(point)
    _finish(point, config=plan(TINY, [f"run.out_dir={tmp_path}", "train.lr=2e-3"]).points[0].config)
    assert not is_finished(point)  # finished with another config
    _finish(point)
    assert is_finished(point)
    moved = plan(TINY, [f"run.out_dir={tmp_path}", "train.lr=1e-3", "run.device=cpu", "run.threads=1"]).points[0]
    assert moved.run_dir == point.run_dir and is_finished(moved)  # where it runs is not what it trains


def test_an_unreadable_record_is_an_error_not_a_rerun(tmp_path):
    point = plan(TINY, [f"run.out_dir={tmp_path}"]).points[0]
    point.run_dir.mkdir(parents=True)
    (point.run_dir / SWEEP_RECORD).write_text('{"status": "finished"')
    with pytest.raises(TformerError, match=f"{SWEEP_RECORD} is not a sweep record; delete it"):
        is_finished(point)


def _fake_run(point, valid, best_step):
    """A finished run's files as training writes them: metrics.jsonl and checkpoints/index.json."""
    _finish(point)
    lines = [{"time": 0.1, "split": "train", "step": 1, "epoch": 0, "loss": 9.0, "accuracy": 0.0, "lr": 1e-3}]
    lines += [{"time": 0.2, "split": "valid", "epoch": 1, **record} for record in valid]
    (point.run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (point.run_dir / "checkpoints").mkdir()
    entry = {"step": best_step, "sha256": "0" * 64, "metric": 0.5}
    write_json(point.run_dir / "checkpoints" / "index.json", {"latest": None, "files": {"best.pt": entry}})


def test_rows_hold_the_final_and_the_best_validation_and_a_failure(tmp_path):
    sweep = plan(TINY, [f"run.out_dir={tmp_path}", "model.d_ff=32,64"])
    done, failed = sweep.points
    valid = [
        {"step": 10, "loss": 0.9, "accuracy": 0.6},
        {"step": 20, "loss": 0.5, "accuracy": 0.75},  # best.pt's: not the last, nor the lowest loss
        {"step": 30, "loss": 0.4, "accuracy": 0.7},
    ]
    _fake_run(done, valid, best_step=20)
    _finish(failed, status="failed", seconds=3.0, parameters=None)
    rows = [result_row(point) for point in sweep.points]
    assert rows[0] == {
        "model.d_ff": "32",
        "status": "finished",
        "steps": 30,
        "final_loss": 0.4,
        "final_accuracy": 0.7,
        "best_step": 20,
        "best_loss": 0.5,
        "best_accuracy": 0.75,
        "wall_s": 12.5,
        "parameters": 1234,
        "log": str(done.run_dir / TRAIN_LOG),
    }
    assert rows[1] == {
        "model.d_ff": "64",
        "status": "failed (exit 1)",
        "wall_s": 3.0,
        "log": str(failed.run_dir / TRAIN_LOG),
    }
    header = columns(["model.d_ff"], rows[::-1])  # the failed row first: the columns still come in their order
    assert header == [
        "model.d_ff",
        "status",
        "steps",
        "final_loss",
        "final_accuracy",
        "best_step",
        "best_loss",
        "best_accuracy",
        "wall_s",
        "parameters",
        "log",
    ]
    text = markdown("tformer sweep x", header, rows).splitlines()
    assert text[0] == "`tformer sweep x`"
    assert text[2] == "| " + " | ".join(header) + " |" and text[3] == "|" + "---|" * len(header)
    assert (
        text[4] == f"| 32 | finished | 30 | 0.4000 | 0.7000 | 20 | 0.5000 | 0.7500 | 12.5 | 1,234 | {rows[0]['log']} |"
    )
    assert text[5] == f"| 64 | failed (exit 1) |  |  |  |  |  |  | 3.0 |  | {rows[1]['log']} |"
    write_csv(tmp_path / "t.csv", header, rows)
    read = list(csv.DictReader((tmp_path / "t.csv").open()))
    assert read[0]["final_loss"] == "0.4" and read[0]["best_accuracy"] == "0.75" and read[0]["parameters"] == "1234"
    assert read[1]["status"] == "failed (exit 1)" and read[1]["final_loss"] == ""


def test_a_bar_in_a_value_does_not_break_the_markdown_row():
    text = markdown("c", ["k", "status"], [{"k": "a|b", "status": "finished"}])
    assert text.splitlines()[-1] == "| a\\|b | finished |"


def test_a_damaged_metrics_line_is_named(tmp_path):
    point = plan(TINY, [f"run.out_dir={tmp_path}"]).points[0]
    _fake_run(point, [{"step": 10, "loss": 0.9, "accuracy": 0.6}], best_step=10)
    with (point.run_dir / "metrics.jsonl").open("a") as handle:
        handle.write('{"split": "valid", "st\n')
    with pytest.raises(TformerError, match=r"metrics.jsonl:3: not a JSON record"):
        result_row(point)


def test_the_curves_picture_has_one_line_per_run_and_split(tmp_path, monkeypatch):
    import tformer_cli.plots as plots

    sweep = plan(TINY, [f"run.out_dir={tmp_path}", "model.d_ff=32,64,128"])
    first, second, never_run = sweep.points
    _fake_run(first, [{"step": 10, "loss": 0.9, "accuracy": 0.6}, {"step": 20, "loss": 0.5, "accuracy": 0.7}], 20)
    _fake_run(second, [{"step": 10, "loss": 0.8, "accuracy": 0.6}], 10)
    drawn = {}

    def keep(fig, out, dpi):  # what would be saved: each panel's lines, by label, with their points
        drawn.update({ax.get_title(): {ln.get_label(): ln.get_xydata().tolist() for ln in ax.lines} for ax in fig.axes})

    monkeypatch.setattr(plots, "_save", keep)
    assert write_curves(sweep.points, tmp_path / "curves.png", "tformer sweep ...")
    assert drawn["validation loss"] == {"model.d_ff=32": [[10, 0.9], [20, 0.5]], "model.d_ff=64": [[10, 0.8]]}
    assert drawn["training loss"] == {"model.d_ff=32": [[1, 9.0]], "model.d_ff=64": [[1, 9.0]]}
    assert not write_curves([never_run], tmp_path / "none.png", "")  # no metrics anywhere: no picture
    monkeypatch.undo()
    assert write_curves(sweep.points, tmp_path / "curves.png", "title")
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_long_sweep_command_is_wrapped_in_the_pictures_title_not_cut(tmp_path, monkeypatch):
    import tformer_cli.plots as plots

    sweep = plan(TINY, [f"run.out_dir={tmp_path}", "model.d_ff=32,64"])
    _fake_run(sweep.points[0], [{"step": 10, "loss": 0.9, "accuracy": 0.6}], 10)
    titles = []
    monkeypatch.setattr(plots, "_save", lambda fig, out, dpi: titles.append(fig._suptitle.get_text()))
    command = "tformer sweep recipes/wmt14_small.yaml " + " ".join(f"train.key_{i}=value_{i}" for i in range(30))
    assert write_curves(sweep.points, tmp_path / "curves.png", command)
    lines = titles[0].split("\n")
    assert len(lines) > 1 and max(map(len, lines)) <= 170
    assert " ".join(lines) == command  # every word kept


@pytest.mark.parametrize("kind", ["lm", "lstm"])
def test_the_parameters_of_a_sessions_run_are_counted_as_training_builds_them(kind, tmp_path, monkeypatch):
    """Generated sessions are never prepared: their vocabulary is the item count, not a tokenizer's."""
    import torch

    from tformer_cli.config import load_config
    from tformer_cli.sweep import parameter_count
    from tformer_cli.train.tasks import make_task

    monkeypatch.chdir(tmp_path)  # no data/ folder here
    recipe = Path(__file__).parents[2] / "recipes" / "streamrec_transformer.yaml"
    config = load_config(
        recipe,
        [
            f"model.kind={kind}",
            "data.sessions.n_sessions=70",
            "data.sessions.n_valid=10",
            "data.sessions.n_test=10",
            "data.sessions.n_items=40",
        ],
    )
    model = make_task(config).build_model()
    assert parameter_count(config) == sum(p.numel() for p in model.parameters()) > 0
    assert model.lm_head.out_features == 41 and isinstance(model.lm_head.weight, torch.Tensor)
