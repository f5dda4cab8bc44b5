"""A run that travels: what it records so that every command finds what it needs from any directory.

Hugging Face's `save_pretrained`, litgpt's checkpoint folder and Marian's model + vocabulary keep the tokenizer
with the weights; a tformer run keeps it too (layout.TOKENIZER, copied by training when the run starts), with
the manifest of the data it was prepared with (layout.DATA_MANIFEST: the input files by name and sha256). The
paths a run records (data.dir, run.out_dir, train.init_from) are absolute, so that they mean the same from
wherever a command runs.

Runs made before keep relative paths, which meant the directory training ran in: where the run folder still
sits at run.out_dir/run.name below that directory, that directory is found from the run folder itself
(`training_dir`); otherwise they are read from the current directory, as they were.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from tformer_cli.config import config_to_dict, load_config
from tformer_cli.errors import DataError, TformerError
from tformer_cli.run.layout import CONFIG, TOKENIZER
from tformer_cli.schema import Config

PREPARED_TOKENIZER = "spm.model"  # the tokenizer's name in a prepared data folder (data/prepare.py)


def _absolute(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def with_absolute_paths(config: Config) -> Config:
    """`config` with data.dir, run.out_dir and train.init_from absolute (from the current directory).

    The data's input files (data.train, ...) stay as given: the prepared folder's manifest names them so, and
    it is the prepared folder, not those files, that a run reads.
    """
    init_from = config.train.init_from
    return dataclasses.replace(
        config,
        run=dataclasses.replace(config.run, out_dir=_absolute(config.run.out_dir)),
        data=dataclasses.replace(config.data, dir=_absolute(config.data.dir)),
        train=dataclasses.replace(config.train, init_from=init_from and _absolute(init_from)),
    )


def absolute_paths_of(saved: dict[str, Any], run_dir: Path | None = None) -> dict[str, Any]:
    """A saved config (config_to_dict's tree) with its recorded paths absolute: relative ones are read from the
    directory training ran in (`training_dir`) where `run_dir` shows it, else from the current directory."""
    base = training_dir(run_dir, saved) if run_dir is not None else None
    tree = {section: dict(values) if isinstance(values, dict) else values for section, values in saved.items()}
    for section, key in (("run", "out_dir"), ("data", "dir"), ("train", "init_from")):
        value = tree.get(section, {}).get(key)
        if isinstance(value, str):
            tree[section][key] = _absolute(os.path.join(base, value) if base is not None else value)
    return tree


def training_dir(run_dir: Path, saved: dict[str, Any]) -> str | None:
    """The directory training ran in, for a run that recorded a relative run.out_dir: `run_dir` less its last
    parts when they are run.out_dir/run.name (None when they are not, or run.out_dir is absolute)."""
    run = saved.get("run", {})
    out_dir, name = run.get("out_dir"), run.get("name")
    if not isinstance(out_dir, str) or not isinstance(name, str) or os.path.isabs(out_dir):
        return None
    tail = [part for part in Path(os.path.normpath(os.path.join(out_dir, name))).parts if part != "."]
    here = Path(os.path.abspath(run_dir)).parts
    if ".." in tail or len(tail) >= len(here) or list(here[-len(tail) :]) != tail:
        return None
    return str(Path(*here[: -len(tail)]))


def tokenizer_file(run_dir: Path | None, saved: dict[str, Any], data_dir: str) -> Path:
    """The tokenizer a run's commands read: the run's own copy, else (a run made before runs kept one, or a
    checkpoint outside a run folder) the one in the data folder it was trained on.

    Raises:
        DataError: neither is there; the message names every path tried and why each was tried.
    """
    tried = []
    if run_dir is not None:
        kept = run_dir / TOKENIZER
        if kept.is_file():
            return kept
        tried.append(f"{kept} (the run's own copy: absent, a run trained before runs kept it, or removed)")
    else:
        tried.append("no run folder (the checkpoint is not in a run's checkpoints/ folder)")
    recorded = Path(data_dir)
    candidates = []
    if recorded.is_absolute():
        candidates.append((recorded, "as recorded"))
    else:
        base = training_dir(run_dir, saved) if run_dir is not None else None
        if base is not None:
            candidates.append((Path(base) / recorded, "relative to the directory training ran in"))
        candidates.append((Path(os.path.abspath(recorded)), "relative to the current directory"))
    for folder, why in candidates:
        path = folder / PREPARED_TOKENIZER
        if path.is_file():
            return path
        tried.append(f"{path} (data.dir={data_dir}, {why})")
    raise DataError(f"tokenizer not found: tried {'; '.join(tried)}")


def run_folder_recipe(run_dir: Path, overrides: list[str]) -> Config:
    """The recipe a run folder trained with (its config.yaml), with `overrides`, to resume it where it is.

    run.out_dir and run.name become the folder's own (a run copied elsewhere resumes in the copy); relative
    paths of a run made before are read from the directory training ran in where the folder shows it.

    Raises:
        TformerError: no config.yaml in the folder, or an override of run.out_dir or run.name (one line each).
        ConfigError: config.yaml or an override is invalid (as for any recipe).
    """
    recipe = run_dir / CONFIG
    if not recipe.is_file():
        raise TformerError(
            f"{run_dir} is a folder without {CONFIG}: give a recipe file, or a run folder (which holds {CONFIG})"
        )
    moved = [item for item in overrides if item.startswith(("run.out_dir=", "run.name="))]
    if moved:
        raise TformerError(
            f"{moved[0]}: a run folder resumes where it is; to start a new run from its settings give its recipe: "
            f"`tformer train {recipe} {moved[0]}`"
        )
    config = load_config(recipe, overrides)
    tree = absolute_paths_of(config_to_dict(config), run_dir)
    return dataclasses.replace(
        config,
        run=dataclasses.replace(config.run, out_dir=os.path.abspath(run_dir.parent), name=run_dir.name),
        data=dataclasses.replace(config.data, dir=tree["data"]["dir"]),
        train=dataclasses.replace(config.train, init_from=tree["train"]["init_from"]),
    )
