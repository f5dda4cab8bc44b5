"""`tformer check`'s data lines (data/report.py): data.dir's state against the recipe comes as values, and a
refusal of several differing settings is reported whole, with the commands that work after it."""

import random
from pathlib import Path

from tiny_models import WORDS
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.config import load_config
from tformer_cli.data.prepare import prepare
from tformer_cli.data.report import data_report, folder_state

MULTI30K = str(Path(__file__).parents[2] / "recipes" / "multi30k_en_de.yaml")
runner = CliRunner()


def _prepared(tmp_path: Path) -> list[str]:
    rng = random.Random(0)
    for split, n in (("train", 200), ("valid", 20)):
        for lang in ("en", "de"):
            lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8))) for _ in range(n)]
            (tmp_path / f"{split}.{lang}").write_text("\n".join(lines) + "\n")
    overrides = [
        f"data.train={tmp_path}/train",
        f"data.valid={tmp_path}/valid",
        f"data.dir={tmp_path}/out",
        "tokenizer.vocab_size=40",
    ]
    config = load_config(MULTI30K, overrides)
    prepare(config.data, config.tokenizer, log=lambda _: None)
    return overrides


def test_the_folder_state_is_values_and_several_differences_are_reported_whole(tmp_path):
    overrides = [*_prepared(tmp_path), "tokenizer.vocab_size=41", "data.max_len=100"]
    config = load_config(MULTI30K, overrides)
    state = folder_state(config.data, config.tokenizer, MULTI30K, overrides)
    assert state.refused == (
        "prepared with other settings: data.max_len=128 there, 100 in the recipe; "
        "tokenizer.vocab_size=40 there, 41 in the recipe"
    )
    assert state.advice.startswith(f"prepare it again with `tformer prepare {MULTI30K}")
    assert f"or train on it as prepared with `tformer train {MULTI30K}" in state.advice
    assert "data.max_len=128 tokenizer.vocab_size=40`" in state.advice
    line = data_report(config.data, config.tokenizer, MULTI30K, overrides).lines[-1]
    assert line == f"  data.dir {tmp_path}/out: {state.refused}: {state.advice}"
    result = runner.invoke(app, ["check", MULTI30K, *overrides])
    assert result.exit_code == 0 and line in result.stdout.splitlines(), result.output


def test_a_folder_prepared_as_the_recipe_says_is_taken_as_it_is(tmp_path):
    overrides = _prepared(tmp_path)
    config = load_config(MULTI30K, overrides)
    state = folder_state(config.data, config.tokenizer, MULTI30K, overrides)
    assert (state.refused, state.taken, state.data) == (None, None, config.data)
    assert data_report(state.data, config.tokenizer, MULTI30K, overrides).lines[-1] == (
        f"  data.dir {tmp_path}/out: prepared and matches the recipe"
    )
