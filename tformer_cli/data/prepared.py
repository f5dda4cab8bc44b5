"""data.dir read back: what `prepare` wrote, checked against the recipe before anything is read from it.

Training (train/tasks.py) and `tformer eval` (validation.py) open prepared data only through here, so
both refuse the same stale or foreign data with the same message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tformer_cli.data.batching import TokenArray
from tformer_cli.data.manifest import MANIFEST, check_made_for, data_dir_lock, foreign_tokenizer, read_manifest
from tformer_cli.errors import DataError
from tformer_cli.files import FolderLock
from tformer_cli.schema import Config


class PreparedData:
    """The tokenizer and token arrays of data.dir, as its manifest lists them.

    While this object lives it holds data.dir's lock shared (`manifest.data_dir_lock`): `tformer prepare`
    refuses to replace the folder under a training run (whose task keeps it) and names the run's process.
    """

    def __init__(self, config: Config) -> None:
        """Lock data.dir for reading, then read and check its manifest.

        Raises:
            DataError: no or a damaged manifest, another data kind, data prepared with other data or
                tokenizer settings (or by an older tformer), an spm.model other than the one the data was
                encoded with (its sha256 against the manifest's), or no validation split (one line each).
            TformerError: a `tformer prepare` is writing data.dir (naming its process).
        """
        self.dir = Path(config.data.dir)
        self._lock = _read_lock(self.dir)
        self.manifest: dict[str, Any] = _checked_manifest(config)
        self.vocab_size = int(self.manifest["tokenizer"]["vocab_size"])
        self.tokenizer_fingerprint: str = self.manifest["tokenizer"]["fingerprint"]
        self.tokenizer_path = self.dir / "spm.model"

    def array(self, split: str, side: str) -> TokenArray:
        """The memory-mapped tokens of one split ("train", "valid") and side ("src", "tgt", "text")."""
        base = self.dir / f"{split}.{side}"
        return TokenArray(
            base.with_suffix(base.suffix + ".bin"), base.with_suffix(base.suffix + ".idx"), self.manifest["dtype"]
        )


def _read_lock(folder: Path) -> FolderLock | None:
    """data.dir's lock, held shared; None where there is nothing to lock (no folder yet: the manifest check
    says so) or no lock file can be made (a read-only parent, where no prepare can replace the folder either)."""
    if not folder.is_dir():
        return None
    lock = data_dir_lock(folder, shared=True)
    try:
        return lock.acquire()
    except OSError:
        return None


def _checked_manifest(config: Config) -> dict[str, Any]:
    """The manifest of data.dir, checked against the recipe (see `PreparedData`)."""
    manifest_path = Path(config.data.dir) / MANIFEST
    manifest = read_manifest(manifest_path.parent)
    if manifest is None:
        raise DataError(f"{manifest_path} not found: run `tformer prepare` with this recipe first")
    if manifest.get("kind") != config.data.kind:
        raise DataError(
            f"{manifest_path} holds {manifest.get('kind')} data, the recipe says data.kind={config.data.kind}"
        )
    check_made_for(manifest, config, manifest_path)
    if config.data.kind in ("text", "parallel") and (foreign := foreign_tokenizer(manifest_path.parent, manifest)):
        raise DataError(f"{manifest_path.parent}: {foreign}; run `tformer prepare` with this recipe again")
    if "valid" not in manifest["splits"]:
        raise DataError(_no_validation_split(config))
    return manifest


def _no_validation_split(config: Config) -> str:
    """What to set when the prepared data (made with this recipe) has no validation split."""
    d = config.data
    if d.train is None:
        return (
            f"data.valid_split is empty: training needs a validation split; set data.valid_split=NAME "
            f"(a split of {d.hub}) and run `tformer prepare` again"
        )
    return (
        "data.valid is not set: training needs a validation split; set data.valid=PATH "
        "(or data.hub with a validation split) and run `tformer prepare` again"
    )
