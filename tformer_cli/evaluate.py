"""`tformer eval`: recompute a run's metrics from a checkpoint, with nothing but the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tformer_cli.config import config_from_dict
from tformer_cli.errors import CheckpointError, DataError
from tformer_cli.train.checkpoint import load_checkpoint
from tformer_cli.train.loop import resolve_device
from tformer_cli.train.tasks import ClassifierTask, make_task


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint file as given, or a run directory's best (else last) checkpoint."""
    if path.is_dir():
        if (path / "checkpoints" / "best.pt").is_file():
            return path / "checkpoints" / "best.pt"
        index = path / "checkpoints" / "index.json"
        latest = json.loads(index.read_text()).get("latest") if index.is_file() else None
        if latest and (path / "checkpoints" / latest).is_file():
            return path / "checkpoints" / latest
        raise CheckpointError(f"{path}: no checkpoints in this run directory")
    if not path.exists():
        raise CheckpointError(f"no such run directory or checkpoint: {path}")
    return path


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
    """
    ckpt_path = resolve_checkpoint(path)
    state = load_checkpoint(ckpt_path)
    config = config_from_dict(state["config"], where=str(ckpt_path))
    task = make_task(config)
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
        out = ckpt_path.parent.parent / f"eval_{ckpt_path.stem}.json"
        out.write_text(json.dumps(result, indent=1), encoding="utf-8")


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
