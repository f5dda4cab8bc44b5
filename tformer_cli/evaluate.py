"""`tformer eval`: recompute a run's metrics from a checkpoint, with nothing but the checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tformer_cli.config import config_from_dict
from tformer_cli.errors import CheckpointError, DataError
from tformer_cli.files import write_json
from tformer_cli.train.loop import resolve_device
from tformer_cli.train.store import BEST, load_verified, read_index
from tformer_cli.train.tasks import ClassifierTask, make_task


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint file as given, or a run directory's best (else latest) checkpoint.

    Raises:
        CheckpointError: no such path, no checkpoint in the run, or an unreadable index.json.
    """
    if not path.exists():
        raise CheckpointError(f"no such run directory or checkpoint: {path}")
    if not path.is_dir():
        return path
    folder = path / "checkpoints"
    index = read_index(folder)
    if (folder / BEST).is_file():
        return folder / BEST
    latest = index["latest"] if index is not None else None
    if latest and (folder / latest).is_file():
        return folder / latest
    steps = sorted(folder.glob("step_*.pt"))  # no index (it is only a cache): the newest step file
    if steps:
        return steps[-1]
    raise CheckpointError(f"{path}: no checkpoints in this run directory")


def confusion_matrix(predicted: torch.Tensor, labels: torch.Tensor, n_classes: int) -> list[list[int]]:
    """counts[true][predicted]."""
    counts = torch.zeros(n_classes * n_classes, dtype=torch.long)
    counts.index_add_(0, labels * n_classes + predicted, torch.ones_like(labels))
    return counts.view(n_classes, n_classes).tolist()


def evaluate_checkpoint(path: Path, device: str = "auto") -> dict[str, Any]:
    """Rebuild the model and data from the checkpoint's own recipe and score the validation split.

    Returns:
        accuracy, loss, n, confusion (counts[true][predicted]), checkpoint; also written as JSON
        next to the run (`eval_<checkpoint>.json`).

    Raises:
        CheckpointError: the checkpoint does not verify, or the prepared data's tokenizer is not the one
            the model was trained with.
    """
    ckpt_path = resolve_checkpoint(path)
    state = load_verified(ckpt_path)
    config = config_from_dict(state["config"], where=str(ckpt_path))
    task = make_task(config)
    if not isinstance(task, ClassifierTask) and state.get("tokenizer_fingerprint") != task.tokenizer_fingerprint:
        raise CheckpointError(
            f"{ckpt_path} was trained with another tokenizer than the data in {config.data.dir} "
            f"(fingerprints {str(state.get('tokenizer_fingerprint'))[:12]} vs {task.tokenizer_fingerprint[:12]})"
        )
    model = task.build_model()
    model.load_state_dict(state["model"])
    model.to(resolve_device(device))
    if not isinstance(task, ClassifierTask):
        result = {
            "checkpoint": str(ckpt_path),
            "split": "valid",
            **task.evaluate(model, next(model.parameters()).device),
        }
        _write_beside_run(ckpt_path, result)
        return result
    logits, labels = task.predict(model, next(model.parameters()).device)
    predicted = logits.argmax(-1)
    result = {
        "checkpoint": str(ckpt_path),
        "split": "valid",
        "n": int(labels.numel()),
        "accuracy": float((predicted == labels).float().mean()),
        "loss": float(torch.nn.functional.cross_entropy(logits, labels)),
        "confusion": confusion_matrix(predicted, labels, task.n_classes),
    }
    _write_beside_run(ckpt_path, result)
    return result


def _write_beside_run(ckpt_path: Path, result: dict[str, Any]) -> None:
    if ckpt_path.parent.name == "checkpoints":
        write_json(ckpt_path.parent.parent / f"eval_{ckpt_path.stem}.json", result)


# Test sets whose size we know: BLEU on the full and the filtered newstest2014 differ, so say which.
KNOWN_TEST_SETS = {"newstest2014-full": 3003, "newstest2014-filtered": 2737, "newstest2013": 3000}


def evaluate_translation(hypotheses: list[str], references: list[str], test_set: str) -> dict[str, Any]:
    """sacreBLEU BLEU and chrF of detokenized hypotheses against raw references (same line count)."""
    from tformer_cli.metrics import bleu_chrf, looks_tokenized

    if len(hypotheses) != len(references):
        raise DataError(f"{len(hypotheses)} hypotheses but {len(references)} references: line counts must match")
    expected = KNOWN_TEST_SETS.get(test_set)
    if expected is not None and len(references) != expected:
        raise DataError(
            f"--test-set {test_set} has {expected} lines, the reference has {len(references)}: "
            f"{'the filtered set is newstest2014-filtered' if len(references) == 2737 else 'wrong file?'}"
        )
    result: dict[str, Any] = {"test_set": test_set, "lines": len(references), **bleu_chrf(hypotheses, references)}
    result["reference_looks_tokenized"] = looks_tokenized(references)
    return result


def evaluate_lm_text(model, tokenizer, lines: list[str], window: int, stride: int) -> dict[str, Any]:
    """Perplexity per token and per word, and bits per byte, of raw text lines (each ends with EOS)."""
    from tformer_cli.metrics import Perplexity, count_words_and_bytes, stream_nll
    from tformer_cli.tokenizer import EOS_ID

    ids = [EOS_ID]  # the stream starts after an end-of-line, so the first token is scored too
    for row in tokenizer.encode(lines):
        ids += row + [EOS_ID]
    nll, scored = stream_nll(model, torch.tensor(ids), window, stride)
    words, n_bytes = count_words_and_bytes(lines)
    ppl = Perplexity(nll, scored, words, n_bytes)
    return {
        "tokens": scored,
        "words": words,
        "bytes": n_bytes,
        "window": window,
        "stride": stride,
        "nll": nll,
        "ppl_token": ppl.per_token,
        "ppl_word": ppl.per_word,
        "bits_per_byte": ppl.bits_per_byte,
    }
