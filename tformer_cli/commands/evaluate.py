"""`tformer eval`: a trained run evaluated, on its own data's split or on given source and reference files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tformer_cli.commands.options import Average, Checkpoint, EnsembleOf, RunOverrides, Split, TestSet, show
from tformer_cli.errors import TformerError


def eval_(
    path: Checkpoint,
    overrides: RunOverrides = None,
    split: Annotated[
        Split, typer.Option(help="The run's own split to score (test: generated sessions only); not with --src.")
    ] = Split.valid,
    src: Annotated[Path | None, typer.Option(help="Source file to translate and score (with --ref).")] = None,
    ref: Annotated[Path | None, typer.Option(help="Raw (detokenized) reference of --src, one line each.")] = None,
    test_set: TestSet = "unnamed",
    average: Average = 0,
    ensemble: EnsembleOf = None,
) -> None:
    """Evaluate a run: its own data's split, or --src translated and scored against --ref.

    Without --src/--ref: the run's validation (or --split test) split scored as training scored it, with the
    weights as trained (decode.* overrides are refused): loss, perplexity and accuracy (BLEU for translation);
    a classifier's accuracy and confusion matrix; sessions' accuracy, Hit@10 and MRR by rule beside the
    Bayes-optimal. Reads the run and its prepared data (data.dir); in a run folder writes
    eval_<split>_<checkpoint>.json beside it.

    With --src and --ref (a translation run): --src translated with the run's decode settings (decode.* overrides;
    --ensemble: with more runs as one model) and scored with sacreBLEU's BLEU, chrF and TER, each with its
    signature. In a run folder writes eval_<test set>_<checkpoint>_<search>.json and .hyp beside it.

    Prints the checkpoint and the metrics (translation: the test set, then each metric with its signature).
    Scoring a hypothesis file without a model is `tformer bleu`; a text's perplexity is `tformer perplexity`.
    """
    from tformer_cli import api
    from tformer_cli.evaluate import bleu_report, validation_report

    if src is None and ref is None:  # the run's own split
        model = api.load(path, average=average, ensemble=ensemble or (), as_trained=True, overrides=overrides or ())
        return show(validation_report(model.validate(split.value)))
    if src is None or ref is None or split is not Split.valid:
        raise TformerError("--src and --ref go together, and score given files instead of the run's --split")
    model = api.load(path, average=average, ensemble=ensemble or (), overrides=overrides or (), command="eval --src")
    show(bleu_report(model.evaluate(src, ref, test_set=test_set), ref))
