"""`tformer bleu`: sacreBLEU's BLEU, chrF and TER of a hypothesis file against a reference file; no model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tformer_cli.commands.options import TestSet, show


def bleu(
    hyp: Annotated[Path, typer.Argument(help="Detokenized translations, one line each.")],
    ref: Annotated[Path, typer.Option(help="Raw (detokenized) reference, one line for each line of HYP.")],
    test_set: TestSet = "unnamed",
) -> None:
    """Score a translation file against its reference: sacreBLEU's BLEU, chrF and TER, each with its signature.

    Reads HYP and --ref (UTF-8, the same number of lines; a known --test-set must have its size); writes nothing.
    Prints the test set, sacreBLEU's BLEU line and each metric with its signature; on stderr a warning when the
    reference looks tokenized (Moses escapes or split punctuation). No model: to translate and score with a run,
    `tformer eval RUN --src SRC --ref REF`.
    """
    from tformer_cli import api
    from tformer_cli.evaluate import bleu_report

    show(bleu_report(api.evaluate_translations(hyp, ref, test_set), ref))
