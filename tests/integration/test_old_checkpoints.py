"""Checkpoints written before Seq2Seq's output projection was named `lm_head` (their tensor `out_proj.weight`)
load in every command, under today's name (run/checkpoints.py RENAMED): translate and export give what the same
weights under the new name give, a resume goes on as it would have, `average` takes old and new files together,
and train.init_from starts from them.

One tiny translation run (`new`, untied output projection) is trained for the module; `old` is a copy of it with
every checkpoint rewritten as the earlier code wrote it."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from tiny_models import tiny_mt_recipe
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.config import load_config
from tformer_cli.files import sha256_file
from tformer_cli.run.checkpoints import CHECKSUM, load_checkpoint
from tformer_cli.train import loop
from tformer_cli.train.dist import World

runner = CliRunner()


def _ok(*args) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output + str(result.exception)
    return result.output


def _write_as_before(run_dir) -> None:
    """Rewrite every checkpoint of `run_dir` with the earlier name, and its index's checksums to match."""
    folder = run_dir / "checkpoints"
    index = json.loads((folder / "index.json").read_text())
    for path in sorted(folder.glob("*.pt")):
        state = torch.load(path, map_location="cpu", weights_only=True)
        del state[CHECKSUM]  # the earlier code saved none
        state["model"] = {("out_proj.weight" if k == "lm_head.weight" else k): v for k, v in state["model"].items()}
        torch.save(state, path)
        if path.name in index["files"]:
            index["files"][path.name]["sha256"] = sha256_file(path)
    (folder / "index.json").write_text(json.dumps(index))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(recipe, tmp): runs/new trained for 6 updates (a checkpoint every 2), runs/old its copy in the old format."""
    tmp = tmp_path_factory.mktemp("old_checkpoints")
    train = "  epochs: 3\n  max_updates: 6\n  valid_every: 2\n"
    recipe = tiny_mt_recipe(tmp, model="\n  tie_embeddings: false", train=train)
    _ok("prepare", recipe)
    _ok("train", recipe, "run.name=new")
    shutil.copytree(tmp / "runs/new", tmp / "runs/old")
    _write_as_before(tmp / "runs/old")
    return recipe, tmp


def _raw_model(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def _same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_old_checkpoint_reads_back_under_todays_names(setup):
    _, tmp = setup
    old, new = tmp / "runs/old/checkpoints/best.pt", tmp / "runs/new/checkpoints/best.pt"
    assert "out_proj.weight" in _raw_model(old) and "lm_head.weight" not in _raw_model(old)  # truly the old format
    assert list(load_checkpoint(old)["model"]) == list(_raw_model(new))  # the same names, in the same order
    assert _same_tensors(load_checkpoint(old)["model"], _raw_model(new))


def test_translate_and_export_give_what_the_new_names_give(setup):
    _, tmp = setup
    for name in ("old", "new"):
        _ok("translate", tmp / f"runs/{name}", "-i", tmp / "valid.en", "-o", tmp / f"{name}.de", "decode.beam=2")
        _ok("export", tmp / f"runs/{name}", "-o", tmp / f"{name}.safetensors")
    translations = (tmp / "old.de").read_text()
    assert translations == (tmp / "new.de").read_text() and translations.strip()
    exported = load_file(tmp / "old.safetensors")
    assert "lm_head.weight" in exported and _same_tensors(exported, load_file(tmp / "new.safetensors"))


def _computed(metrics) -> list[dict]:
    """metrics.jsonl's records without what the clock measures."""
    records = map(json.loads, metrics.read_text().splitlines())
    return [{k: v for k, v in r.items() if k != "time" and not k.endswith("_per_s")} for r in records]


def test_a_resume_and_an_average_across_both_formats_go_on_as_they_would_have(setup):
    """Resumed to 10 updates, the old run keeps steps 2-6 in the old format and 8-10 in the new: its average of
    the last 5 is the new run's."""
    recipe, tmp = setup
    for name in ("old", "new"):
        shutil.copytree(tmp / f"runs/{name}", tmp / f"runs/{name}_resumed")
        _ok("train", recipe, f"run.name={name}_resumed", "train.max_updates=10")
        _ok("average", tmp / f"runs/{name}_resumed", "--last", "5", "-o", tmp / f"{name}_average.pt")
    old, new = tmp / "runs/old_resumed", tmp / "runs/new_resumed"
    assert (old / "metrics.jsonl").read_text().count('"valid"') == 5
    assert _computed(old / "metrics.jsonl") == _computed(new / "metrics.jsonl")
    last = "checkpoints/step_00000010.pt"
    assert "out_proj.weight" in _raw_model(old / "checkpoints/step_00000006.pt")
    assert "lm_head.weight" in _raw_model(old / last)  # what the resumed run writes is in today's format
    assert _same_tensors(_raw_model(old / last), _raw_model(new / last))
    optimizers = [torch.load(run / last, weights_only=True)["optimizer"]["state"] for run in (old, new)]
    assert all(torch.equal(optimizers[0][i]["exp_avg"], optimizers[1][i]["exp_avg"]) for i in optimizers[1])
    assert _same_tensors(_raw_model(tmp / "old_average.pt"), _raw_model(tmp / "new_average.pt"))


def test_init_from_an_old_checkpoint(setup):
    recipe, tmp = setup
    started = {}
    for name in ("old", "new"):
        config = load_config(recipe, [f"run.name=init_{name}", f"train.init_from={tmp}/runs/{name}"])
        started[name] = loop._start(config, tmp / f"runs/init_{name}", torch.device("cpu"), World())
    assert started["old"].init_line.startswith("initialised from")
    assert _same_tensors(started["old"].model.state_dict(), started["new"].model.state_dict())
    assert _same_tensors(started["old"].model.state_dict(), _raw_model(tmp / "runs/new/checkpoints/best.pt"))


def test_a_checkpoint_from_before_a_key_existed_resumes_without_a_change_recorded(setup):
    """A key added since the checkpoint was written (here a training and a model key, dropped from its recipe)
    takes its default: no `None -> default` change in train.log or config.yaml, and no refusal of the model."""
    recipe, tmp = setup
    run = tmp / "runs/fewer_keys"
    shutil.copytree(tmp / "runs/new", run)
    index = json.loads((run / "checkpoints/index.json").read_text())
    for path in sorted((run / "checkpoints").glob("*.pt")):
        state = torch.load(path, map_location="cpu", weights_only=True)
        del state[CHECKSUM]
        del state["config"]["train"]["fit_schedule_to_time"], state["config"]["model"]["attn_dropout"]
        torch.save(state, path)
        if path.name in index["files"]:
            index["files"][path.name]["sha256"] = sha256_file(path)
    (run / "checkpoints/index.json").write_text(json.dumps(index))
    _ok("train", recipe, "run.name=fewer_keys", "train.max_updates=8")
    said = [line for line in (run / "train.log").read_text().splitlines() if "the recipe changed" in line]
    assert len(said) == 1 and "train.max_updates 6 -> 8 from update 7" in said[0]  # the one real change
    assert not any(key in said[0] for key in ("fit_schedule_to_time", "attn_dropout"))
    header = [line for line in (run / "config.yaml").read_text().splitlines() if line.startswith("#   ")]
    assert header == ["#   train.max_updates 6 -> 8 from update 7"]
