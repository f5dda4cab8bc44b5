"""train.init_from (tformer_cli/train/init.py): a new run starts from another run's weights, with a new optimizer,
schedule, update count and random state; a resume does not apply it again; what would make the weights silently
wrong (another model, another tokenizer) and a missing source are one-line refusals.

A tiny translation corpus and a tiny source run are made once for the module; each run trains a few updates."""

import json
import shutil

import pytest
import torch
import yaml
from tiny_models import tiny_mt_recipe
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.config import load_config
from tformer_cli.run.checkpoints import load_checkpoint
from tformer_cli.train import loop
from tformer_cli.train.dist import World
from tformer_cli.train.optim import lr_at
from tformer_cli.train.store import CheckpointStore

runner = CliRunner()


def _cli(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def _ok(*args: str):
    result = _cli(*args)
    assert result.exit_code == 0, result.output + str(result.exception)
    return result


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(recipe, tmp): a tiny EN-DE corpus prepared into tmp/data, and runs/base trained on it for one epoch."""
    tmp = tmp_path_factory.mktemp("init_from")
    recipe = tiny_mt_recipe(tmp)
    _ok("prepare", recipe)
    _ok("train", recipe, "run.name=base", "train.epochs=3")
    return recipe, tmp


def _source(tmp):
    """The checkpoint `init_from=runs/base` loads: the run's best.pt."""
    return load_checkpoint(tmp / "runs/base/checkpoints/best.pt")


def _valid_losses(run_dir) -> list[float]:
    records = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return [r["loss"] for r in records if r["split"] == "valid"]


def _latest_weights(run_dir) -> dict:
    return load_checkpoint(run_dir / "checkpoints" / CheckpointStore(run_dir).index["latest"])["model"]


def _started(recipe, run_dir, *overrides: str) -> loop._Training:
    """The run `tformer train` would begin, right after its set-up (weights, optimizer, position)."""
    config = load_config(recipe, [*overrides])
    return loop._start(config, run_dir, torch.device("cpu"), World())


def test_right_after_init_the_weights_are_the_sources_and_the_rest_starts_afresh(setup):
    recipe, tmp = setup
    plain = _started(recipe, tmp / "runs/plain")
    after_plain = torch.get_rng_state()
    run = _started(recipe, tmp / "runs/new", f"train.init_from={tmp}/runs/base", "model.dropout=0.0")
    assert torch.equal(torch.get_rng_state(), after_plain)  # the random state of a run from scratch (run.seed)
    source = _source(tmp)["model"]
    weights = run.model.state_dict()
    assert weights.keys() == source.keys()
    assert all(torch.equal(weights[name], source[name]) for name in source)
    assert not any(torch.equal(plain.model.state_dict()[name], source[name]) for name in source if "norm" not in name)
    assert len(run.engine.optimizer.state) == 0 and run.progress == loop.Progress()  # no moments, update 0, epoch 0
    first = run.take_step(run.engine.task.batches(0))
    assert first.lr == lr_at(1, run.tc, 16, run.total_steps)
    checkpoint = tmp / "runs/base/checkpoints/best.pt"
    assert run.init_line == f"initialised from {checkpoint} (update {_steps(tmp)} of {tmp}/runs/base)"


def _steps(tmp) -> int:
    return _source(tmp)["position"]["step"]


def test_a_checkpoint_file_outside_its_run_and_an_average_say_whose_they_are(setup):
    recipe, tmp = setup
    loose = tmp / "loose.pt"
    shutil.copyfile(tmp / "runs/base/checkpoints/best.pt", loose)
    run = _started(recipe, tmp / "runs/loose", f"train.init_from={loose}")
    assert run.init_line == f"initialised from {loose} (update {_steps(tmp)} of run 'base')"
    _ok("average", str(tmp / "runs/base"), "--last", "2", "-o", str(tmp / "avg.pt"))
    run = _started(recipe, tmp / "runs/avg", f"train.init_from={tmp}/avg.pt")
    assert run.init_line.endswith(f"(the average of 2 checkpoints up to update {_steps(tmp)} of run 'base')")
    assert all(torch.equal(v, load_checkpoint(tmp / "avg.pt")["model"][k]) for k, v in run.model.state_dict().items())


def test_max_len_may_differ_unless_the_positions_are_a_learned_table(setup):
    recipe, tmp = setup
    longer = _started(recipe, tmp / "runs/longer", f"train.init_from={tmp}/runs/base", "model.max_len=2048")
    assert longer.init_line.startswith("initialised from")  # sinusoidal: max_len only bounds the lengths served
    _ok("train", recipe, "run.name=learned", "model.pos=learned", "train.max_updates=1")
    learned = [f"train.init_from={tmp}/runs/learned", "model.pos=learned"]
    result = _cli("train", recipe, "run.name=learned_longer", *learned, "model.max_len=2048")
    _one_error_line(result, "model.max_len=1024 there, 2048 in the recipe")


def test_bf16_master_weights_start_from_the_source(setup):
    recipe, tmp = setup
    run = _started(recipe, tmp / "runs/bf16", f"train.init_from={tmp}/runs/base", "train.precision=bf16-weights")
    source = _source(tmp)["model"]
    master, bf16 = run.engine.master.master.state_dict(), run.engine.master.model.state_dict()
    for name, value in source.items():
        assert torch.equal(master[name], value), name
        assert torch.equal(bf16[name], value.to(bf16[name].dtype)), name  # the copy the passes run, rounded


def test_training_goes_on_from_the_source_weights(setup):
    """With a learning rate too small to move a weight, the first validation is the source's own (same weights,
    same data); at the recipe's rate one update keeps the source's loss, where a run from scratch is far off."""
    recipe, tmp = setup
    source_loss = _source(tmp)["metrics"]["loss"]
    still = ["train.max_updates=1", "train.lr=1e-30", "model.dropout=0.0"]
    _ok("train", recipe, "run.name=still", f"train.init_from={tmp}/runs/base", *still)
    assert _valid_losses(tmp / "runs/still")[0] == source_loss
    _ok("train", recipe, "run.name=tuned", f"train.init_from={tmp}/runs/base", "train.max_updates=1")
    _ok("train", recipe, "run.name=scratch", "train.max_updates=1")
    tuned, scratch = _valid_losses(tmp / "runs/tuned")[0], _valid_losses(tmp / "runs/scratch")[0]
    assert abs(tuned - source_loss) < 0.2 < scratch - source_loss
    config = yaml.safe_load((tmp / "runs/tuned/config.yaml").read_text())
    assert config["train"]["init_from"] == f"{tmp}/runs/base"  # as given


def test_a_resumed_run_goes_on_from_its_own_checkpoint_whatever_init_from_says(setup):
    """Stopped at update 2 and resumed to 4 (init_from changed meanwhile, to a path that does not even exist):
    not refused, not applied; the weights are those of 4 updates straight."""
    recipe, tmp = setup
    base = f"train.init_from={tmp}/runs/base"
    _ok("train", recipe, "run.name=straight", base, "train.max_updates=4")
    _ok("train", recipe, "run.name=resumed", base, "train.max_updates=2")
    result = _ok("train", recipe, "run.name=resumed", f"train.init_from={tmp}/elsewhere", "train.max_updates=4")
    said = result.stderr
    assert f"train.init_from={tmp}/elsewhere not applied: the run resumes from its own checkpoint (update 2)" in said
    assert "initialised from" not in said
    straight, resumed = _latest_weights(tmp / "runs/straight"), _latest_weights(tmp / "runs/resumed")
    assert all(torch.equal(straight[name], resumed[name]) for name in straight)
    header = (tmp / "runs/resumed/config.yaml").read_text().splitlines()
    assert f"#   train.init_from '{tmp}/runs/base' -> '{tmp}/elsewhere' from update 3" in header  # recorded


def _one_error_line(result, *parts: str) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1, (result.exit_code, result.output)
    assert len(lines) == 1 and lines[0].startswith("error: train.init_from: "), result.stderr
    for part in parts:
        assert part in lines[0], (part, lines[0])
    return lines[0]


def test_a_missing_source_is_refused(setup):
    recipe, tmp = setup
    result = _cli("train", recipe, "run.name=missing", f"train.init_from={tmp}/runs/nothing")
    _one_error_line(result, f"no such run directory or checkpoint: {tmp}/runs/nothing")
    assert not (tmp / "runs/missing/checkpoints").exists()


def test_a_model_of_another_shape_is_refused_naming_the_keys(setup):
    recipe, tmp = setup
    result = _cli("train", recipe, "run.name=wider", f"train.init_from={tmp}/runs/base", "model.d_model=32")
    _one_error_line(result, "holds another model: model.d_model=16 there, 32 in the recipe")


def test_a_model_that_computes_otherwise_is_refused_though_its_shapes_fit(setup):
    recipe, tmp = setup
    result = _cli("train", recipe, "run.name=gelu", f"train.init_from={tmp}/runs/base", "model.ffn=gelu")
    _one_error_line(result, "model.ffn='relu' there, 'gelu' in the recipe")


def test_a_model_trained_with_another_tokenizer_is_refused(setup):
    recipe, tmp = setup
    other = [f"data.dir={tmp}/data50", "tokenizer.vocab_size=50"]
    _ok("prepare", recipe, *other)
    result = _cli("train", recipe, "run.name=foreign", f"train.init_from={tmp}/runs/base", *other)
    _one_error_line(result, "was trained with another tokenizer than the data in", f"it trained on {tmp}/data")


def test_generated_data_of_another_vocabulary_is_refused_by_tensor(tmp_path):
    """Pattern data has no tokenizer: its vocabulary is data.pattern's, which the tensors' shapes show."""
    tiny = ["recipes/tiny_classifier.yaml", f"run.out_dir={tmp_path}", "train.epochs=1"]
    _ok("train", *tiny, "run.name=base")
    result = _cli("train", *tiny, "run.name=more", f"train.init_from={tmp_path}/base", "data.pattern.vocab_size=24")
    _one_error_line(result, "weights do not fit the recipe's model: ", "(20, 32) there, (24, 32) here")
