"""A trained run's home (tformer_cli/run/): the layout's names, config -> model, and checkpoint -> ready model."""

import ast
import json
from pathlib import Path

import pytest
import torch

from tformer_cli import files
from tformer_cli.config import config_to_dict, load_config
from tformer_cli.data import manifest
from tformer_cli.errors import CheckpointError, ConfigError, TformerError
from tformer_cli.files import sha256_file
from tformer_cli.model.classifier import Classifier
from tformer_cli.model.lm import LanguageModel
from tformer_cli.model.lstm import LSTMLanguageModel
from tformer_cli.model.seq2seq import Seq2Seq
from tformer_cli.run import build_model_from_config, layout, load_run, use_tf32
from tformer_cli.run import load as run_load
from tformer_cli.run.checkpoints import resolve_checkpoint, save_checkpoint
from tformer_cli.run.layout import checkpoint_label, eval_file, run_dir_of, step_file
from tformer_cli.tokenizer import Tokenizer

SMALL = ["model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.d_ff=32", "model.dropout=0.0"]
PATTERN = ["data.kind=pattern", "model.kind=classifier", "data.pattern.vocab_size=12", "data.pattern.n_classes=3"]


def _config(*overrides: str):
    return load_config(None, [*SMALL, *overrides])


# layout

PACKAGE = Path(layout.__file__).parents[1]


def _homes() -> dict[str, Path]:
    """Each file name of a run or a prepared data folder, and the one module that spells it: the layout's names
    (those with a dot: "checkpoints" and "ctranslate2" are also a JSON key and an engine), the lock file's,
    the manifest's."""
    names = {v: Path(layout.__file__) for k, v in vars(layout).items() if k.isupper() and "." in v}
    return {**names, files.LOCK: Path(files.__file__), manifest.MANIFEST: Path(manifest.__file__)}


def test_each_file_name_of_a_run_is_spelled_in_one_module():
    """A module that writes or recognises a run's file imports its name (a second spelling drifts)."""
    homes = _homes()
    assert {"train.log", "sweep.json", ".lock", "config.yaml", "manifest.json"} <= set(homes)
    spelled = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in homes and homes[node.value] != path:
                spelled.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value}")
    assert spelled == []


def test_run_dir_of_a_run_a_checkpoint_in_it_and_a_standalone_file(tmp_path):
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "best.pt").write_bytes(b"")
    (tmp_path / "loose.pt").write_bytes(b"")
    assert run_dir_of(tmp_path / "run") == tmp_path / "run"
    assert run_dir_of(folder / "best.pt") == tmp_path / "run"
    assert run_dir_of(tmp_path / "loose.pt") is None


def _touch_steps(folder: Path, *steps: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for step in steps:
        (folder / step_file(step)).write_bytes(b"")


def test_resolve_checkpoint_best_then_indexed_latest_then_newest_step_file(tmp_path):
    folder = tmp_path / "checkpoints"
    _touch_steps(folder, 2, 10)
    assert resolve_checkpoint(tmp_path) == folder / "step_00000010.pt"  # no index: the newest step file
    (folder / "index.json").write_text(json.dumps({"latest": "step_00000002.pt", "files": {}}))
    assert resolve_checkpoint(tmp_path) == folder / "step_00000002.pt"  # the index names the latest
    (folder / "best.pt").write_bytes(b"")
    assert resolve_checkpoint(tmp_path) == folder / "best.pt"
    assert resolve_checkpoint(folder / "step_00000010.pt") == folder / "step_00000010.pt"  # a file: as given


def test_resolve_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no such run directory or checkpoint"):
        resolve_checkpoint(tmp_path / "nothing")
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoints in this run directory"):
        resolve_checkpoint(tmp_path)
    (tmp_path / "checkpoints/index.json").write_text("{")
    with pytest.raises(CheckpointError, match="index.json is unreadable"):
        resolve_checkpoint(tmp_path)


def test_eval_file_names_data_checkpoint_settings_and_a_precision_other_than_fp32():
    assert eval_file("valid", "best") == "eval_valid_best"
    assert eval_file("tiny-valid", "best", "beam4") == "eval_tiny-valid_best_beam4"
    assert eval_file("tiny-valid", "avg5", "greedy", precision="fp32") == "eval_tiny-valid_avg5_greedy"
    assert eval_file("valid.txt", "best", "blocks", precision="bf16") == "eval_valid.txt_best_blocks_bf16"
    assert eval_file("valid.txt", "step_00000010", "stride32", precision="fp16") == (
        "eval_valid.txt_step_00000010_stride32_fp16"
    )
    assert checkpoint_label(Path("run/checkpoints/best.pt")) == "best"
    assert checkpoint_label(Path("run/checkpoints/step_00000010.pt"), average=5) == "avg5"


# build_model_from_config


@pytest.mark.parametrize(
    "overrides, cls",
    [
        (["data.kind=text", "model.kind=lm"], LanguageModel),
        (["data.kind=text", "model.kind=lstm"], LSTMLanguageModel),
        (["data.kind=parallel", "model.kind=seq2seq"], Seq2Seq),
    ],
)
def test_text_models_take_the_given_vocabulary_else_the_tokenizer_sections(overrides, cls):
    config = _config(*overrides, "tokenizer.vocab_size=40")
    ids = torch.tensor([[5, 6, 7]])
    for vocab_size, expected in ((None, 40), (23, 23)):
        model = build_model_from_config(config, vocab_size).eval()
        assert type(model) is cls
        logits = model(ids) if cls is not Seq2Seq else model(ids, ids)
        assert logits.shape == (1, 3, expected)


def test_a_classifier_takes_vocabulary_and_classes_from_the_pattern_section():
    model = build_model_from_config(_config(*PATTERN, "tokenizer.vocab_size=40")).eval()
    assert type(model) is Classifier
    assert model(torch.tensor([[2, 11, 3]])).shape == (1, 3)  # 3 classes
    assert sum(p.numel() for p in model.parameters() if p.dim() == 2 and p.size(0) == 12) > 0  # 12 embeddings
    assert not any(p.dim() == 2 and p.size(0) == 40 for p in model.parameters())  # not the tokenizer's 40
    with pytest.raises(ValueError, match="data.pattern"):
        build_model_from_config(_config(*PATTERN), vocab_size=40)


# load_run


def _perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """`model` with weights no fresh build reproduces (so loading is what makes them match)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen))
    return model.eval()


def _lm_run(
    folder: Path,
    tokenizer_dir: Path,
    fingerprint: str | None = None,
    steps=(1,),
    seed: int = 0,
    device: str = "cpu",
    overrides=(),
):
    """A run directory holding tiny LM step checkpoints (indexed), trained with `tokenizer_dir`'s tokenizer,
    saved from a model on `device`, its recipe with `overrides`."""
    config = _config(
        "data.kind=text", "model.kind=lm", f"data.dir={tokenizer_dir}", "tokenizer.vocab_size=40", *overrides
    )
    tokenizer = Tokenizer(tokenizer_dir / "spm.model")
    files, models = {}, []
    for step in steps:
        model = _perturbed(build_model_from_config(config, tokenizer.vocab_size), seed + step).to(device)
        path = folder / "checkpoints" / step_file(step)
        state = {"model": model.state_dict(), "config": config_to_dict(config)}
        save_checkpoint({**state, "tokenizer_fingerprint": fingerprint or tokenizer.fingerprint}, path)
        files[path.name] = {"step": step, "sha256": sha256_file(path), "metric": None}
        models.append(model)
    index = {"latest": step_file(steps[-1]), "files": files}
    (folder / "checkpoints" / "index.json").write_text(json.dumps(index))
    return models


def test_a_saved_language_model_loads_to_the_same_logits(tmp_path, tokenizer_dir):
    (saved,) = _lm_run(tmp_path, tokenizer_dir)
    run = load_run(tmp_path, device="cpu")
    ids = torch.tensor([[3, 9, 17, 4, 25]])
    with torch.no_grad():
        assert torch.equal(run.model(ids), saved(ids))
    assert not run.model.training
    assert run.checkpoint == tmp_path / "checkpoints" / "step_00000001.pt" and run.run_dir == tmp_path
    assert run.kind == "lm" and run.tokenizer.fingerprint == run.tokenizer_fingerprint and run.label == "step_00000001"


def test_a_checkpoint_saved_on_one_device_loads_on_the_other(tmp_path, tokenizer_dir, two_devices):
    """A GPU's checkpoint on a CPU, and the reverse: the same weights, on the device asked for."""
    saved_on, loaded_on = two_devices
    (saved,) = _lm_run(tmp_path, tokenizer_dir, device=saved_on.type)
    run = load_run(tmp_path, device=loaded_on.type)
    assert run.device.type == loaded_on.type
    expected = saved.state_dict()
    for name, value in run.model.state_dict().items():
        assert torch.equal(value.cpu(), expected[name].cpu()), name
    ids = [[3, 9, 17, 4, 25]]
    with torch.no_grad():
        here = run.model(torch.tensor(ids, device=run.device)).cpu()
        there = saved(torch.tensor(ids, device=saved_on)).cpu()
    assert (here - there).norm() / there.norm() < 1e-2  # other kernels (and TF32 on CUDA), same model


def test_load_run_turns_tf32_on_for_its_device(tmp_path, tokenizer_dir, monkeypatch):
    _lm_run(tmp_path, tokenizer_dir)
    asked = []
    monkeypatch.setattr(run_load, "use_tf32", asked.append)
    load_run(tmp_path, device="cpu")
    assert asked == [torch.device("cpu")]


@pytest.mark.parametrize("device, tf32", [("cuda", True), ("cpu", False)])
def test_use_tf32_sets_the_fp32_matmul_precision_on_cuda_only(device, tf32):
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = False
        use_tf32(torch.device(device))  # flags only: no CUDA device needed
        assert torch.get_float32_matmul_precision() == ("high" if tf32 else "highest")
        assert torch.backends.cudnn.allow_tf32 is tf32
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]


def test_run_threads_given_at_load_sets_torchs_threads_and_the_trained_setting_does_not(tmp_path, tokenizer_dir):
    _lm_run(tmp_path, tokenizer_dir, overrides=["run.threads=1"])  # trained on one thread
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        load_run(tmp_path, device="cpu")
        assert torch.get_num_threads() == 2  # the training machine's setting is not this one's
        load_run(tmp_path, ["run.threads=3"], device="cpu")
        assert torch.get_num_threads() == 3
        torch.set_num_threads(2)
        run = load_run(tmp_path, ["run.threads=0"], device="cpu")  # 0: torch's default, untouched
        assert torch.get_num_threads() == 2 and run.config.run.threads == 0
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ConfigError, match=r"'run.seed=3': only decode.\*, run.threads, run.device can change here"):
        load_run(tmp_path, ["run.seed=3"], device="cpu")


def test_decode_precision_casts_the_weights_unless_cast_is_off(tmp_path, tokenizer_dir):
    _lm_run(tmp_path, tokenizer_dir)
    bf16 = load_run(tmp_path, ["decode.precision=bf16"], device="cpu")
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    kept = load_run(tmp_path, ["decode.precision=bf16"], device="cpu", cast=False)
    assert {p.dtype for p in kept.model.parameters()} == {torch.float32}


def test_without_reading_the_tokenizer_a_language_model_loads_with_no_data_dir(tmp_path, tokenizer_dir):
    (saved,) = _lm_run(tmp_path, tokenizer_dir, fingerprint="0123456789ab" + "0" * 52)  # not even checked
    (tmp_path / "elsewhere").mkdir()
    moved = tmp_path / "elsewhere" / "spm.model"
    (tokenizer_dir / "spm.model").rename(moved)
    try:
        run = load_run(tmp_path, device="cpu", read_tokenizer=False)
    finally:
        moved.rename(tokenizer_dir / "spm.model")
    ids = torch.tensor([[3, 9, 17]])
    with torch.no_grad():
        assert torch.equal(run.model(ids), saved(ids))
    assert run.tokenizer is None and run.tokenizer_fingerprint == "0123456789ab" + "0" * 52


def test_a_model_trained_with_another_tokenizer_is_refused(tmp_path, tokenizer_dir):
    _lm_run(tmp_path, tokenizer_dir, fingerprint="0123456789ab" + "0" * 52)
    with pytest.raises(CheckpointError, match="another tokenizer.*0123456789ab"):
        load_run(tmp_path, device="cpu")


def test_average_2_loads_the_mean_of_the_last_two_step_checkpoints(tmp_path, tokenizer_dir):
    _, second, third = _lm_run(tmp_path, tokenizer_dir, steps=(1, 2, 3))
    run = load_run(tmp_path, device="cpu", average=2)
    for name, value in run.model.state_dict().items():
        expected = (second.state_dict()[name].double() + third.state_dict()[name].double()) / 2
        assert torch.allclose(value.double(), expected, atol=1e-6), name
    assert run.checkpoint.name == "step_00000003.pt" and run.average == 2 and run.label == "avg2"
    with pytest.raises(CheckpointError, match="--average"):
        load_run(tmp_path, device="cpu", average=-1)


def test_a_classifier_loads_without_a_tokenizer(tmp_path):
    config = _config(*PATTERN)
    saved = _perturbed(build_model_from_config(config), seed=7)
    path = tmp_path / "classifier.pt"
    save_checkpoint(
        {"model": saved.state_dict(), "config": config_to_dict(config), "tokenizer_fingerprint": None}, path
    )
    run = load_run(path, device="cpu")
    tokens = torch.tensor([[2, 11, 3, 5]])
    with torch.no_grad():
        assert torch.equal(run.model(tokens), saved(tokens))
    assert run.kind == "classifier" and run.tokenizer is None and run.run_dir is None and run.checkpoint == path


def test_resolve_device(monkeypatch):
    from tformer_cli.run import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") and resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(TformerError, match="no CUDA device"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda") and resolve_device("cpu") == torch.device("cpu")
