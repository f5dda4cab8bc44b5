"""What a run keeps of its prepared data when it starts: the tokenizer and the data's manifest (run/portable.py).

With them in the run folder, translate, eval, generate, export and attention need no data folder: the run
still serves after its data folder is deleted or prepared again, and wherever the run folder is copied.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tformer_cli.data.manifest import MANIFEST
from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_path
from tformer_cli.kinds import DATA_KINDS
from tformer_cli.run.layout import DATA_MANIFEST, TOKENIZER
from tformer_cli.run.portable import PREPARED_TOKENIZER
from tformer_cli.schema import Config
from tformer_cli.tokenizer import fingerprint


def keep_prepared_data(config: Config, run_dir: Path, tokenizer_fingerprint: str | None) -> None:
    """Copy data.dir's tokenizer (unless the run holds it already) and manifest into `run_dir`, atomically.

    Args:
        config: the run's recipe; generated data (no tokenizer, no manifest) keeps nothing.
        tokenizer_fingerprint: the sha256 of the tokenizer the run trains with (the data manifest's).

    Raises:
        TformerError: the copy is not that tokenizer (data.dir changed under the run).
    """
    if DATA_KINDS[config.data.kind].generated:
        return
    data_dir, kept = Path(config.data.dir), run_dir / TOKENIZER
    if not kept.is_file() or fingerprint(kept) != tokenizer_fingerprint:
        with atomic_path(kept) as tmp:
            shutil.copyfile(data_dir / PREPARED_TOKENIZER, tmp)
            if fingerprint(tmp) != tokenizer_fingerprint:
                raise TformerError(f"{data_dir / PREPARED_TOKENIZER} changed while the run started; run again")
    with atomic_path(run_dir / DATA_MANIFEST) as tmp:
        shutil.copyfile(data_dir / MANIFEST, tmp)
