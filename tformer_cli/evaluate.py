"""What `tformer eval`, `bleu` and `perplexity` compute: a run's validation metrics recomputed, BLEU/chrF/TER of
translations, perplexity of text; and each result's report (`*_report`), the lines the command prints."""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tformer_cli.errors import CheckpointError, DataError, TformerError
from tformer_cli.files import write_json, write_text
from tformer_cli.kinds import DATA_KINDS
from tformer_cli.outputs import one_name, refuse_inputs
from tformer_cli.run import Run, not_served
from tformer_cli.run.layout import eval_file
from tformer_cli.schema import DecodeConfig
from tformer_cli.validation import (
    PatternValidation,
    SessionValidation,
    classifier_scores,
    validation_set,
)


@dataclass(frozen=True)
class Report:
    """What a command prints of a result: `lines` on standard output (text, or a rich table), `notes` (warnings)
    on standard error, before them."""

    lines: list[Any]
    notes: list[str] = field(default_factory=list)


def confusion_matrix(predicted: torch.Tensor, labels: torch.Tensor, n_classes: int) -> list[list[int]]:
    """counts[true][predicted]."""
    counts = torch.zeros(n_classes * n_classes, dtype=torch.long, device=labels.device)
    counts.index_add_(0, labels * n_classes + predicted, torch.ones_like(labels))
    return counts.view(n_classes, n_classes).tolist()


def evaluate_checkpoint(run: Run, split: str = "valid") -> dict[str, Any]:
    """Score the validation split of the run's own recipe as training did (validation.py).

    `run` is loaded with its weights as trained (`load_run(..., cast=False)`).

    Args:
        split: "valid"; for generated sessions (data.kind: sessions) also "test".

    Returns:
        checkpoint, split, and the metrics: loss, ppl and accuracy (and bleu for translation); for a
        classifier n, loss, accuracy and confusion (counts[true][predicted]); for sessions the counts
        (sessions, n, n_<rule>) and validation's metrics by rule beside the Bayes-optimal ones. In a run
        directory, also written as JSON beside it (`eval_<split>_<checkpoint>.json`).

    Raises:
        CheckpointError: the model was trained with another tokenizer than the one the prepared data
            was encoded with.
        TformerError: a split that the run's data has not (a test split: generated sessions only).
    """
    if split not in DATA_KINDS[run.config.data.kind].splits:
        having = " or ".join(f"data.kind={kind}" for kind, row in DATA_KINDS.items() if split in row.splits)
        raise not_served(run, f"--split {split}: only {having} has a {split} split")
    valid = validation_set(run.config, split)
    if valid.tokenizer_fingerprint != run.tokenizer_fingerprint:
        raise CheckpointError(
            f"{run.checkpoint} was trained with another tokenizer than the data in {run.config.data.dir} "
            f"(fingerprints {str(run.tokenizer_fingerprint)[:12]} vs {str(valid.tokenizer_fingerprint)[:12]})"
        )
    metrics: dict[str, Any]
    if isinstance(valid, PatternValidation):
        logits, labels = valid.predict(run.model, run.device)
        confusion = confusion_matrix(logits.argmax(-1), labels, valid.n_classes)
        metrics = {"n": int(labels.numel()), **classifier_scores(logits, labels), "confusion": confusion}
    elif isinstance(valid, SessionValidation):
        metrics = {**valid.counts(), **valid.evaluate(run.model, run.device)}
    else:
        metrics = valid.evaluate(run.model, run.device)
    result = {"checkpoint": str(run.checkpoint), "split": split, **metrics}
    _save_beside_run(run, eval_file(split, run.label), result)
    return result


def translate_and_score(
    run: Run,
    sources: list[str],
    references: list[str],
    test_set: str,
    inputs: tuple[Path, ...] = (),
    names: tuple[str, str] = ("the sources", "the references"),
) -> dict[str, Any]:
    """Translate `sources` with the run's decode settings (its model, or the ensemble it leads) and score them
    (`evaluate_translation`).

    In a run directory the scores (with the decoding setting) and the hypotheses are saved beside it,
    one pair of files per test set, weights and setting: `eval_<test set>_<checkpoint>_<search>.json`/.hyp.

    Args:
        inputs: the files `sources` and `references` were read from, which the saved files must not replace.
        names: what `sources` and `references` are called in an error (their files' names).

    Returns:
        `evaluate_translation`'s result plus `decode` (beam, len_penalty, average_last, ensemble, precision).

    Raises:
        TformerError: a `test_set` that is not a plain name (it becomes part of the files' names), or a saved
            file that would replace one of `inputs`.
    """
    from tformer_cli.decoding.translate import translate_stream
    from tformer_cli.log import LineProgress

    one_name(test_set, "--test-set")
    same_line_counts(len(sources), len(references), names, "each source line needs its reference on the same line")
    dc = run.config.decode
    assert run.tokenizer is not None  # a run that translates (check_served) has its tokenizer
    with LineProgress("translated", len(sources)) as progress:
        hypotheses = list(
            translate_stream(
                run.model, run.tokenizer, sources, dc, False, served=run.config.model.max_len, on_done=progress.advance
            )
        )
    result = evaluate_translation(hypotheses, references, test_set, names=("the translations", names[1]))
    result["decode"] = {
        "beam": dc.beam,
        "len_penalty": dc.len_penalty,
        "average_last": run.average,
        "ensemble": [str(p) for p in (run.checkpoint, *run.ensemble)] if run.ensemble else [],
        "precision": dc.precision,
        "min_len": dc.min_len,
        "no_repeat_ngram": dc.no_repeat_ngram,
        "repetition_penalty": dc.repetition_penalty,
    }
    name = eval_file(test_set, run.label, *search_settings(dc), precision=dc.precision)
    _save_beside_run(run, name, result, hypotheses, inputs, scored=names)
    return result


def search_settings(dc: DecodeConfig) -> list[str]:
    """How a translation was searched, as eval files name it: `greedy` or `beam<K>`, then each setting that is
    not DecodeConfig's default (`lp<alpha>`, `min<N>`, `norepeat<N>`, `reppen<p>`), so that results of other
    settings sit side by side."""
    default = DecodeConfig()
    parts = ["greedy" if dc.beam == 1 else f"beam{dc.beam}"]
    if dc.beam > 1 and dc.len_penalty != default.len_penalty:
        parts.append(f"lp{dc.len_penalty:g}")
    if dc.min_len:
        parts.append(f"min{dc.min_len}")
    if dc.no_repeat_ngram:
        parts.append(f"norepeat{dc.no_repeat_ngram}")
    if dc.repetition_penalty != default.repetition_penalty:
        parts.append(f"reppen{dc.repetition_penalty:g}")
    return parts


def score_text(
    run: Run, text: Path, lines: list[str], stride: int, window: int = 0, first_tokens: int = 0
) -> dict[str, Any]:
    """Perplexity of a language model on the lines of `text` (`evaluate_lm_text`), in windows of
    `window` tokens (0: data.block_size, the length it trained on): non-overlapping blocks (stride 0)
    or sliding by `stride`. A longer window measures how the model extrapolates beyond its training
    length (learned positions stop at model.max_len: one line says so). `first_tokens` N > 0 scores the
    text's first N tokens only.

    SIGINT or SIGTERM stops it after the batch of windows under way: the result is then that of the tokens
    scored so far, `partial` naming the signal (what `first_tokens` of that count gives).

    Saved beside the run as `eval_<text file>_<checkpoint>_[w<window>_]<blocks|stride<S>>[_first<N>].json` (the
    window named when it is not data.block_size; N the tokens scored, when not all of them).

    Raises:
        TformerError: blank text, a negative window or `first_tokens`, or a stride outside 0..window.
    """
    if not any(line.strip() for line in lines):
        raise TformerError(f"{text}: no text to score (empty or blank lines only)")
    if window < 0:
        raise TformerError(f"--window {window}: must be >= 1, or 0 for data.block_size")
    if first_tokens < 0:
        raise TformerError(f"--first-tokens {first_tokens}: must be >= 1, or 0 for the whole text")
    trained = run.config.data.block_size
    window = window or trained
    if not 0 <= stride <= window:
        raise TformerError(f"--stride {stride}: must be in 1..{window} (the window), or 0 for blocks")
    result = evaluate_lm_text(run.model, run.tokenizer, lines, window, stride or window, first_tokens)
    result["precision"] = run.config.decode.precision
    setting = f"stride{stride}" if stride else "blocks"
    if window != trained:
        setting = f"w{window}_{setting}"
    part = [f"first{result['tokens']}"] if result["tokens"] < result["text_tokens"] else []
    name = eval_file(text.name, run.label, setting, *part, precision=result["precision"])
    _save_beside_run(run, name, result, inputs=(text,), scored=(str(text),))
    return result


def _save_beside_run(
    run: Run,
    name: str,
    result: dict,
    lines: list[str] | None = None,
    inputs: tuple[Path, ...] = (),
    scored: tuple[str, ...] = (),
) -> None:
    """`name`.json (and the output `lines` as `name`.hyp) in the run directory; nothing for a standalone
    checkpoint (there is no run to write beside). Neither may be one of the command's `inputs`.

    `scored`: the files the result is of (as given), recorded in the json (absolute) as "scored"; replacing a
    result of other files says so on stderr, with the option that keeps both where there is one."""
    if run.run_dir is None:
        return
    for suffix in (".json", ".hyp"):
        refuse_inputs(run.run_dir / f"{name}{suffix}", inputs, "the eval result")
    if scored:
        result["scored"] = [str(Path(given).resolve()) if Path(given).is_file() else given for given in scored]
        _say_when_replacing_other_files(run.run_dir / f"{name}.json", result["scored"])
    write_json(run.run_dir / f"{name}.json", result)
    if lines is not None:
        write_text(run.run_dir / f"{name}.hyp", "".join(line + "\n" for line in lines))


def _say_when_replacing_other_files(path: Path, scored: list[str]) -> None:
    """A warning on stderr where `path` holds the result of files other than `scored` (what the next write
    replaces); nothing where it is new, of the same files, or unreadable (then it is replaced as it was)."""
    import json
    import sys

    try:
        before = json.loads(path.read_text(encoding="utf-8")).get("scored")
    except (OSError, ValueError, AttributeError):
        return
    if before is not None and before != scored:
        keep = "; give --test-set NAME to keep both" if path.name.startswith("eval_unnamed_") else ""
        print(f"warning: replacing {path}, the result of other files ({', '.join(before)}){keep}", file=sys.stderr)


# Test sets whose size we know: BLEU on the full and the filtered newstest2014 differ, so say which.
KNOWN_TEST_SETS = {"newstest2014-full": 3003, "newstest2014-filtered": 2737, "newstest2013": 3000}


def same_line_counts(first: int, second: int, names: tuple[str, str], why: str) -> None:
    """Raise a DataError naming both inputs and their line counts where they differ."""
    if first != second:
        raise DataError(f"{names[0]} has {first:,} lines and {names[1]} {second:,}: {why}")


def evaluate_translation(
    hypotheses: list[str],
    references: list[str],
    test_set: str,
    names: tuple[str, str] = ("the hypotheses", "the references"),
) -> dict[str, Any]:
    """sacreBLEU BLEU, chrF and TER of detokenized hypotheses against raw references (same line count), each
    with its signature; `names`: what the two are called in an error (their files' names)."""
    from tformer_cli.metrics import bleu_chrf, looks_tokenized, ter

    same_line_counts(len(hypotheses), len(references), names, "each hypothesis needs its reference on the same line")
    if not references:
        raise DataError("the reference has no lines: nothing to score")
    expected = KNOWN_TEST_SETS.get(test_set)
    if expected is not None and len(references) != expected:
        raise DataError(
            f"--test-set {test_set} has {expected} lines, the reference has {len(references)}: "
            f"{'the filtered set is newstest2014-filtered' if len(references) == 2737 else 'wrong file?'}"
        )
    result: dict[str, Any] = {
        "test_set": test_set,
        "lines": len(references),
        **bleu_chrf(hypotheses, references),
        **ter(hypotheses, references),
    }
    result["reference_looks_tokenized"] = looks_tokenized(references)
    return result


def evaluate_lm_text(
    model, tokenizer, lines: list[str], window: int, stride: int, first_tokens: int = 0, batch: int = 8
) -> dict[str, Any]:
    """Perplexity per token and per word, and bits per byte, of raw text lines (each ends with EOS), over the
    first `first_tokens` tokens (0: all), `batch` windows at a time, with progress on stderr; stopped by SIGINT
    or SIGTERM, over the tokens scored until then (`partial`: the signal's name; None when all were scored).

    Returns:
        tokens (scored), text_tokens (in the text), words and bytes (of the scored text), window, stride, nll,
        ppl_token, ppl_word, bits_per_byte, partial.
    """
    from tformer_cli.log import LineProgress
    from tformer_cli.metrics import Perplexity, stream_nll
    from tformer_cli.tokenizer import EOS_ID

    rows = tokenizer.encode(lines)
    ids = [EOS_ID]  # the stream starts after an end-of-line, so the first token is scored too
    for row in rows:
        ids += row + [EOS_ID]
    text_tokens = len(ids) - 1
    wanted = min(first_tokens, text_tokens) if first_tokens else text_tokens
    with StopSignals() as stop, LineProgress("scored", wanted, unit="tokens") as progress:
        nll, scored = stream_nll(
            model, torch.tensor(ids[: wanted + 1]), window, stride, batch, progress.advance, stop=stop.asked
        )
    words, n_bytes = prefix_words_and_bytes(tokenizer, lines, rows, scored)
    ppl = Perplexity(nll, scored, words, n_bytes)
    return {
        "tokens": scored,
        "text_tokens": text_tokens,
        "words": words,
        "bytes": n_bytes,
        "window": window,
        "stride": stride,
        "nll": nll,
        "ppl_token": ppl.per_token,
        "ppl_word": ppl.per_word,
        "bits_per_byte": ppl.bits_per_byte,
        "partial": stop.signal,
    }


def prefix_words_and_bytes(tokenizer, lines: list[str], rows: list[list[int]], tokens: int) -> tuple[int, int]:
    """Words and UTF-8 bytes (`count_words_and_bytes`'s conventions) of the text the first `tokens` predictions
    cover: whole lines (each with its end of line), then the decoded pieces of a line cut short."""
    from tformer_cli.metrics import count_words_and_bytes

    whole = 0
    left = tokens
    while whole < len(rows) and left >= len(rows[whole]) + 1:
        left -= len(rows[whole]) + 1
        whole += 1
    words, n_bytes = count_words_and_bytes(lines[:whole])
    if left and whole < len(rows):
        piece = tokenizer.decode(rows[whole][:left])
        words, n_bytes = words + len(piece.split()), n_bytes + len(piece.encode("utf-8"))
    return words, n_bytes


def bleu_report(result: dict[str, Any], references: Path) -> Report:
    """The lines of `evaluate_translation`'s result: the test set, sacreBLEU's text, each metric with its signature;
    a note when the reference looks tokenized."""
    notes = []
    if result["reference_looks_tokenized"]:
        notes.append(
            f"warning: {references} looks tokenized (Moses escapes or split punctuation); BLEU against a "
            "tokenized reference is not comparable to published sacreBLEU"
        )
    lines = [
        f"test set: {result['test_set']} ({result['lines']} lines)",
        result["bleu_text"],
        f"BLEU {result['bleu']:.2f}  signature: {result['bleu_signature']}",
        f"chrF {result['chrf']:.2f}  signature: {result['chrf_signature']}",
        f"TER {result['ter']:.2f}  signature: {result['ter_signature']}",
    ]
    return Report(lines, notes)


def perplexity_report(result: dict[str, Any], text: Path, stride: int) -> Report:
    """The lines of `score_text`'s result for the `stride` asked for (0: blocks): what was scored and how, then the
    perplexities; a note when a signal stopped it (the result is then partial)."""
    window, precision = result["window"], result["precision"]
    mode = f"sliding window {window}, stride {stride}" if stride else f"blocks of {window}"
    mode += f", {precision} weights" if precision != "fp32" else ""
    scored = f"{result['tokens']:,} tokens"
    if result["tokens"] < result["text_tokens"]:
        scored = f"the first {result['tokens']:,} of {result['text_tokens']:,} tokens"
    notes = []
    if result["partial"] is not None:
        notes.append(f"stopped by {result['partial']}: the result below is partial, over {scored}")
        scored = f"partial ({result['partial']}): {scored}"
    lines = [
        f"{text}: {scored}, {result['words']:,} words ({mode})",
        f"perplexity per token {result['ppl_token']:.2f}  per word {result['ppl_word']:.2f}  "
        f"bits per byte {result['bits_per_byte']:.4f}",
    ]
    return Report(lines, notes)


def validation_report(result: dict[str, Any]) -> Report:
    """The lines of `evaluate_checkpoint`'s result: the checkpoint, then the metrics (a classifier's with its
    confusion matrix, sessions' by rule beside the Bayes-optimal)."""
    head = f"checkpoint: {result['checkpoint']}"
    if "bayes_accuracy" in result:
        return Report([head, *_sessions_lines(result)])
    if "confusion" not in result:
        return Report([head, "validation " + "  ".join(f"{k}: {result[k]:.4f}" for k in ("loss", "ppl", "accuracy"))])
    from rich.table import Table

    table = Table(title="confusion matrix (rows: true class, columns: predicted)")
    table.add_column("")
    for j in range(len(result["confusion"])):
        table.add_column(str(j), justify="right")
    for i, row in enumerate(result["confusion"]):
        table.add_row(str(i), *(str(c) for c in row))
    summary = f"validation accuracy: {result['accuracy']:.4f}  loss: {result['loss']:.4f}  ({result['n']} examples)"
    return Report([head, table, summary])


_RULE_ROWS = {"": "all", "_local": "local (+1)", "_long": "long-range", "_random": "random"}


def _sessions_lines(result: dict[str, Any]) -> list[str]:
    """Sessions: loss, then accuracy, Hit@10 and MRR per rule, each beside the Bayes-optimal number."""
    lines = [
        f"{result['split']}: {result['sessions']:,} sessions, {result['n']:,} targets  "
        f"loss: {result['loss']:.4f} ({result['bayes_loss']:.4f})  ppl: {result['ppl']:.4f}",
        "next-item prediction: model (Bayes-optimal: the best any predictor can do on these sessions)",
        f"{'targets':<12}{'n':>8}  {'accuracy':<17}  {'Hit@10':<17}  MRR",
    ]
    for suffix, name in _RULE_ROWS.items():
        cells = [f"{result[m + suffix]:.4f} ({result[f'bayes_{m}{suffix}']:.4f})" for m in ("accuracy", "hit10", "mrr")]
        lines.append(f"{name:<12}{result['n' + suffix]:>8,}  " + "  ".join(f"{cell:<17}" for cell in cells).rstrip())
    return lines


class StopSignals:
    """SIGINT and SIGTERM asked to stop (`asked()`) instead of ending the process, while in the block (in the main
    thread; elsewhere nothing changes). `signal`: the name of the first one received, None if none came."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self.before: dict[int, Any] = {}

    def asked(self) -> bool:
        return self.signal is not None

    def _handle(self, signum: int, _frame: Any) -> None:
        self.signal = self.signal or signal.Signals(signum).name

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.before[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.before.items():
            signal.signal(signum, handler)
