"""Pictures: training curves from metrics.jsonl, and attention heatmaps. matplotlib, Agg backend."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

from tformer_cli.errors import TformerError
from tformer_cli.files import atomic_open

if TYPE_CHECKING:
    import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# the validation panel: the first of these that validation measured; shown by these names
HEADLINE = (("bleu",), ("mrr", "hit10"), ("ppl",), ("accuracy",))
NAMES = {"bleu": "BLEU", "mrr": "MRR", "hit10": "Hit@10", "ppl": "perplexity per token", "accuracy": "accuracy"}
LOWER_IS_BETTER = ("ppl",)


def headline_metrics(valid: list[dict]) -> tuple[str, ...]:
    """The validation metrics a run is judged by: BLEU for translation with validation BLEU, MRR and Hit@10 for
    next-item ranking, perplexity for a language model (or translation without BLEU), accuracy for a classifier."""
    measured = {key for record in valid for key in record}
    return next((keys for keys in HEADLINE if set(keys) <= measured), ("accuracy",))


def training_curves(metrics_path: Path, out: Path, marks: Sequence[tuple[int, str]] = ()) -> None:
    """Train and validation loss, learning rate, and the run's headline validation metric (headline_metrics)
    with its best value marked, against the update number; `marks` (update, label): a dotted line on every panel
    after that update (a resume, a recipe change), labelled on the loss panel."""
    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    train = [r for r in records if r["split"] == "train"]
    valid = [r for r in records if r["split"] == "valid"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot([r["step"] for r in train], [r["loss"] for r in train], label="train")
    axes[0].plot([r["step"] for r in valid], [r["loss"] for r in valid], "o-", label="valid")
    axes[0].set(title="loss", xlabel="update")
    if all(r["loss"] > 0 for r in train + valid):
        axes[0].set_yscale("log")  # a loss near 0 (a classifier that has learnt) still shows its course
    axes[0].legend()
    axes[1].plot([r["step"] for r in train], [r["lr"] for r in train])
    axes[1].set(title="learning rate", xlabel="update")
    _headline_panel(axes[2], valid)
    for step, label in marks:
        for ax in axes:
            ax.axvline(step, color="grey", linestyle=":", linewidth=1)
        axes[0].annotate(
            label,
            (step, 1),
            xycoords=("data", "axes fraction"),
            rotation=90,
            fontsize=7,
            va="top",
            ha="right",
            color="grey",
        )
    fig.tight_layout()
    _save(fig, out, dpi=110)


def _headline_panel(ax, valid: list[dict]) -> None:
    """The headline validation metrics against the update number, each one's best value starred."""
    keys = headline_metrics(valid)
    titles = []
    for key in keys:
        points = [(r["step"], r[key]) for r in valid if key in r]
        if not points:
            continue
        ax.plot(*zip(*points, strict=True), "o-", label=NAMES[key])
        pick = min if key in LOWER_IS_BETTER else max
        step, best = pick(points, key=lambda point: point[1])
        ax.plot([step], [best], "*", markersize=12, color="gold", markeredgecolor="black")
        titles.append(f"{NAMES[key]} (best {best:.4g} at update {step})")
    if "ppl" in keys and ax.has_data():
        ax.set_yscale("log")  # perplexity falls by orders of magnitude early on
    if len(keys) > 1 and ax.has_data():
        ax.legend()
    ax.set_title("validation " + ("\n".join(titles) or NAMES[keys[0]]), fontsize=9)
    ax.set_xlabel("update")


def sweep_curves(runs: list[tuple[str, list[dict]]], out: Path, title: str = "") -> None:
    """Every run's training loss and validation loss against the update number, one line per run.

    runs: [(label, the run's metrics.jsonl records)]; a run without records of a split has no line there.
    """
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    for label, records in runs:
        for ax, split, style in ((axes[0], "train", "-"), (axes[1], "valid", "o-")):
            points = [(r["step"], r["loss"]) for r in records if r.get("split") == split and "loss" in r]
            if points:
                ax.plot(*zip(*points, strict=True), style, label=label, markersize=3)
    axes[0].set(title="training loss", xlabel="update")
    axes[1].set(title="validation loss", xlabel="update")
    for ax in axes:
        if ax.has_data():
            ax.legend(fontsize=7)
    if title:  # a sweep's command: wrapped, not cut at the figure's edge
        fig.suptitle("\n".join(textwrap.wrap(title, 170)), fontsize=9)
    fig.tight_layout()
    _save(fig, out, dpi=110)


def attention_heatmaps(
    maps: list[tuple[str, np.ndarray]],
    row_labels: list[str],
    col_labels_by_map: list[list[str]],
    out: Path,
    title: str = "",
) -> None:
    """One row of heads per attention module. maps: [(name, weights (H, T_q, T_k))]."""
    n_rows = len(maps)
    n_heads = max(w.shape[0] for _, w in maps)
    size = max(2.2, min(4.0, 0.09 * len(row_labels)))
    fig, axes = plt.subplots(n_rows, n_heads, figsize=(size * n_heads, size * n_rows), squeeze=False)
    for r, ((name, weights), col_labels) in enumerate(zip(maps, col_labels_by_map, strict=True)):
        for h in range(n_heads):
            ax = axes[r][h]
            ax.imshow(weights[h], cmap="viridis", vmin=0.0, aspect="auto")
            ax.set_title(f"{name} head {h}", fontsize=8)
            step = max(1, len(col_labels) // 32)
            ax.set_xticks(range(0, len(col_labels), step), col_labels[::step], rotation=90, fontsize=5)
            ax.set_yticks(range(0, len(row_labels), step), row_labels[::step], fontsize=5)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _save(fig, out, dpi=120)


def _save(fig, out: Path, dpi: int) -> None:
    """Write the figure atomically in the format its file name says (.png, .pdf, .svg, ...); close it."""
    try:
        kind = out.suffix.lstrip(".").lower() or "png"
        if kind not in fig.canvas.get_supported_filetypes():
            formats = ", ".join(sorted(fig.canvas.get_supported_filetypes()))
            raise TformerError(f"{out}: matplotlib cannot write .{kind} files (it writes {formats})")
        with atomic_open(out, "wb") as handle:
            fig.savefig(handle, format=kind, dpi=dpi)
    finally:
        plt.close(fig)
