"""A run directory and a prepared data folder never nest, in either direction and through symbolic links, and
`prepare` replaces only a folder that holds nothing but what it made: nothing of a run is ever deleted by it."""

import random
from pathlib import Path

import pytest
from tiny_models import CPU, WORDS
from typer.testing import CliRunner

from tformer_cli.cli import app

runner = CliRunner()
RECIPE = "recipes/wikitext2_lm.yaml"
TINY = [
    "tokenizer.vocab_size=30",
    "data.block_size=16",
    "model.d_model=16",
    "model.n_heads=2",
    "model.n_layers=1",
    "model.d_ff=32",
    "train.max_updates=2",
    "train.batch_size=4",
    "train.compile=false",
    *CPU,
]


def _corpus(folder: Path) -> list[str]:
    rng = random.Random(0)
    text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10))) for _ in range(200)) + "\n"
    (folder / "train.txt").write_text(text)
    (folder / "valid.txt").write_text(text[:1500].rsplit("\n", 1)[0] + "\n")
    return [f"data.train={folder}/train.txt", f"data.valid={folder}/valid.txt", *TINY]


def _cli(*args: str):
    return runner.invoke(app, list(args))


def _refused(result, *parts: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1, result.output
    assert lines and lines[-1].startswith("error: ") and all(p in lines[-1] for p in parts), result.stderr
    assert "Traceback" not in result.output


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, list[str]]:
    tmp = tmp_path_factory.mktemp("nest")
    common = _corpus(tmp)
    result = _cli("prepare", RECIPE, *common, f"data.dir={tmp}/data")
    assert result.exit_code == 0, result.output
    return tmp, common


@pytest.mark.parametrize(
    ("out_dir", "name", "says"),
    [
        ("data", "run", "is inside the prepared data folder"),  # a run inside the prepared folder
        ("", "data", "is the prepared data folder"),  # the run is the prepared folder
        ("link", "run", "is inside the prepared data folder"),  # inside it through a symbolic link
        ("data/..", "data", "is the prepared data folder"),  # the same through `..` in run.out_dir
    ],
)
def test_no_run_is_or_goes_inside_a_prepared_folder(prepared, out_dir, name, says):
    tmp, common = prepared
    if not (tmp / "link").exists():
        (tmp / "link").symlink_to(tmp / "data")
    before = sorted(p.name for p in (tmp / "data").iterdir())
    result = _cli("train", RECIPE, *common, f"data.dir={tmp}/data", f"run.out_dir={tmp / out_dir}", f"run.name={name}")
    _refused(result, says, str((tmp / "data").resolve()))
    assert sorted(p.name for p in (tmp / "data").iterdir()) == before  # nothing written into it


def test_no_run_holds_a_prepared_folder_and_no_prepared_folder_goes_inside_a_run(prepared):
    tmp, common = prepared
    inner = tmp / "holder" / "data"
    assert _cli("prepare", RECIPE, *common, f"data.dir={inner}").exit_code == 0
    _refused(_cli("train", RECIPE, *common, f"data.dir={inner}", f"run.out_dir={tmp}", "run.name=holder"), "holds")
    assert not (tmp / "holder" / "config.yaml").exists()

    trained = _cli("train", RECIPE, *common, f"data.dir={tmp}/data", f"run.out_dir={tmp}/runs", "run.name=r")
    assert trained.exit_code == 0, trained.output
    _refused(_cli("prepare", RECIPE, *common, f"data.dir={tmp}/runs/r/data"), "inside the run directory")
    (tmp / "to_run").symlink_to(tmp / "runs" / "r")
    _refused(_cli("prepare", RECIPE, *common, f"data.dir={tmp}/to_run/data"), "inside the run directory")
    assert not (tmp / "runs" / "r" / "data").exists()


def test_prepare_replaces_only_a_folder_of_its_own_files_and_names_the_others(prepared):
    tmp, common = prepared
    data = tmp / "data"
    (data / "notes.txt").write_text("mine\n")
    (data / "sub").mkdir()
    (data / "sub" / "keep.pt").write_bytes(b"weights")
    result = _cli("prepare", RECIPE, *common, f"data.dir={data}", "tokenizer.vocab_size=31")  # a changed setting
    _refused(result, "notes.txt", "sub", "did not make")
    assert (data / "notes.txt").read_text() == "mine\n" and (data / "sub" / "keep.pt").read_bytes() == b"weights"
    (data / "notes.txt").unlink()
    (data / "sub" / "keep.pt").unlink()
    (data / "sub").rmdir()
    assert _cli("prepare", RECIPE, *common, f"data.dir={data}", "tokenizer.vocab_size=31").exit_code == 0
