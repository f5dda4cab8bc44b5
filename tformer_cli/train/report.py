"""What validation leaves beside the checkpoints: the translations it scored (kept, two shown) and curves.png."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.markup import escape

from tformer_cli.files import write_text
from tformer_cli.log import TrainLog, console
from tformer_cli.run.layout import CURVES, METRICS
from tformer_cli.validation import Translations

SAMPLES = 2  # translations shown at each validation, as fairseq's --eval-bleu-print-samples shows some
FIRST_COST = 0.5  # seconds: about what curves.png costs, until this run has drawn one


def valid_hyp_file(step: int) -> str:
    """The file of the translations validation scored at update `step` (zero-padded as step files are)."""
    return f"valid_{step:08d}.hyp"


def keep_translations(translations: Translations, run_dir: Path, step: int, log: TrainLog) -> Path:
    """Write the hypotheses to `run_dir`/valid_<step>.hyp, one line per validation line scored, and show the first
    SAMPLES with their source and reference (the same lines each time, so that their progress shows).

    Returns:
        The file written.
    """
    path = run_dir / valid_hyp_file(step)
    write_text(path, "".join(line + "\n" for line in translations.hypotheses))
    for i in range(min(SAMPLES, len(translations.hypotheses))):
        log.say(
            f"  sample {i + 1}  source:     {escape(translations.sources[i])}\n"
            f"            reference:  {escape(translations.references[i])}\n"
            f"            hypothesis: {escape(translations.hypotheses[i])}"
        )
    log.say(f"  all {len(translations.hypotheses)} scored translations: {path}")
    return path


def curve_marks(resumes: list[int], changes: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """Where curves.png marks the run's history: (update, label) for each resume (after that update) and each
    recipe change (from its first update: resume.recipe_changes' records), one label per update."""
    labels: dict[int, list[str]] = {}
    for step in resumes:
        labels.setdefault(step, []).append("resumed")
    for change in changes:
        labels.setdefault(change["update"] - 1, []).append(f"{change['key']}={change['to']}")
    return [(step, ", ".join(dict.fromkeys(names))) for step, names in sorted(labels.items())]


class Curves:
    """A run's curves.png, redrawn from its metrics.jsonl at validations, so that an interrupted run has one."""

    def __init__(self, run_dir: Path, enabled: bool, marks: list[tuple[int, str]] | None = None) -> None:
        """`enabled` False: a process other than the main one, which draws nothing. `marks`: curve_marks."""
        self.run_dir, self.enabled, self.marks = run_dir, enabled, marks or []
        # when the picture was last drawn (at first: the run's start), and the seconds that took (at first: about
        # what a picture costs): a run of a few seconds draws once, at its end
        self.drawn_at, self.cost = time.time(), FIRST_COST
        self.drawn_from: tuple[int, int] | None = None  # metrics.jsonl's (size, mtime) when it was drawn

    def draw(self, final: bool) -> None:
        """Redraw, unless the last picture (or the run's start) is younger than 20 times what drawing it took (a tiny
        run validates every few updates, and a picture costs about half a second); always when `final` (the run's
        end, a stop), unless this process drew it from metrics.jsonl as it is now (a run whose last validation was
        its last update)."""
        if not self.enabled or not (self.run_dir / METRICS).is_file():
            return
        stat = (self.run_dir / METRICS).stat()
        if final and self.drawn_from == (stat.st_size, stat.st_mtime_ns) and (self.run_dir / CURVES).is_file():
            return
        if not final and time.time() - self.drawn_at < 20 * self.cost:
            return
        start = time.time()
        try:
            from tformer_cli.plots import training_curves

            training_curves(self.run_dir / METRICS, self.run_dir / CURVES, self.marks)
        except ImportError:  # matplotlib is a dependency, but a broken install must not fail a run
            console.print("[yellow]warning:[/] matplotlib unavailable; no curves.png")
        self.drawn_at, self.cost, self.drawn_from = time.time(), time.time() - start, (stat.st_size, stat.st_mtime_ns)
