"""Where a machine keeps local copies of the data sets: `$TFORMER_DATA`, set once (e.g. in ~/.bashrc).

A shipped recipe names its data twice: the Hugging Face dataset (`data.hub`) and the local files under
the data root (`data.train: $TFORMER_DATA/multi30k/train`). With `TFORMER_DATA` set, `$TFORMER_DATA` in
data.train / valid / test becomes that folder and the local files are read; unset, the recipe reads its
hub dataset; a recipe without one says what to set. Where the user gives some of the paths in full and the
root is unset, those files are read and the splits left under the root are not (nor the hub). The resolved
paths are what a run records (its config.yaml, the prepared data's manifest): a run names its files.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from tformer_cli.errors import ConfigError
from tformer_cli.schema import DataConfig

ENV = "TFORMER_DATA"
PLACEHOLDER = "$" + ENV
_SPLITS = ("train", "valid", "test")


def _paths(spec: str | tuple[str, ...] | None) -> tuple[str, ...]:
    return () if spec is None else (spec,) if isinstance(spec, str) else spec


def _substituted(spec: str | tuple[str, ...] | None, root: str) -> str | tuple[str, ...] | None:
    if spec is None:
        return None
    if isinstance(spec, str):
        return spec.replace(PLACEHOLDER, root)
    return tuple(path.replace(PLACEHOLDER, root) for path in spec)


def with_data_root(d: DataConfig, where: str) -> DataConfig:
    """The data section `d` with `$TFORMER_DATA` in its local paths resolved (see the module's docstring).

    Args:
        d: a recipe's data section as written, with its overrides.
        where: the recipe's name, for the message.

    Raises:
        ConfigError: every local path names `$TFORMER_DATA` while it is unset, and the recipe names no hub
            dataset.
    """
    specs = {split: getattr(d, split) for split in _SPLITS}
    rooted = [split for split, spec in specs.items() if any(PLACEHOLDER in path for path in _paths(spec))]
    if not rooted:
        return d
    root = os.environ.get(ENV, "").rstrip("/")
    if root:
        resolved: dict[str, Any] = {split: _substituted(spec, root) for split, spec in specs.items()}
        return dataclasses.replace(d, **resolved)
    given = [split for split, spec in specs.items() if spec is not None and split not in rooted]
    if given:  # the user's own files: the splits left under the unset root are not read (nor the hub)
        unread: dict[str, Any] = dict.fromkeys(rooted)
        return dataclasses.replace(d, **unread)
    if d.hub is not None:
        return dataclasses.replace(d, train=None, valid=None, test=None)
    first = _paths(specs[rooted[0]])[0]
    raise ConfigError(
        f"{where}: data.{rooted[0]} is {first!r} and {ENV} is not set: export {ENV}=FOLDER (the folder that "
        f"holds {first.removeprefix(PLACEHOLDER + '/').split('/')[0]}/), or give data.{rooted[0]}=PATH"
    )
