"""Nothing silently wrong: a foreign tokenizer in a prepared folder is refused, and an empty generation says so.

`train` (and every reader of prepared data) checks data.dir/spm.model against the manifest's sha256: a
tokenizer copied in from elsewhere would decode validation BLEU with the wrong pieces.
"""

import random
import shutil
from pathlib import Path

import pytest
from tiny_models import WORDS
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.config import load_config
from tformer_cli.data.prepared import PreparedData
from tformer_cli.errors import DataError

ROOT = Path(__file__).parents[2]
LM = str(ROOT / "recipes/wikitext2_lm.yaml")
runner = CliRunner()


def _prepare(tmp: Path, name: str, vocab: int) -> list[str]:
    rng = random.Random(0)
    for split, n in (("train", 200), ("valid", 20)):
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))) for _ in range(n)]
        (tmp / f"{split}.txt").write_text("\n".join(lines) + "\n")
    overrides = [
        f"data.train={tmp}/train.txt",
        f"data.valid={tmp}/valid.txt",
        f"data.dir={tmp}/{name}",
        f"tokenizer.vocab_size={vocab}",
        "data.block_size=8",
        f"run.out_dir={tmp}/runs",
    ]
    result = runner.invoke(app, ["prepare", LM, *overrides])
    assert result.exit_code == 0, result.output
    return overrides


def test_train_refuses_a_prepared_folder_whose_tokenizer_is_foreign(tmp_path):
    overrides = _prepare(tmp_path, "data", 40)
    _prepare(tmp_path, "other", 36)
    config = load_config(LM, overrides)
    PreparedData(config.data, config.tokenizer)  # as prepared: fine
    shutil.copy(tmp_path / "other/spm.model", tmp_path / "data/spm.model")  # the same size would not matter
    with pytest.raises(DataError, match="spm.model is not the tokenizer the data was encoded with"):
        PreparedData(config.data, config.tokenizer)
    result = runner.invoke(app, ["train", LM, *overrides, "model.d_model=16", "model.n_heads=2", "model.n_layers=1"])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and lines[-1].startswith("error: "), result.output
    assert "spm.model is not the tokenizer the data was encoded with" in lines[-1], lines[-1]
    assert not (tmp_path / "runs/wikitext2_lm/checkpoints").exists()
    (tmp_path / "data/spm.model").unlink()
    with pytest.raises(DataError, match="spm.model is missing"):
        PreparedData(config.data, config.tokenizer)


@pytest.mark.parametrize("produced", ["", " the cat"])
def test_an_empty_generation_says_so(lm_run, monkeypatch, produced):
    """The prompt is empty: generation starts from the start token (EOS, as every training line follows one);
    a model whose first token ends the line would print nothing at all, so a warning says why."""

    def generation(model, tokenizer, text, cfg, write, *args, **kwargs):
        assert text == ""
        write(produced)
        return produced

    monkeypatch.setattr("tformer_cli.decoding.stream.stream_generation", generation)
    result = runner.invoke(app, ["generate", str(lm_run / "runs/lm"), "--prompt", ""])
    assert result.exit_code == 0, result.output
    warned = "warning: nothing generated: the model's first token was the end of the line" in result.stderr
    assert warned == (produced == ""), result.stderr
