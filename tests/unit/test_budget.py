"""The cost is known before it is paid: parameters and training memory from the recipe
alone, and a refusal in one line, with the estimate, of what the device cannot hold."""

import re
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tformer_cli import budget
from tformer_cli.budget import GIB, check_fits, check_lines, parameter_counts, training_memory
from tformer_cli.cli import app
from tformer_cli.config import load_config
from tformer_cli.errors import TformerError
from tformer_cli.model import count_parameters
from tformer_cli.run import build_model_from_config

ROOT = Path(__file__).parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
BASE = str(ROOT / "recipes" / "wmt14_base.yaml")
runner = CliRunner()

KINDS = {
    "seq2seq": ["data.kind=parallel", "model.kind=seq2seq"],
    "lm": ["data.kind=text", "model.kind=lm", "data.block_size=64"],  # within SMALL's learned positions
    "classifier": ["data.kind=pattern", "model.kind=classifier"],
    "lstm": ["data.kind=text", "model.kind=lstm"],
}
SMALL = ["model.d_model=16", "model.n_heads=4", "model.d_ff=24", "tokenizer.vocab_size=50", "model.max_len=70"]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_counts_equal_the_built_models_for_every_recipe(recipe):
    config = load_config(recipe, ["model.n_layers=1", "model.n_decoder_layers=2", "tokenizer.vocab_size=300"])
    assert dict(parameter_counts(config)) == dict(count_parameters(build_model_from_config(config)))


VARIANTS = [  # each option's values, and the combinations whose counts interact (sharing, width, heads)
    [],
    ["model.pos=learned"],
    ["model.pos=rope", "model.ffn=swiglu", "model.n_kv_heads=2"],
    ["model.pos=alibi", "model.norm=rmsnorm", "model.norm_placement=pre"],
    ["model.ffn=gelu", "model.bias=false", "model.norm_placement=pre"],
    ["model.attention_score=general"],
    ["model.attention_score=additive", "model.bias=false", "model.n_kv_heads=1"],
    ["model.tie_embeddings=false"],
    ["model.tie_embeddings=false", "model.share_all_embeddings=true", "model.n_decoder_layers=3"],
    ["model.n_layers=3", "model.n_decoder_layers=1", "model.pos=learned", "model.ffn=swiglu"],
]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_counts_equal_the_built_models_for_every_option(kind):
    for variant in VARIANTS:
        if kind == "lstm" and any("attention_score" in v for v in variant):
            continue  # no attention
        config = load_config(None, [*KINDS[kind], *SMALL, *variant])
        assert dict(parameter_counts(config)) == dict(count_parameters(build_model_from_config(config))), variant


def test_memory_terms_follow_the_precision_and_the_batch():
    config = load_config(BASE, ["train.precision=fp32", "model.pos=rope"])  # rope: no buffers
    n = parameter_counts(config)["total"]
    fp32 = training_memory(config)
    assert (fp32.weights, fp32.gradients, fp32.optimizer) == (4 * n, 4 * n, 8 * n)  # Adam: two fp32 moments
    master = training_memory(load_config(BASE, ["train.precision=bf16-weights", "model.pos=rope"]))
    assert (master.weights, master.gradients) == (6 * n, 2 * n)  # a bf16 model and its fp32 master copy
    half = training_memory(load_config(BASE, ["train.precision=fp32", "model.pos=rope", "train.max_tokens=14336"]))
    assert half.activations == pytest.approx(fp32.activations / 2, rel=0.01)
    chunked = training_memory(load_config(BASE, ["train.precision=fp32", "model.pos=rope", "train.loss_chunk=1024"]))
    assert chunked.activations < fp32.activations / 2  # most of the batch's memory is its logits
    sinusoidal = training_memory(load_config(BASE, ["train.precision=fp32"]))
    assert sinusoidal.weights == 4 * n + 2 * 4 * 1024 * 512  # each stack's fp32 table of max_len x d_model


def test_memory_counts_the_weights_average():
    plain = training_memory(load_config(BASE, ["model.pos=rope"]))
    averaged = training_memory(load_config(BASE, ["model.pos=rope", "train.ema_decay=0.9999"]))
    n = parameter_counts(load_config(BASE, ["model.pos=rope"]))["total"]
    assert (plain.average, averaged.average) == (0, 4 * n)  # train/ema.py: an fp32 copy of each weight
    assert averaged.total == plain.total + 4 * n
    assert "average" not in plain.describe()
    assert re.search(r"activations [^,]+, average \d+ MiB\)$", averaged.describe()), averaged.describe()


def test_train_refuses_what_the_device_cannot_hold(monkeypatch):
    config = load_config(BASE, [])
    monkeypatch.setattr(budget, "host_available", lambda: 8 * GIB)
    with pytest.raises(TformerError) as err:
        check_fits(config, torch.device("cpu"))
    message = str(err.value)
    assert "\n" not in message
    assert re.search(r"needs about 16\.\d GiB \(weights .*, activations .*\) per process", message), message
    assert "this machine's memory has 8.0 GiB available: lower train.max_tokens" in message
    monkeypatch.setattr(budget, "host_available", lambda: 32 * GIB)
    assert check_fits(config, torch.device("cpu")).total < 32 * GIB


def test_torchrun_processes_on_one_host_share_its_memory(monkeypatch):
    config = load_config(BASE, [])
    monkeypatch.setattr(budget, "host_available", lambda: 32 * GIB)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(TformerError, match="per process"):
        check_fits(config, torch.device("cpu"))


def test_check_reports_a_gpu_recipe_on_a_small_machine_and_refuses_what_no_device_holds(monkeypatch):
    monkeypatch.setattr(budget, "host_available", lambda: 4 * GIB)
    config = load_config(BASE, ["run.device=cpu"])  # this machine's memory (auto would check a GPU's)
    lines = check_lines(config, parameter_counts(config)["total"])
    assert lines[0].startswith("training memory: about 16.")
    assert lines[1] == "this machine's memory has 4.0 GiB available: `tformer train` would refuse it on this machine"
    huge = load_config(BASE, ["run.device=cpu", "model.d_model=16384", "model.n_heads=16"])
    with pytest.raises(TformerError, match=r"more than any single device holds \(the largest: 288 GiB"):
        check_lines(huge, parameter_counts(huge)["total"])


def test_check_refuses_a_huge_model_at_once_without_building_it(monkeypatch):
    def no_building(*args, **kwargs):
        raise AssertionError("check built a model")

    monkeypatch.setattr("tformer_cli.run.load.build_model", no_building)
    for override in (["model.n_layers=1024"], ["model.d_model=16384", "model.n_heads=16"]):
        start = time.process_time()  # CPU time: the machine may be busy with other work
        result = runner.invoke(app, ["check", BASE, *override])
        assert time.process_time() - start < 1.0
        assert result.exit_code == 1, result.output
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: training this recipe needs about "), lines
        assert " GiB (weights " in lines[0] and "more than any single device holds" in lines[0]
        assert result.stdout == ""  # refused before the config is printed
    assert runner.invoke(app, ["check", BASE]).exit_code == 0


def test_train_refuses_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(budget, "host_available", lambda: 1024)
    tiny = str(ROOT / "recipes" / "tiny_classifier.yaml")
    result = runner.invoke(app, ["train", tiny, f"run.out_dir={tmp_path}", "run.device=cpu"])  # the host's memory
    assert result.exit_code == 1, result.output
    assert result.stderr.count("\n") == 1 and "this machine's memory has 0 MiB available" in result.stderr
    assert not any(tmp_path.iterdir())


def test_host_memory_is_read_without_psutil():
    assert 0 < budget.host_available() < 1 << 50


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA checks a recipe for one")
def test_check_of_a_cuda_recipe_on_a_machine_without_one_reports_and_refuses_only_the_impossible():
    config = load_config(BASE, ["run.device=cuda"])
    lines = check_lines(config, parameter_counts(config)["total"])
    assert lines[1] == "no CUDA device on this machine to compare it with (run.device=cuda)"
    huge = load_config(BASE, ["run.device=cuda", "model.n_layers=1024"])
    with pytest.raises(TformerError, match="more than any single device holds"):
        check_lines(huge, parameter_counts(huge)["total"])


def test_what_no_device_holds_is_refused_without_importing_torch():
    """`tformer check ... model.n_layers=1024` answers in a fraction of a second: torch's import is most of it."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom tformer_cli.cli import main\n"
        f"sys.argv = ['tformer', 'check', {BASE!r}, 'model.n_layers=1024']\n"
        "try:\n    main()\nexcept SystemExit as stop:\n    print(stop.code, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["1", "False"], done.stdout + done.stderr
    assert done.stderr.startswith("error: training this recipe needs about 1,047 GiB") and done.stderr.count("\n") == 1
