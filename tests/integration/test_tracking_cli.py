"""run.report_to: a tiny run's metrics in MLflow (a folder store) and in W&B (offline), read back from their files;
a resumed run goes on in the same record; a misspelt or missing backend is one line before anything is written."""

import json
import struct

import pytest
from tiny_models import CPU
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.train import tracking

runner = CliRunner()
RECIPE = "recipes/tiny_classifier.yaml"


def _train(out, *overrides):
    result = runner.invoke(app, ["train", RECIPE, *CPU, f"run.out_dir={out}", *overrides])
    assert result.exit_code == 0, result.output + str(result.exception)
    return out / "tiny_classifier"


def _jsonl(run_dir, split):
    """{step: {metric: value}} of metrics.jsonl's records of `split`."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    skip = ("split", "step", "epoch", "time")
    return {r["step"]: {k: v for k, v in r.items() if k not in skip} for r in records if r["split"] == split}


def test_mlflow_folder_store_holds_the_runs_metrics_and_a_resume_goes_on_in_it(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "store").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run_dir = _train(tmp_path, "run.report_to=mlflow", "train.epochs=1")
    run_id = json.loads((run_dir / "tracking.json").read_text())["mlflow"]["run_id"]
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["train.lr"] == "0.003" and run.data.params["run.report_to"] == "mlflow"
    for split in ("train", "valid"):
        expected = _jsonl(run_dir, split)
        for key in expected[max(expected)]:
            history = {m.step: m.value for m in client.get_metric_history(run_id, f"{split}/{key}")}
            assert history == pytest.approx({step: values[key] for step, values in expected.items()})

    _train(tmp_path, "run.report_to=mlflow", "train.epochs=2")  # resumed: the same MLflow run goes on
    assert json.loads((run_dir / "tracking.json").read_text())["mlflow"]["run_id"] == run_id
    steps = {m.step for m in client.get_metric_history(run_id, "train/loss")}
    assert steps == set(_jsonl(run_dir, "train"))
    assert client.get_run(run_id).info.status == "FINISHED"


def _wandb_records(path):
    """The history rows and the config of a W&B offline run file (a LevelDB-style log of protobuf records)."""
    from wandb.proto import wandb_internal_pb2

    data, block, at, pending, rows, config = path.read_bytes(), 32768, 7, b"", [], {}
    while at + 7 <= len(data):
        left = block - at % block
        if left < 7:  # a block's tail too short for a header is padding
            at += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[at : at + 7])
        if length == 0 and kind == 0:
            at += left
            continue
        pending, at = pending + data[at + 7 : at + 7 + length], at + 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
                )
            elif record.WhichOneof("record_type") == "run":
                config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
    return rows, config


def test_wandb_offline_run_files_hold_the_runs_metrics(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_files"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wandb_files").mkdir()
    run_dir = _train(tmp_path, "run.report_to=[wandb]", "train.epochs=1")
    run_id = json.loads((run_dir / "tracking.json").read_text())["wandb"]["id"]
    (offline,) = (tmp_path / "wandb_files" / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")
    rows, config = _wandb_records(offline)
    assert config["train"]["lr"] == 0.003
    logged = {row["_step"]: row for row in rows}
    for split in ("train", "valid"):
        for step, values in _jsonl(run_dir, split).items():
            assert {k: logged[step][f"{split}/{k}"] for k in values} == pytest.approx(values)


def test_a_misspelt_backend_is_refused_with_a_suggestion(tmp_path):
    result = runner.invoke(app, ["train", RECIPE, *CPU, f"run.out_dir={tmp_path}", "run.report_to=mlfow"])
    assert result.exit_code == 1
    assert "run.report_to" in result.output and "did you mean 'mlflow'?" in result.output
    result = runner.invoke(app, ["check", RECIPE, "run.report_to=[wandb, tensorbord]"])
    assert result.exit_code == 1 and "did you mean 'tensorboard'?" in result.output


def test_a_backend_not_installed_names_its_extra_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking, "_installed", lambda module: module != "wandb")
    result = runner.invoke(app, ["train", RECIPE, *CPU, f"run.out_dir={tmp_path}", "run.report_to=[mlflow, wandb]"])
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: run.report_to: wandb needs the wandb package") and "tformer-cli[wandb]" in line
    assert not (tmp_path / "tiny_classifier").exists()


def test_auto_is_tensorboard_where_installed_and_none_is_nothing(monkeypatch):
    monkeypatch.setattr(tracking, "_installed", lambda module: True)
    assert tracking.chosen("auto") == ("tensorboard",)
    assert tracking.chosen("none") == ()
    assert tracking.chosen(("mlflow", "wandb", "mlflow")) == ("mlflow", "wandb")
    monkeypatch.setattr(tracking, "_installed", lambda module: False)
    assert tracking.chosen("auto") == ()
