"""Where training's numbers go besides metrics.jsonl: TensorBoard, MLflow and Weights & Biases (`run.report_to`).

Each backend is an optional extra (`pip install "tformer-cli[mlflow]"`) and one small class with the same three
jobs: open the run's record (continuing it on a resume), take each metrics.jsonl record (`log`), and close it
(`close`). The loop knows only `Tracker`; which backends run is `run.report_to` (HF Trainer's `report_to`):

- `auto` (the default): TensorBoard when its package is installed, nothing otherwise.
- `none`, or one or a list of `tensorboard`, `mlflow`, `wandb`: a backend asked for by name whose package is
  missing stops the run before it starts, naming the extra to install.

A run's MLflow run id and W&B run id are kept in RUN/tracking.json, so that a resumed run goes on in the same
record. Records written after the checkpoint a run resumes from are written again (TensorBoard purges its own;
MLflow keeps both values of those steps; W&B drops the repeated steps).
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any, Protocol

from tformer_cli.errors import TformerError
from tformer_cli.files import write_json

REPORTERS = ("tensorboard", "mlflow", "wandb")
SETTINGS = ("auto", "none", *REPORTERS)  # what run.report_to takes (a list: of REPORTERS)
PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}  # the module each one imports
IDS = "tracking.json"  # in the run folder: the MLflow and W&B run ids a resume goes on with


class Tracker(Protocol):
    """One backend's record of a run."""

    def log(self, split: str, step: int, values: dict[str, float]) -> None:
        """The numbers of one metrics.jsonl record (`split` train or valid) at update `step`."""

    def close(self, finished: bool) -> None:
        """End the record: `finished` False when training stopped on an error or a stop signal."""


def chosen(setting: str | tuple[str, ...]) -> tuple[str, ...]:
    """The backends `run.report_to` selects (`auto`: TensorBoard where its package is installed)."""
    match setting:
        case "auto":
            return ("tensorboard",) if _installed("tensorboard") else ()
        case "none":
            return ()
        case str():
            return (setting,)
    return tuple(dict.fromkeys(setting))


def open_trackers(
    setting: str | tuple[str, ...], run_dir: Path, name: str, config: dict[str, Any], resume_at: int
) -> list[Tracker]:
    """The trackers of `run.report_to`, each opened on the run (continuing its record when `run_dir` has one).

    Args:
        name: the run's name (run.name), as the backends show it.
        config: the run's recipe (`config_to_dict`), recorded as MLflow parameters and W&B's config.
        resume_at: the update the run goes on from (0: a new run).

    Raises:
        TformerError: a backend named in run.report_to whose package is not installed (naming the extra).
    """
    names = check_installed(setting)
    ids = _read_ids(run_dir)
    trackers: list[Tracker] = []
    for backend in names:
        match backend:
            case "tensorboard":
                trackers.append(TensorBoardTracker(run_dir, resume_at))
            case "mlflow":
                trackers.append(MlflowTracker(run_dir, name, config, ids.get("mlflow")))
            case "wandb":
                trackers.append(WandbTracker(run_dir, name, config, ids.get("wandb")))
    kept = {key: value for tracker in trackers for key, value in getattr(tracker, "ids", {}).items()}
    if kept:
        write_json(run_dir / IDS, {**ids, **kept})
    return trackers


def check_installed(setting: str | tuple[str, ...]) -> tuple[str, ...]:
    """The backends `run.report_to` selects, each with its package installed.

    Raises:
        TformerError: a backend whose package is not installed, naming the extra that installs it.
    """
    names = chosen(setting)
    for backend in names:
        if not _installed(PACKAGES[backend]):
            raise TformerError(
                f"run.report_to: {backend} needs the {PACKAGES[backend]} package: "
                f'pip install "tformer-cli[{backend}]" (or leave {backend} out of run.report_to)'
            )
    return names


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _read_ids(run_dir: Path) -> dict[str, Any]:
    """RUN/tracking.json ({} for a new run).

    Raises:
        TformerError: the file is there but is not a JSON object.
    """
    path = run_dir / IDS
    if not path.is_file():
        return {}
    try:
        ids = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TformerError(f"{path}: not the run's tracking ids ({exc}); delete it to start new records") from None
    if not isinstance(ids, dict):
        raise TformerError(f"{path}: not the run's tracking ids (a JSON object); delete it to start new records")
    return ids


class TensorBoardTracker:
    """Event files in RUN/tensorboard (`tensorboard --logdir runs`); events past `resume_at` are purged."""

    def __init__(self, run_dir: Path, resume_at: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_at + 1)

    def log(self, split: str, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(f"{split}/{key}", value, step)
        self.writer.flush()

    def close(self, finished: bool) -> None:
        self.writer.close()


class MlflowTracker:
    """An MLflow run in the tracking store of MLFLOW_TRACKING_URI (a server, a database, a folder), by default the
    folder store RUN/../mlruns beside the runs; experiment MLFLOW_EXPERIMENT_NAME, by default `tformer`.

    The recipe's keys are the run's parameters (`train.lr`), logged when the run starts; the metrics are
    `train/loss`, `valid/bleu` and the like, at their update.
    """

    def __init__(self, run_dir: Path, name: str, config: dict[str, Any], saved: dict[str, Any] | None) -> None:
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir.parent / "mlruns").resolve().as_uri()
        if uri.startswith("file:") or "://" not in uri:  # MLflow 3 asks for this to use a folder store
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self.client, self.metric = MlflowClient(uri), Metric
        if saved is not None and saved.get("tracking_uri") == uri and self._exists(saved.get("run_id")):
            self.run_id = saved["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME", "tformer")
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
            self.run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
            params = [Param(key, str(value)) for key, value in _flat(config).items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters in one call
                self.client.log_batch(self.run_id, params=params[i : i + 100])
        self.ids = {"mlflow": {"tracking_uri": uri, "run_id": self.run_id}}

    def _exists(self, run_id: Any) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            return isinstance(run_id, str) and self.client.get_run(run_id) is not None
        except MlflowException:  # an id this store does not know: a new run is started instead
            return False

    def log(self, split: str, step: int, values: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        metrics = [self.metric(f"{split}/{key}", value, now, step) for key, value in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self, finished: bool) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED" if finished else "KILLED")


class WandbTracker:
    """A Weights & Biases run (project WANDB_PROJECT, by default `tformer`; WANDB_MODE=offline keeps it on the disk
    for `wandb sync`), its files in WANDB_DIR, by default the run folder; the recipe is its config."""

    def __init__(self, run_dir: Path, name: str, config: dict[str, Any], saved: dict[str, Any] | None) -> None:
        import wandb

        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "tformer"),
            name=name,
            id=saved.get("id") if isinstance(saved, dict) else None,
            resume="allow",
            config=config,
            dir=os.environ.get("WANDB_DIR") or str(run_dir),
        )
        self.ids = {"wandb": {"id": self.run.id}}

    def log(self, split: str, step: int, values: dict[str, float]) -> None:
        self.run.log({f"{split}/{key}": value for key, value in values.items()}, step=step)

    def close(self, finished: bool) -> None:
        self.run.finish(exit_code=0 if finished else 1)


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested recipe as dotted keys: {"train": {"lr": 1e-3}} -> {"train.lr": 1e-3}."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flat(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat
