"""Pictures: training curves from metrics.jsonl, and attention heatmaps. matplotlib, Agg backend."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def training_curves(metrics_path: Path, out: Path) -> None:
    """Train and validation loss, learning rate, and validation accuracy against the update number."""
    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    train = [r for r in records if r["split"] == "train"]
    valid = [r for r in records if r["split"] == "valid"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot([r["step"] for r in train], [r["loss"] for r in train], label="train")
    axes[0].plot([r["step"] for r in valid], [r["loss"] for r in valid], "o-", label="valid")
    axes[0].set(title="loss", xlabel="update")
    axes[0].legend()
    axes[1].plot([r["step"] for r in train], [r["lr"] for r in train])
    axes[1].set(title="learning rate", xlabel="update")
    axes[2].plot([r["step"] for r in valid], [r["accuracy"] for r in valid], "o-")
    axes[2].set(title="validation accuracy", xlabel="update")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
