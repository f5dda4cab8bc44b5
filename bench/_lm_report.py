"""bench/lm_race.py's numbers and how they are written: the results (JSON), the tables (markdown) and the plot."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CLOCKS = (
    "Clocks: a tformer run counts its set-up and its validations in train.max_minutes, once per mark (each mark "
    "resumes the run); the GPT-2 loop counts its updates only, batch assembly included. Scoring at a mark is outside "
    "both."
)
NAMES = {
    "tformer": "tformer Transformer",
    "lstm": "tformer LSTM",
    "gpt2": "HF GPT-2 architecture",
}


@dataclass
class Mark:
    """A system's checkpoint when its training clock passed `minutes`, and its scores."""

    minutes: float
    seconds: float  # training time when it was taken
    updates: int
    checkpoint: str
    valid_ppl_word: float
    valid_ppl_token: float
    valid_words: int
    test_ppl_word: float | None = None  # None: a sweep's run, scored on validation only
    test_ppl_token: float | None = None
    test_words: int | None = None
    eval_s: float = 0.0  # wall time of scoring (not training time)

    def line(self) -> str:
        test = f", test {self.test_ppl_word:.1f}" if self.test_ppl_word is not None else ""
        return f"{self.updates} updates, perplexity per word: valid {self.valid_ppl_word:.1f}{test}"


@dataclass
class SystemResult:
    name: str  # tformer, lstm, gpt2
    lr: float | None = None
    settings: str = ""
    parameters: int = 0
    tokens_per_s: float = 0.0  # median training tokens/s of its logging windows
    marks: list[Mark] = field(default_factory=list)
    error: str | None = None

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SystemResult:
        return cls(**{**raw, "marks": [Mark(**m) for m in raw["marks"]]})


@dataclass
class SweepRow:
    """One learning rate of a sweep: the system at the race's shortest mark, scored on validation."""

    system: str
    lr: float | None
    minutes: float
    mark: Mark | None
    error: str | None = None


@dataclass
class Report:
    machine: str
    command: str
    test: str  # the test file and its words
    valid: str
    minutes: list[float]
    threads: int
    systems: list[SystemResult] = field(default_factory=list)
    sweep: list[SweepRow] = field(default_factory=list)
    markdown: str = ""

    @classmethod
    def empty(cls) -> Report:
        return cls("", "", "", "", [], 0)


def best_rate(rows: list[SweepRow]) -> float:
    """The learning rate of the row with the lowest validation perplexity per word."""
    scored = [row for row in rows if row.mark is not None and row.lr is not None]
    if not scored:
        raise ValueError("no sweep row has a score")
    best = min(scored, key=lambda row: row.mark.valid_ppl_word)  # type: ignore[union-attr]
    return best.lr  # type: ignore[return-value]


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def markdown(report: Report) -> str:
    """The race's table (test perplexity per word at each mark), its per-mark detail, and the sweep's table."""
    marks = report.minutes
    lines = [
        f"Test: {report.test}; validation: {report.valid}. Perplexity per word (line.split() + <eos> per line) and "
        "per token, non-overlapping blocks of data.block_size tokens, fp32, all three by tformer's evaluate_lm_text.",
        "",
        f"Machine: {report.machine}. Each system in a process of its own at the same time, {report.threads} "
        f"thread{'s' * (report.threads != 1)} each. Command: `{report.command}`",
        "",
        "| system | lr | parameters | " + " | ".join(f"test ppl/word at {m:g} min" for m in marks)
        + f" | updates at {' / '.join(f'{m:g}' for m in marks)} min | tokens/s | settings |",
        "|---|---:|---:|" + "---:|" * len(marks) + "---:|---:|---|",
    ]  # fmt: skip
    for system in report.systems:
        name = NAMES.get(system.name, system.name)
        if system.error:
            lines.append(f"| {name} | {system.lr or 0:g} | failed: {system.error} |" + " |" * (len(marks) + 3))
            continue
        at = {m.minutes: m for m in system.marks}
        cells = [_cell(at[m].test_ppl_word) if m in at else "n/a" for m in marks]
        updates = " / ".join(f"{at[m].updates:,}" if m in at else "n/a" for m in marks)
        lines.append(
            f"| {name} | {system.lr or 0:g} | {system.parameters / 1e6:.2f}M | {' | '.join(cells)} | {updates} "
            f"| {system.tokens_per_s:,.0f} | {system.settings} |"
        )
    lines += ["", "| system | minutes | training s | updates | test ppl/word | test ppl/token | valid ppl/word |",
              "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for system in report.systems:
        for m in system.marks:
            lines.append(
                f"| {NAMES.get(system.name, system.name)} | {m.minutes:g} | {m.seconds:.0f} | {m.updates:,} "
                f"| {_cell(m.test_ppl_word)} | {_cell(m.test_ppl_token)} | {_cell(m.valid_ppl_word)} |"
            )
    if report.sweep:
        lines += ["", *sweep_table(report.sweep)]
    lines += ["", CLOCKS]
    return "\n".join(lines) + "\n"


def sweep_table(rows: list[SweepRow]) -> list[str]:
    """The sweep's rows, the chosen rate of each system marked."""
    out = ["Learning-rate sweep: the race stopped at its shortest mark, the lowest validation perplexity chosen.", "",
           "| system | lr | minutes | updates | valid ppl/word | chosen |", "|---|---:|---:|---:|---:|---|"]  # fmt: skip
    chosen = {}
    for system in dict.fromkeys(row.system for row in rows):
        try:
            chosen[system] = best_rate([row for row in rows if row.system == system])
        except ValueError:
            pass
    for row in rows:
        name = NAMES.get(row.system, row.system)
        if row.mark is None:
            out.append(f"| {name} | {row.lr or 0:g} | {row.minutes:g} | n/a | failed: {row.error} | |")
            continue
        mark = "yes" if chosen.get(row.system) == row.lr else ""
        out.append(f"| {name} | {row.lr:g} | {row.minutes:g} | {row.mark.updates:,} | {row.mark.valid_ppl_word:.1f} "
                   f"| {mark} |")  # fmt: skip
    return out


def plot(report: Report, path: Path) -> None:
    """Test perplexity per word against training minutes, a line per system (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for system in report.systems:
        points = [(m.minutes, m.test_ppl_word) for m in system.marks if m.test_ppl_word is not None]
        if points:
            ax.plot(*zip(*points, strict=True), "o-", label=NAMES.get(system.name, system.name))
    ax.set(xlabel="training minutes", ylabel="test perplexity per word", yscale="log", xlim=(0, None))
    ax.set_xticks(report.minutes)
    ax.grid(alpha=0.3, which="both")
    if ax.lines:  # a report of the sweep alone has no race to draw yet
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(report: Report, out: Path) -> None:
    """The markdown into `out`, the JSON and the plot beside it (FILE.json, FILE.png)."""
    report.markdown = markdown(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    png = out.with_suffix(".png")
    plot(report, png)
    out.with_suffix(".json").write_text(json.dumps(asdict(report), indent=1) + "\n")
    out.write_text(f"![Test perplexity per word against training minutes]({png.name})\n\n" + report.markdown)
