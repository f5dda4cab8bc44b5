"""recipes/multi30k_en_de.yaml end to end on a slice of the real Multi30k files, read through the data root
($TFORMER_DATA) as a user's machine would: prepare, a few updates, a translation, the test set scored.
Skipped where the shared data folder (../shared/data/multi30k beside the repository) is absent."""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tformer_cli.cli import app

ROOT = Path(__file__).parents[2]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
RECIPE = str(ROOT / "recipes" / "multi30k_en_de.yaml")
SLICE = {"train": 3000, "val": 60, "test_2016_flickr": 20}  # lines of each file

pytestmark = pytest.mark.skipif(not MULTI30K.is_dir(), reason=f"{MULTI30K} is absent (the shared data folder)")
runner = CliRunner()


def _invoke(*args: str):
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output + str(result.exception)
    return result


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """A data root holding multi30k/ with the first lines of the official train, val and test2016 files."""
    root = tmp_path_factory.mktemp("data_root")
    (root / "multi30k").mkdir()
    for name, lines in SLICE.items():
        for lang in ("en", "de"):
            text = (MULTI30K / f"{name}.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
            (root / "multi30k" / f"{name}.{lang}").write_text("".join(text[:lines]), encoding="utf-8")
    return root


def test_the_recipe_prepares_trains_translates_and_scores(data_root, tmp_path, monkeypatch):
    monkeypatch.setenv("TFORMER_DATA", str(data_root))
    where = [f"data.dir={tmp_path}/data", f"run.out_dir={tmp_path}/runs"]
    prepared = _invoke("prepare", RECIPE, *where, "tokenizer.vocab_size=1000")
    assert f"on {data_root}/multi30k/train" in prepared.output  # the local files, not the hub
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert {split: manifest["splits"][split]["read"] for split in ("train", "valid", "test")} == {
        "train": 3000, "valid": 60, "test": 20
    }  # fmt: skip
    _invoke(
        "train", RECIPE, *where, "tokenizer.vocab_size=1000",
        "train.max_updates=4", "train.warmup_steps=2", "train.valid_every=4", "train.valid_bleu_lines=10",
        "train.compile=false",  # the recipe compiles: 90 s of two cores for 4 updates (test_compile_shapes.py compiles)
    )  # fmt: skip
    run = tmp_path / "runs" / "multi30k_en_de"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in records if r["split"] == "valid"]
    assert valid and valid[-1]["step"] == 4 and "bleu" in valid[-1]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["train"]["precision"] in ("bf16", "fp32")  # `auto`, resolved and recorded
    assert saved["data"]["train"] == f"{data_root}/multi30k/train"
    translated = runner.invoke(app, ["translate", str(run), "decode.max_len_b=5"], input="A man rides a bike.\n")
    assert translated.exit_code == 0 and len(translated.stdout.splitlines()) == 1, translated.output
    test = data_root / "multi30k" / "test_2016_flickr"
    scored = _invoke(
        "eval", str(run), "--src", f"{test}.en", "--ref", f"{test}.de", "--test-set", "test2016", "decode.max_len_b=5"
    )
    assert "BLEU" in scored.stdout and "nrefs:1|case:mixed|eff:no|tok:13a" in scored.stdout
