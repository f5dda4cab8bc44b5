"""`tformer train` makes no tensor off its model's device: the whole loop (updates, logging, validation, checkpoints)
runs on the meta device, which fails where a CPU tensor is mixed in, as CUDA does (tests/unit/meta_device.py).

On a CPU every tensor is on the CPU whether or not the code names the device, so the other tests cannot see a
tensor made without it; on a GPU that tensor stops training ("Expected all tensors to be on the same device",
"index is on cpu"). The values read are stand-ins, or the same run's on the CPU where the course depends on them
(validation BLEU): these tests check where tensors are, not what they hold.
"""

import random

import pytest
from meta_device import META, OffTheCpu
from tiny_models import SESSIONS, WORDS

from tformer_cli.config import load_config
from tformer_cli.train import loop

SMALL = ["model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.d_ff=32"]
PATTERN = ["data.kind=pattern", "model.kind=classifier", "data.pattern.vocab_size=12", "train.batch_size=16"]
FAST = ["train.precision=bf16-weights", "train.update_freq=3", "train.loss_chunk=5", "train.clip_norm=1.0"]


@pytest.fixture(scope="module")
def translation(prepared_pairs):
    rng = random.Random(0)
    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(60)]
    return prepared_pairs([(s, " ".join(reversed(s.split()))) for s in sentences], 50, "train.max_tokens=64")


def _train_on_meta(config, tmp_path, monkeypatch) -> dict:
    """`tformer train` of `config` for 4 updates (validated and saved after 2 and 4) on the meta device."""
    monkeypatch.setattr(loop, "resolve_device", lambda setting: META)
    with OffTheCpu():
        return loop.train(config, tmp_path / "run")


RUN = ["train.max_updates=4", "train.valid_every=2", "train.log_every=1", "train.optimizer=adam"]


@pytest.mark.parametrize(
    "overrides",
    [
        [*SESSIONS, "model.kind=lm"],
        [*SESSIONS, "model.kind=lm", *FAST],
        [*SESSIONS, "model.kind=lstm", *FAST],
        PATTERN,
        [*PATTERN, "train.precision=bf16-weights", "train.update_freq=2"],
    ],
    ids=["lm", "lm-fast", "lstm-fast", "classifier", "classifier-fast"],
)
def test_training_runs_on_another_device_than_the_cpu(overrides, tmp_path, monkeypatch):
    config = load_config(None, [*SMALL, *overrides, *RUN, f"run.out_dir={tmp_path}"])
    metrics = _train_on_meta(config, tmp_path, monkeypatch)
    assert "loss" in metrics
    assert (tmp_path / "run" / "checkpoints" / "step_00000004.pt").exists()


@pytest.mark.parametrize("fast", [False, True])
def test_translation_training_runs_on_another_device_than_the_cpu(fast, translation, tmp_path, monkeypatch):
    config = translation(*RUN, *(FAST if fast else []), "train.label_smoothing=0.1", f"run.out_dir={tmp_path}")
    metrics = _train_on_meta(config, tmp_path, monkeypatch)
    assert "loss" in metrics


def test_a_cpu_tensor_in_the_training_step_is_found(tmp_path, monkeypatch):
    """The check itself: a batch left on the CPU (as if `to_device` forgot the device) stops training."""
    from tformer_cli.train import tasks

    monkeypatch.setattr(tasks, "to_device", lambda batch, device: batch)
    config = load_config(None, [*SESSIONS, "model.kind=lm", *RUN, f"run.out_dir={tmp_path}"])
    with pytest.raises(RuntimeError, match="on the CPU|device"):
        _train_on_meta(config, tmp_path, monkeypatch)


def test_translation_training_with_validation_bleu_takes_the_cpus_course_on_another_device(
    translation, tmp_path, monkeypatch
):
    """Validation BLEU translates (greedily) inside the loop; its course depends on values: the whole run is
    replayed on the meta device with the values the same run read on the CPU (meta_device.off_the_cpu)."""
    from meta_device import Recorded, Replayed

    config = translation(*RUN, "train.valid_bleu_lines=6", f"run.out_dir={tmp_path}")
    with Recorded() as recorded:
        on_cpu = loop.train(config, tmp_path / "cpu")
    monkeypatch.setattr(loop, "resolve_device", lambda setting: META)
    with OffTheCpu(), Replayed(recorded.log) as replayed:
        on_meta = loop.train(config, tmp_path / "meta")
    assert replayed.left == 0 and "bleu" in on_cpu
    assert on_meta == on_cpu  # every number the run reports was read back from the CPU's run


@pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter:UserWarning")  # meta holds no values
def test_a_run_saved_on_the_cpu_resumes_on_another_device(tmp_path, monkeypatch):
    """Its weights, optimizer state and position go onto the device it resumes on (as a GPU run resumes on
    another machine, or a CPU run moves to a GPU)."""
    overrides = [*SESSIONS, "model.kind=lm", *RUN, "train.precision=bf16-weights", f"run.out_dir={tmp_path}"]
    loop.train(load_config(None, [*overrides, "train.max_updates=2"]), tmp_path / "run")
    monkeypatch.setattr(loop, "resolve_device", lambda setting: META)
    with OffTheCpu():
        loop.train(load_config(None, overrides), tmp_path / "run")  # updates 3 and 4
    assert (tmp_path / "run" / "checkpoints" / "step_00000004.pt").exists()
