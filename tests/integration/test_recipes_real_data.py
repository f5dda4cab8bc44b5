"""Every shipped recipe that reads real files, on a slice of them: its files are where it says under the data root,
and with a data root of their first lines it prepares (its own settings, a smaller vocabulary), trains a few updates
(its own model), the training loss stays finite and falls, and the checkpoint loads.

The data root is $TFORMER_DATA, else the shared data folder beside the repository (../shared/data); the tests are
skipped where it is absent. The few overrides beside train.max_updates, and why:
- tokenizer.vocab_size: a vocabulary that a few hundred lines can fill;
- train.warmup_steps: half the updates, so that the learning rate rises within them (a recipe's warm-up of hundreds
  of updates would leave a few updates at a rate too small to move the loss); with the inverse square-root
  schedule, whose warm-up sets its peak, train.lr_scale too, so that the peak is the recipe's;
- train.log_every=1 (every update's loss), train.valid_every (one validation, at the end), train.compile=false
  (compiling is tested in tests/unit/train/test_compile_shapes.py; here it would cost minutes);
- a smaller batch: train.batch_size=4 blocks for the language models (the recipes' 16 blocks of 256 tokens make an
  update of seconds), train.max_tokens=1024 for translation (half the recipes'); the models are the recipes'.
"""

import gzip
import json
import math
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.config import load_config
from tformer_cli.data.sources import local_files
from tformer_cli.evaluate import evaluate_checkpoint
from tformer_cli.run import load_run

ROOT = Path(__file__).parents[2]
DATA_ROOT = Path(os.environ.get("TFORMER_DATA") or ROOT.parent / "shared" / "data")
LINES = {"train": 400, "valid": 10, "test": 10}  # of each file of a split
UPDATES = 6
VOCAB = {"unigram": 400, "bpe": 400}
SMALLER_BATCH = {"text": "train.batch_size=4", "parallel": "train.max_tokens=1024"}  # see the module's docstring

runner = CliRunner()


def real_file_recipes() -> list[str]:
    """The recipes whose data section names files under the data root."""
    names = []
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())["data"]
        named = [data.get(split) for split in LINES]
        flat = [item for spec in named for item in (spec if isinstance(spec, list) else [spec])]
        if any(isinstance(item, str) and item.startswith("$TFORMER_DATA/") for item in flat):
            names.append(path.stem)
    return names


RECIPES = real_file_recipes()
pytestmark = pytest.mark.skipif(not DATA_ROOT.is_dir(), reason=f"{DATA_ROOT} is absent (the data root)")


def test_the_recipes_that_read_real_files_are_all_found():
    expected = {"wikitext2_lm", "wikitext2_lstm", "multi30k_en_de", "multi30k_de_en", "wmt14_small"}
    assert expected <= set(RECIPES)


def sliced(path: Path, root: Path, lines: int) -> None:
    """The first `lines` lines of `path` (under DATA_ROOT) at the same place under `root`, gzipped as it is."""
    out = root / path.relative_to(DATA_ROOT)
    out.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as source, opener(out, "wt", encoding="utf-8") as sink:
        for number, line in enumerate(source):
            if number == lines:
                break
            sink.write(line)


def peak_rate_kept(config) -> list[str]:
    """For the inverse square-root schedule, whose warm-up sets its peak: train.lr_scale such that the shorter
    warm-up peaks at the recipe's own rate (at the recipe's warm-up, the few updates would see a tiny rate)."""
    t = config.train
    if t.schedule != "inverse_sqrt" or not t.warmup_steps:
        return []
    return [f"train.lr_scale={t.lr_scale * math.sqrt(UPDATES // 2 / t.warmup_steps)!r}"]


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output + str(result.exception)
    return result


@pytest.mark.parametrize("name", RECIPES)
def test_the_recipe_trains_on_a_slice_of_its_real_files(name, tmp_path, monkeypatch):
    recipe = ROOT / "recipes" / f"{name}.yaml"
    monkeypatch.setenv("TFORMER_DATA", str(DATA_ROOT))
    config = load_config(recipe, [])
    files = local_files(config.data)
    missing = [str(path) for paths in files.values() for path in paths if not path.is_file()]
    assert not missing, f"{name} names files that are not in the data root: {missing}"

    slice_root = tmp_path / "slice"
    for split, paths in files.items():
        for path in paths:
            sliced(path, slice_root, LINES[split])
    monkeypatch.setenv("TFORMER_DATA", str(slice_root))
    where = [f"data.dir={tmp_path}/data", f"run.out_dir={tmp_path}/runs", f"run.name={name}"]
    vocab = f"tokenizer.vocab_size={VOCAB[config.tokenizer.kind]}"
    invoke("prepare", str(recipe), *where, vocab)
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    corpora = config.data.train if isinstance(config.data.train, tuple) else (config.data.train,)
    assert manifest["splits"]["train"]["read"] == LINES["train"] * len(corpora)  # the slice, not the hub

    train = [f"train.max_updates={UPDATES}", f"train.warmup_steps={UPDATES // 2}", "train.log_every=1"]
    train += [f"train.valid_every={UPDATES}", "train.compile=false"]
    train += [SMALLER_BATCH[config.data.kind]]
    train += peak_rate_kept(config)
    invoke("train", str(recipe), *where, vocab, *train)

    run = tmp_path / "runs" / name
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["split"] == "train"]
    assert len(losses) == UPDATES and all(math.isfinite(loss) for loss in losses), losses
    assert sum(losses[-2:]) < sum(losses[:2]), losses  # falls: the last two updates' below the first two's
    # the checkpoint read back (verified, weights_only) scores the validation slice as training last did
    loaded = load_run(run, device="cpu")
    assert loaded.config.model == load_config(recipe, [vocab]).model
    valid = [r for r in records if r["split"] == "valid"][-1]
    assert evaluate_checkpoint(loaded)["loss"] == pytest.approx(valid["loss"], rel=1e-3)
