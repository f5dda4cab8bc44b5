"""The run directory: the one place that names its files.

runs/<run.name>/
  .lock                       held by the training process (files.FolderLock, files.LOCK)
  config.yaml                 the resolved recipe (its paths absolute: run/portable.py)
  tokenizer.model             the tokenizer (spm.model), copied from the prepared data when training starts (text data)
  data.json                   the prepared data's manifest: input files by name and sha256 (model cards)
  train.log                   what training said (train/loop.py; a sweep's point appends its process's output)
  metrics.jsonl               one line per log interval and per validation
  curves.png                  loss, learning rate and validation metric
  sweep.json                  a sweep point's record: its last attempt's outcome (sweep.py)
  eval_<data>_<checkpoint>[_ens<M>][_<setting>...].json (.hyp)   what `tformer eval` measured (_ens<M>: an
                              ensemble of M models, this run's first)
  checkpoints/
    step_00001000.pt          one per save (validation or preemption)
    best.pt                   a byte copy of the step file with the best train.best_metric so far
    index.json                {file: {step, sha256, metric}} and "latest" (a cache of the files)
    averaged_last5.pt         what `tformer average --last 5` wrote
  ctranslate2/
    best_float32/             the export `tformer translate --engine ctranslate2` built (and reuses while
                              its checkpoint is unchanged): <checkpoint label>_<quantization>
"""

from __future__ import annotations

from pathlib import Path

CHECKPOINTS = "checkpoints"
INDEX = "index.json"
BEST = "best.pt"
CONFIG = "config.yaml"
TOKENIZER = "tokenizer.model"  # the SentencePiece model readers load (run/portable.py)
DATA_MANIFEST = "data.json"  # the prepared data's manifest.json as training read it
METRICS = "metrics.jsonl"
CURVES = "curves.png"
TRAIN_LOG = "train.log"
SWEEP_RECORD = "sweep.json"
CTRANSLATE2 = "ctranslate2"  # exports built by `tformer translate --engine ctranslate2`
STEP_PREFIX = "step_"
STEP_GLOB = "step_*.pt"


def step_file(step: int) -> str:
    """The checkpoint file name of update `step` (zero-padded, so names sort by step)."""
    return f"{STEP_PREFIX}{step:08d}.pt"


def averaged_file(n: int) -> str:
    """The default file name of the average of the last `n` step checkpoints."""
    return f"averaged_last{n}.pt"


def run_dir_of(path: Path) -> Path | None:
    """The run directory `path` names: itself when a directory, the run of a checkpoint in
    <run>/checkpoints/, else None (a standalone checkpoint has no run to write beside)."""
    if path.is_dir():
        return path
    return path.parent.parent if path.parent.name == CHECKPOINTS else None


def checkpoint_label(checkpoint: Path, average: int = 0, members: int = 1) -> str:
    """How eval files name the weights: the checkpoint's stem (best, step_00001000), or avg<N> for the
    average of the last N step checkpoints; `_ens<M>` after it for an ensemble of M models led by them."""
    label = f"avg{average}" if average else checkpoint.stem
    return f"{label}_ens{members}" if members > 1 else label


def eval_file(data: str, checkpoint: str, *settings: str, precision: str = "fp32") -> str:
    """The name (without extension) of an eval result in the run directory.

    `eval_<data>_<checkpoint>[_<setting>...][_<precision>]`, so that results of other data, weights or
    decoding settings sit side by side instead of overwriting each other.

    Args:
        data: "valid" (the recipe's validation split), the --test-set name, or the scored text file's name.
        checkpoint: `checkpoint_label` of the weights.
        settings: how the weights were run, e.g. greedy | beam<K>, or blocks | stride<S>.
        precision: decode.precision; fp32 (the weights as trained) is left out of the name.
    """
    parts = [data, checkpoint, *settings, *([precision] if precision != "fp32" else [])]
    return "_".join(["eval", *parts])
