"""What `tformer prepare` says while it works: the tokenizer's training (on how many sentences at most) and its
time, each split's encoding as it starts, and each split's counts once, at the end."""

import re

from tiny_models import tiny_mt_recipe
from typer.testing import CliRunner

from tformer_cli.cli import app

runner = CliRunner()


def test_prepare_says_each_phase_and_the_counts_once(tmp_path):
    recipe = tiny_mt_recipe(tmp_path)
    result = runner.invoke(app, ["prepare", str(recipe)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(
        line.startswith("training SentencePiece (bpe, 60 pieces, on a sample of at most 2,000,000 sentences) on ")
        for line in lines
    )
    assert any(re.fullmatch(r"tokenizer trained in \d+ s", line) for line in lines)
    assert lines.index("encoding train (1 worker)") < lines.index("encoding valid (1 worker)")
    for split in ("train", "valid"):
        assert len([line for line in lines if re.match(rf"\s*{split}: read ", line)]) == 1, result.output
