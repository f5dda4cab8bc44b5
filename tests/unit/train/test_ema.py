"""train.ema_decay (train/ema.py): the average's arithmetic, what validation scores and checkpoints hold, and
resuming with it, without it, and across a change of it."""

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from tformer_cli.config import load_config
from tformer_cli.errors import ConfigError
from tformer_cli.run.checkpoints import EMA_UPDATES, TRAINED, average_checkpoints, load_checkpoint
from tformer_cli.train import loop
from tformer_cli.train.ema import WeightAverage
from tformer_cli.train.tasks import make_task

TINY = Path(__file__).parents[3] / "recipes" / "tiny_classifier.yaml"
# dropout on (its masks use the generator the average must not touch), validation every 8 updates, a schedule that
# does not depend on the run's length (a run of 17 updates resumed to 40 trains as one of 40)
COMMON = [
    "model.dropout=0.1",
    "train.schedule=constant",
    "train.warmup_steps=5",
    "train.valid_every=8",
    "train.log_every=4",
    "run.threads=1",
]


def test_the_average_follows_the_weights_by_the_warmed_up_rate():
    model = nn.Linear(2, 1, bias=False)
    average = WeightAverage(model, decay=0.9)
    expected = model.weight.detach().clone()
    for t in range(1, 13):
        with torch.no_grad():
            model.weight.add_(float(t))  # a made-up update
        average.update()
        d = max(1 - 0.9, 9 / (t + 10))  # 0.818, 0.75, ... then 0.1 from t = 80: here the warm-up's values
        expected = expected + d * (model.weight.detach() - expected)
        torch.testing.assert_close(average.avg[0], expected, rtol=1e-6, atol=1e-6)
    assert average.updates == 12


def test_the_rate_settles_at_one_minus_the_decay():
    model = nn.Linear(1, 1, bias=False)
    average = WeightAverage(model, decay=0.5)
    average.updates = 100  # past the warm-up: 9 / 111 < 0.5
    with torch.no_grad():
        model.weight.fill_(0.0)
        average.avg[0].fill_(1.0)
    average.update()
    assert average.avg[0].item() == pytest.approx(0.5)


def test_the_trained_weights_come_back_after_the_average_was_swapped_in_even_on_an_error():
    model = nn.Linear(3, 2)
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    average = WeightAverage(model, decay=0.99)
    for a in average.avg:
        a.fill_(7.0)
    with pytest.raises(RuntimeError), average.swapped_in():
        assert all(torch.all(p == 7.0) for p in model.parameters())
        raise RuntimeError("validation failed")
    assert all(torch.equal(model.state_dict()[k], trained[k]) for k in trained)


def test_a_decay_of_one_or_more_is_refused():
    with pytest.raises(ConfigError, match="train.ema_decay"):
        load_config(TINY, ["train.ema_decay=1.0"])


def _run(out: Path, *overrides: str) -> Path:
    loop.train(load_config(TINY, [f"run.out_dir={out}", *COMMON, *overrides]), out / "run")
    return out / "run"


def _latest(run: Path) -> dict:
    index = json.loads((run / "checkpoints/index.json").read_text())
    return load_checkpoint(run / "checkpoints" / index["latest"])


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same 40 updates without an average and with one; the run with one stopped at 17 and resumed."""
    plain = _run(tmp_path_factory.mktemp("plain"), "train.max_updates=40")
    smoothed = _run(tmp_path_factory.mktemp("ema"), "train.max_updates=40", "train.ema_decay=0.9")
    resumed_out = tmp_path_factory.mktemp("resumed")
    _run(resumed_out, "train.max_updates=17", "train.ema_decay=0.9")
    resumed = _run(resumed_out, "train.max_updates=40", "train.ema_decay=0.9")
    return plain, smoothed, resumed


def test_the_average_does_not_change_training(runs):
    plain, smoothed, _ = runs
    assert _equal(_latest(smoothed)[TRAINED], _latest(plain)["model"])
    assert TRAINED not in _latest(plain) and EMA_UPDATES not in _latest(plain)


def test_checkpoints_hold_the_average_as_the_model_and_validation_scores_it(runs):
    _, smoothed, _ = runs
    state = _latest(smoothed)
    assert state[EMA_UPDATES] == 40
    assert not _equal(state["model"], state[TRAINED])
    config = load_config(TINY, [*COMMON, "train.ema_decay=0.9"])
    task = make_task(config)
    scores = {}
    for key in ("model", TRAINED):
        model = task.build_model()
        model.load_state_dict(state[key])
        scores[key] = task.evaluate(model, torch.device("cpu"))["loss"]
    assert state["metrics"]["loss"] == pytest.approx(scores["model"], abs=1e-6)
    assert scores["model"] != pytest.approx(scores[TRAINED], abs=1e-6)


def test_a_run_with_an_average_resumes_exactly(runs):
    _, smoothed, resumed = runs
    straight, again = _latest(smoothed), _latest(resumed)
    assert _equal(again[TRAINED], straight[TRAINED])
    assert _equal(again["model"], straight["model"])
    assert again[EMA_UPDATES] == 40


def test_turning_the_average_off_on_resume_trains_on_from_the_trained_weights(runs, tmp_path):
    plain, _, _ = runs
    _run(tmp_path, "train.max_updates=17", "train.ema_decay=0.9")
    state = _run(tmp_path, "train.max_updates=40")  # ema_decay 0 now: recorded as a change
    assert _equal(_latest(state)["model"], _latest(plain)["model"])
    assert TRAINED not in _latest(state)


def test_turning_the_average_on_on_resume_starts_it_there(runs, tmp_path):
    _, smoothed, _ = runs
    _run(tmp_path, "train.max_updates=17")
    state = _latest(_run(tmp_path, "train.max_updates=40", "train.ema_decay=0.9"))
    assert _equal(state[TRAINED], _latest(smoothed)[TRAINED])
    assert state[EMA_UPDATES] == 23  # updates 18 .. 40


def test_an_averaged_file_of_checkpoints_keeps_no_trained_weights(runs):
    _, smoothed, _ = runs
    folder = smoothed / "checkpoints"
    steps = sorted(folder.glob("step_*.pt"))[-2:]
    average = average_checkpoints(steps)
    assert TRAINED not in average and EMA_UPDATES not in average
    first, second = (load_checkpoint(p)["model"] for p in steps)
    for name, tensor in average["model"].items():
        if tensor.is_floating_point():
            torch.testing.assert_close(tensor, (first[name].double() + second[name].double()).div(2).to(tensor.dtype))
