"""`tformer prepare`: a recipe's data read, its tokenizer trained, the data encoded into data.dir."""

from __future__ import annotations

from pathlib import Path

from tformer_cli.commands.options import Overrides, Recipe, out, to_stderr


def prepare(recipe: Recipe, overrides: Overrides = None) -> None:
    """Read the recipe's data (local files or the hub), train SentencePiece, encode to data.dir.

    Reads the recipe's local files, or downloads its hub dataset. Writes data.dir whole or not at all (its
    tokenizer, token arrays and manifest.json); a folder there that is not an earlier output of prepare is refused.
    Prints the folder and the tokenizer, then per split the lines read, kept and dropped and the tokens; progress
    on stderr.
    """
    from tformer_cli.config import load_config
    from tformer_cli.data.prepare import prepare as prepare_data
    from tformer_cli.data.report import prepared_lines
    from tformer_cli.kinds import DATA_KINDS
    from tformer_cli.outputs import check_data_dir

    config = load_config(recipe, overrides or [])
    if not DATA_KINDS[config.data.kind].generated:
        check_data_dir(Path(config.data.dir))
    for line in prepared_lines(config.data.dir, prepare_data(config.data, config.tokenizer, log=to_stderr)):
        out.print(line)
