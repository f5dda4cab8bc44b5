"""`tformer eval`: recompute a run's metrics from a checkpoint, with nothing but the checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tformer_cli.errors import CheckpointError, DataError
from tformer_cli.files import write_json
from tformer_cli.run import load_run
from tformer_cli.run.layout import eval_file
from tformer_cli.validation import PatternValidation, classifier_scores, validation_set


def confusion_matrix(predicted: torch.Tensor, labels: torch.Tensor, n_classes: int) -> list[list[int]]:
    """counts[true][predicted]."""
    counts = torch.zeros(n_classes * n_classes, dtype=torch.long)
    counts.index_add_(0, labels * n_classes + predicted, torch.ones_like(labels))
    return counts.view(n_classes, n_classes).tolist()


def evaluate_checkpoint(path: Path, device: str = "auto") -> dict[str, Any]:
    """Score the validation split of the checkpoint's own recipe as training did (validation.py).

    Returns:
        checkpoint, split, and the metrics: loss, ppl and accuracy (and bleu for translation); for a
        classifier n, loss, accuracy and confusion (counts[true][predicted]). In a run directory, also
        written as JSON beside it (`eval_valid_<checkpoint>.json`).

    Raises:
        CheckpointError: the checkpoint does not verify, or the model was trained with another tokenizer
            than the one in data.dir or the one the prepared data was encoded with.
    """
    run = load_run(path, device=device, cast=False)  # the weights as trained, as training validated them
    valid = validation_set(run.config)
    if valid.tokenizer_fingerprint != run.tokenizer_fingerprint:
        raise CheckpointError(
            f"{run.checkpoint} was trained with another tokenizer than the data in {run.config.data.dir} "
            f"(fingerprints {str(run.tokenizer_fingerprint)[:12]} vs {str(valid.tokenizer_fingerprint)[:12]})"
        )
    if isinstance(valid, PatternValidation):
        logits, labels = valid.predict(run.model, run.device)
        confusion = confusion_matrix(logits.argmax(-1), labels, valid.n_classes)
        metrics = {"n": int(labels.numel()), **classifier_scores(logits, labels), "confusion": confusion}
    else:
        metrics = valid.evaluate(run.model, run.device)
    result = {"checkpoint": str(run.checkpoint), "split": "valid", **metrics}
    if run.run_dir is not None:
        write_json(run.run_dir / f"{eval_file('valid', run.label)}.json", result)
    return result


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
