"""Time to BLEU: tformer's translation recipe and Hugging Face's MarianMTModel trained from scratch on this machine,
on the same data, with the same tokenizer and a model of the same size, for the same wall-clock budget, one after
the other; the test set's sacreBLEU at each minute mark.

    python bench/time_to_bleu.py --out docs/time_to_bleu.md --tformer-average 0 5    # multi30k_en_de, 15 / 30 / 60 min
    python bench/time_to_bleu.py data.dir=/tmp/m30k --minutes 1 2     # a short look; key=value: recipe overrides
    python bench/time_to_bleu.py --recipe recipes/wmt14_small.yaml data.train=... data.valid=... data.test=...
    python bench/time_to_bleu.py --smoke                              # made-up data, tiny models, seconds
    python bench/time_to_bleu.py --threads 1 --side-by-side           # each system on a core of its own, at once
    python bench/time_to_bleu.py --threads 1 --side-by-side --sweep-lr tformer 1e-3 2e-3 3e-3 --sweep-lr marian 3e-4 1e-3 2e-3
    python bench/time_to_bleu.py --minutes 15 --budget 60 ...     # the first 15 minutes of the hour's race only

Per system, one training run of max(--minutes) of training time, evaluated as it passes each mark:
- tformer: `tformer prepare RECIPE` (skipped when data.dir is up to date), then `tformer train RECIPE` once per mark
  with train.max_minutes=MARK, each resuming the last (the run's clock counts its time before a resume, and a
  resumed run goes on as the straight one would); train.max_updates and train.warmup_steps scaled from the recipe's
  to the budget (the recipe's train.max_minutes), unless given as overrides. At each mark `tformer translate` of
  the latest checkpoint (--tformer-average N: of the last N averaged), decode.beam=4.
- HF MarianMTModel (bench/_peers.py: its settings and where they come from): the recipe's shape and vocabulary, the
  recipe's prepared arrays and batches, trained in a plain PyTorch loop with the precision tformer's run chose (bf16
  autocast or fp32), the same threads; at each mark (its clock stopped) `generate` with num_beams=4.
- OpenNMT-py is left out: see ONMT.
Both outputs are detokenized by the prepared data's SentencePiece model and scored against the raw reference by the
same sacreBLEU call, cased with 13a tokenization (the signature is printed) and lowercased.

--side-by-side: each system in a process of its own, at the same time, --threads each (one thread each on a 2-core
machine: each trains while the other core trains the other system, the same load for both, in half the time); their
rows in one table. Each process keeps its runs in WORK/<system>/.

--sweep-lr SYSTEM LR LR LR (repeatable; as many rates for each system swept): before the race, the race itself
stopped at its shortest mark once per round, round i training each system at its i-th rate (a system not swept at
its own: the recipe's train.lr, --peer-lr), side by side or not as the race, so each rate trains under the race's
load and schedule (scaled to its last mark); scored on the validation set (data.valid), not the test set. The
highest validation BLEU picks each swept system's rate for the race; the sweep's table goes above the race's.

Writes a markdown table (--out FILE, else printed), a plot of BLEU against minutes (FILE.png) and the raw numbers
(FILE.json), beside --out or in --work. Run folders and translations stay in --work (removed at the start).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).parent))
import _peers  # noqa: E402
from _report import cpu_model, threads  # noqa: E402

from tformer_cli.config import load_config  # noqa: E402
from tformer_cli.data.root import ENV as DATA_ROOT  # noqa: E402
from tformer_cli.data.text import read_lines  # noqa: E402
from tformer_cli.run.checkpoints import load_verified, read_index  # noqa: E402
from tformer_cli.run.layout import CHECKPOINTS, CONFIG, METRICS, STEP_PREFIX  # noqa: E402
from tformer_cli.schema import Config  # noqa: E402

ROOT = Path(__file__).parents[1]
RECIPE = ROOT / "recipes" / "multi30k_en_de.yaml"
BEAM = 4
ONMT = (
    "OpenNMT-py is not in the table: its latest release on PyPI (3.5.1) requires torch>=2.1,<2.3, so "
    "`pip install OpenNMT-py` replaces this torch with 2.2.2 (and its CUDA libraries, past a minute of download), "
    "and no release runs on the torch of this benchmark."
)
SMOKE_MINUTES = [0.03, 0.06]
SMOKE = (  # a tiny model on bench/_gpu_loop.py's made-up corpus; the time budget, not the updates, ends the runs
    "tokenizer.vocab_size=100",
    "model.d_model=32",
    "model.n_heads=2",
    "model.n_layers=1",
    "model.n_decoder_layers=1",
    "model.d_ff=64",
    "train.max_tokens=256",
    "train.update_freq=1",
    "train.epochs=100000",
    "train.max_updates=100000",
    "train.warmup_steps=10",
    "train.log_every=1",  # a loaded machine makes a few updates in a mark of seconds: each is logged, for the rate
    "train.valid_every=100000",
    "train.valid_bleu_lines=5",
    "train.compile=false",  # the recipe compiles: seconds of compiling in a mark of seconds would leave no update
)


@dataclass
class Mark:
    """A system's evaluation when its training clock passed `minutes`."""

    minutes: float
    seconds: float  # training time when evaluated
    updates: int
    bleu: float  # sacreBLEU, cased, 13a
    bleu_lc: float  # the same, lowercased
    hypotheses: str  # the translation file
    decode_s: float  # wall time of translating the test set
    averaged: int = 0  # tformer: checkpoints averaged (0: the latest alone)


@dataclass
class SystemResult:
    name: str
    settings: str
    parameters: int = 0
    tokens_per_s: float = 0.0  # median target tokens/s of its logging windows
    marks: list[Mark] = field(default_factory=list)
    error: str | None = None
    average: int = 0  # tformer: the checkpoints it asks to average


@dataclass
class SweepRow:
    """One system at one learning rate, the race stopped at its shortest mark, scored on the validation set."""

    system: str  # "tformer" or "marian"
    lr: float
    mark: Mark | None  # None: the run failed (error says why)
    error: str | None = None


@dataclass
class Report:
    machine: str
    command: str
    model: str  # the shape both systems share
    test: str  # its name and size
    test_path: str  # its files: PATH.<src_lang>, PATH.<tgt_lang>
    signatures: dict[str, str]  # cased, lowercased
    minutes: list[float]
    systems: list[SystemResult]
    notes: list[str]
    markdown: str = ""
    sweep: list[SweepRow] = field(default_factory=list)  # --sweep-lr's rows, the race's rates chosen from them
    sweep_set: str = ""  # the validation set they were scored on


def describe_machine(n_threads: int) -> str:
    """CPU model, its bf16 instructions, cores and threads, torch and transformers versions."""
    flags: set[str] = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    bf16 = [f for f in ("avx512_bf16", "amx_bf16", "amx_tile") if f in flags] or ["no avx512_bf16 or amx"]
    import transformers

    return (
        f"{cpu_model()} ({', '.join(bf16)}), {os.cpu_count()} cores, {len(os.sched_getaffinity(0))} usable here; "
        f"{threads(n_threads)} per system; torch {torch.__version__}, transformers {transformers.__version__}"
    )


def scaled_schedule(config: Config, overrides: list[str], budget_min: float) -> list[str]:
    """train.max_updates and train.warmup_steps scaled from the recipe's budget (train.max_minutes) to `budget_min`;
    an override of either is kept as given.

    Raises:
        SystemExit: the recipe has no train.max_updates and train.max_minutes to scale, and no override.
    """
    tc, given = config.train, {item.split("=", 1)[0] for item in overrides}
    out = []
    if "train.max_updates" not in given:
        if not (tc.max_updates and tc.max_minutes):
            raise SystemExit(
                "the recipe sets no train.max_updates and train.max_minutes to scale: give train.max_updates=N"
            )
        out.append(f"train.max_updates={max(1, round(tc.max_updates * budget_min / tc.max_minutes))}")
        if "train.warmup_steps" not in given:
            out.append(f"train.warmup_steps={round(tc.warmup_steps * budget_min / tc.max_minutes)}")
    return out


def test_files(config: Config, test: str | None, split: str = "test") -> tuple[Path, Path]:
    """The source and reference files of the set scored: --test PREFIX, else the recipe's data.test (data.valid
    for `split` "valid": a sweep's rounds)."""
    prefix = test or getattr(config.data, split)
    if not isinstance(prefix, str):
        raise SystemExit(
            f"data.{split} is {prefix!r}: give the {split} set's files as --{split} PREFIX (PREFIX.en, PREFIX.de)"
        )
    src, ref = (Path(f"{prefix}.{lang}") for lang in (config.data.src_lang, config.data.tgt_lang))
    for path in (src, ref):
        if not path.is_file():
            raise SystemExit(f"{path} not found")
    return src, ref


def bleu(hypotheses: list[str], references: list[str]) -> tuple[float, float, str, str]:
    """sacreBLEU cased (13a) and lowercased, and their signatures."""
    from sacrebleu.metrics import BLEU

    cased, lower = BLEU(), BLEU(lowercase=True)
    a, b = cased.corpus_score(hypotheses, [references]), lower.corpus_score(hypotheses, [references])
    return a.score, b.score, str(cased.get_signature()), str(lower.get_signature())


def resolved(setting: str, key: str) -> str:
    """A precision setting as tformer resolves it on this CPU (`auto`: bf16 where the CPU has bf16 instructions)."""
    if setting != "auto":
        return setting
    from tformer_cli.precision import resolve

    return resolve(setting, torch.device("cpu"), key)[0]


def run_cli(args: list[str], log: Path) -> None:
    """`tformer ARGS` in a fresh process, its output into `log`.

    Raises:
        RuntimeError: it failed; the message ends with its last line of output.
    """
    with log.open("w") as sink:
        done = subprocess.run([sys.executable, "-m", "tformer_cli", *args], stdout=sink, stderr=subprocess.STDOUT)
    if done.returncode:
        last = (log.read_text().strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"tformer {args[0]} exited {done.returncode}: {last} (log: {log})")


@dataclass(frozen=True)
class Bench:
    """What every system's run shares."""

    recipe: Path
    overrides: list[str]  # the user's (or the smoke's) recipe overrides
    config: Config  # the recipe with them and the scaled schedule
    minutes: list[float]
    work: Path
    threads: int
    test_src: Path
    references: list[str]
    signatures: dict[str, str] = field(default_factory=dict)

    def score(self, hyp: Path, minutes: float, seconds: float, updates: int, decode_s: float) -> Mark:
        score, score_lc, sig, sig_lc = bleu(list(read_lines(hyp)), self.references)
        self.signatures.update(cased=sig, lowercased=sig_lc)
        return Mark(minutes, seconds, updates, score, score_lc, shown(hyp), decode_s)


def shown(path: Path) -> str:
    """`path` as the report writes it: under the data root as `$TFORMER_DATA/...`, under the checkout relative to
    it, else whole (the report names no folder of the machine it ran on)."""
    path = path.resolve()
    roots = [(Path(os.environ[DATA_ROOT]).resolve(), f"${DATA_ROOT}")] if os.environ.get(DATA_ROOT) else []
    for root, name in [*roots, (ROOT.resolve(), "")]:
        if path.is_relative_to(root):
            rest = path.relative_to(root).as_posix()
            return f"{name}/{rest}" if name else rest
    return str(path)


def run_tformer(bench: Bench, schedule: list[str], averages: list[int]) -> list[SystemResult]:
    """`tformer train` up to each mark in turn; after each, `tformer translate` of the latest checkpoint (average 0)
    or of the average of the last N kept, for each N of `averages` (a row each)."""
    run_dir, tc = bench.work / "tformer", bench.config.train
    average = f"decoding the weights' moving average (train.ema_decay {tc.ema_decay:g}), " if tc.ema_decay else ""
    settings = (
        f"`tformer train {bench.recipe.name}`: {bench.config.model.norm_placement}-norm, {tc.optimizer} lr {tc.lr:g} "
        f"{tc.schedule} over {tc.max_updates:,} updates (warm-up {tc.warmup_steps:,}), label smoothing "
        f"{tc.label_smoothing}, clip norm {tc.clip_norm:g}, <= {tc.max_tokens:,} tokens x {tc.update_freq} per update, "
        f"{average}train.precision {resolved(tc.precision, 'train.precision')}; `tformer translate` beam {BEAM}, length "
        f"penalty {bench.config.decode.len_penalty} (GNMT)"
    )
    results = {
        n: SystemResult(f"tformer, last {n} checkpoints averaged" if n else "tformer", settings, average=n)
        for n in averages
    }
    common = [
        *bench.overrides,
        *schedule,
        f"run.out_dir={bench.work}",
        "run.name=tformer",
        f"run.threads={bench.threads}",
    ]
    for minutes in bench.minutes:
        run_cli(
            ["train", str(bench.recipe), *common, f"train.max_minutes={minutes:g}"],
            bench.work / f"tformer_train_{minutes:g}min.log",
        )
        for n, result in results.items():
            result.marks.append(translate_tformer(bench, run_dir, n, minutes))
            print(
                f"{result.name} at {minutes:g} min: {result.marks[-1].updates} updates, BLEU {result.marks[-1].bleu:.2f}"
            )
    rate = training_rate(run_dir / METRICS)
    parameters = tformer_parameters(bench.config)
    for result in results.values():
        result.tokens_per_s, result.parameters = rate, parameters
    return list(results.values())


def training_rate(metrics: Path) -> float:
    """The median target tokens/s of the training updates a run's metrics.jsonl logged.

    Raises:
        RuntimeError: no update was logged (the run made fewer than train.log_every).
    """
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rates = [r["tokens_per_s"] for r in records if r["split"] == "train"]
    if not rates:
        raise RuntimeError(f"{metrics}: no training update logged (fewer updates than train.log_every)")
    return statistics.median(rates)


def translate_tformer(bench: Bench, run_dir: Path, average: int, minutes: float) -> Mark:
    """`tformer translate` of the run's latest checkpoint (`average` 0), else of its last `average` step checkpoints
    averaged (fewer while fewer are kept: the mark says how many), and its score."""
    index = read_index(run_dir / CHECKPOINTS)
    latest = run_dir / CHECKPOINTS / index["latest"]
    position = load_verified(latest)["position"]
    averaged = min(average, sum(1 for name in index["files"] if name.startswith(STEP_PREFIX)))
    hyp = bench.work / f"tformer{f'_avg{average}' if average else ''}_{minutes:g}min.{bench.config.data.tgt_lang}"
    hyp.unlink(missing_ok=True)  # an earlier run's: translate -o refuses to replace what it did not write
    weights = [str(run_dir), "--average", str(averaged)] if averaged else [str(latest)]
    start = time.perf_counter()
    run_cli(["translate", *weights, "-i", str(bench.test_src), "-o", str(hyp), "run.device=cpu",
             f"decode.beam={BEAM}", f"run.threads={bench.threads}"], hyp.with_suffix(".log"))  # fmt: skip
    mark = bench.score(hyp, minutes, position["seconds"], position["step"], time.perf_counter() - start)
    mark.averaged = averaged
    return mark


def tformer_parameters(config: Config) -> int:
    from tformer_cli.data.prepared import PreparedData
    from tformer_cli.run import build_model_from_config

    model = build_model_from_config(config, PreparedData(config.data, config.tokenizer).vocab_size)
    return _peers.parameter_count(model)


def run_marian(bench: Bench, settings: _peers.PeerSettings, precision: str) -> SystemResult:
    """The peer trained in this process, translating at each mark with its clock stopped."""
    from tformer_cli.data.prepared import PreparedData
    from tformer_cli.tokenizer import Tokenizer

    data, dc, tc = PreparedData(bench.config.data, bench.config.tokenizer), bench.config.decode, bench.config.train
    tokenizer = Tokenizer(data.tokenizer_path)
    decode_precision = resolved(dc.precision, "decode.precision")
    result = SystemResult(
        "HF MarianMTModel",
        f"plain PyTorch loop: post-norm (Marian), {settings.describe()}; <= {tc.max_tokens:,} tokens x "
        f"{tc.update_freq} per update (tformer's batches), {'bf16 autocast' if precision != 'fp32' else 'fp32'}; "
        f"generate num_beams={BEAM}",
    )
    sources = list(read_lines(bench.test_src))

    def evaluate(mark: _peers.PeerMark) -> None:
        hyp = bench.work / f"marian_{mark.minutes:g}min.{bench.config.data.tgt_lang}"
        start = time.perf_counter()
        lines = _peers.translate(mark.model, tokenizer, sources, dc, BEAM, settings, decode_precision)
        hyp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        result.marks.append(bench.score(hyp, mark.minutes, mark.seconds, mark.updates, time.perf_counter() - start))
        print(
            f"{result.name} at {mark.minutes:g} min: {mark.updates} updates, BLEU {result.marks[-1].bleu:.2f}",
            flush=True,
        )

    torch.manual_seed(bench.config.run.seed)
    model = _peers.marian_model(bench.config, data.vocab_size)
    result.parameters = _peers.parameter_count(model)
    result.tokens_per_s = _peers.train(model, bench.config, settings, precision, bench.minutes, evaluate)
    return result


def markdown(report: Report) -> str:
    """The table, the machine and the settings it was measured with."""
    marks = " | ".join(f"BLEU at {m:g} min" for m in report.minutes)
    lines = [
        f"Test set: {report.test}, beam {BEAM}. BLEU: sacreBLEU cased (lowercased in brackets), "
        f"`{report.signatures.get('cased', '')}`; lowercased `{report.signatures.get('lowercased', '')}`.",
        "",
        f"Machine: {report.machine}.",
        "",
        f"Model of both: {report.model}. Command: `{report.command}`",
        "",
        f"| system | settings | parameters | {marks} | updates at {' / '.join(f'{m:g}' for m in report.minutes)} min | target tokens/s |",
        "|---|---|---:|" + "---:|" * len(report.minutes) + "---:|---:|",
    ]
    for system in report.systems:
        if system.error:
            lines.append(f"| {system.name} | failed: {system.error} |" + " |" * (len(report.minutes) + 3))
            continue
        by_minute = {m.minutes: m for m in system.marks}
        cells = [
            f"{by_minute[m].bleu:.2f} ({by_minute[m].bleu_lc:.2f})" if m in by_minute else "n/a" for m in report.minutes
        ]
        updates = " / ".join(f"{by_minute[m].updates:,}" if m in by_minute else "n/a" for m in report.minutes)
        lines.append(
            f"| {system.name} | {system.settings} | {system.parameters / 1e6:.2f}M | {' | '.join(cells)} | {updates} "
            f"| {system.tokens_per_s:,.0f} |"
        )
    lines += ["", *(f"- {note}" for note in report.notes + averaging_notes(report)), *sweep_table(report)]
    return "\n".join(lines) + "\n"


def sweep_table(report: Report) -> list[str]:
    """--sweep-lr's rows as a table (none without a sweep), the rate each system raced at in bold."""
    if not report.sweep:
        return []
    chosen, minutes = best_rates(report.sweep), min(report.minutes)
    lines = [
        "",
        f"Learning rates swept before the race (`--sweep-lr`): each rate trained as in the race (its load and "
        f"schedule) and stopped at its first mark, {minutes:g} minutes, then scored on {report.sweep_set}, the "
        "validation set (the test set is scored only in the race); the highest validation BLEU (bold) picked the "
        "rate raced.",
        "",
        f"| system | lr | validation BLEU at {minutes:g} min (lc) | updates |",
        "|---|---:|---:|---:|",
    ]
    for row in report.sweep:
        name = "tformer" if row.system == "tformer" else "HF MarianMTModel"
        if row.mark is None:
            lines.append(f"| {name} | {row.lr:g} | failed: {row.error} | |")
            continue
        score = f"{row.mark.bleu:.2f} ({row.mark.bleu_lc:.2f})"
        score = f"**{score}**" if chosen.get(row.system) == row.lr else score
        lines.append(f"| {name} | {row.lr:g} | {score} | {row.mark.updates:,} |")
    return lines


def averaging_notes(report: Report) -> list[str]:
    """Where a row averaged fewer checkpoints than it asks for (fewer were kept yet)."""
    notes = []
    for system in report.systems:
        fewer = [f"{m.averaged} at {m.minutes:g} min" for m in system.marks if m.averaged < system.average]
        if fewer:
            notes.append(f"{system.name}: fewer step checkpoints were kept yet, so fewer averaged: {', '.join(fewer)}.")
    return notes


def plot(report: Report, path: Path) -> None:
    """BLEU against minutes, a line per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for system in report.systems:
        if system.marks:
            ax.plot([m.minutes for m in system.marks], [m.bleu for m in system.marks], "o-", label=system.name)
    ax.set(xlabel="training minutes", ylabel="sacreBLEU (cased)", title=f"{report.test}, beam {BEAM}", xlim=(0, None))
    ax.set_xticks(report.minutes)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(report: Report, out: Path | None, work: Path, final: bool) -> None:
    """The markdown into `out` (else printed when `final`), the plot and the JSON beside it (else in `work`)."""
    report.markdown = markdown(report)
    base = out.with_suffix("") if out is not None else work / "time_to_bleu"
    base.parent.mkdir(parents=True, exist_ok=True)
    plot(report, base.with_suffix(".png"))
    base.with_suffix(".json").write_text(json.dumps(asdict(report), indent=1) + "\n")
    if out is not None:
        out.write_text(f"![BLEU against training minutes]({base.with_suffix('.png').name})\n\n" + report.markdown)
    if not final:
        return
    if out is not None:
        print(f"wrote {out}, {base.with_suffix('.png')}, {base.with_suffix('.json')}")
    else:
        print(report.markdown + f"\n(plot: {base.with_suffix('.png')}, numbers: {base.with_suffix('.json')})")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the recipe (both systems)")
    parser.add_argument("--recipe", type=Path, default=RECIPE)
    parser.add_argument(
        "--minutes", type=float, nargs="+", default=[15, 30, 60], help="the marks; the last is the budget"
    )
    parser.add_argument("--systems", nargs="+", choices=["tformer", "marian"], default=["tformer", "marian"])
    parser.add_argument("--test", help="the test set's files PREFIX.<src_lang>, PREFIX.<tgt_lang> (default: data.test)")
    parser.add_argument("--valid", help="the validation set a sweep scores, PREFIX as --test's (default: data.valid)")
    parser.add_argument("--work", type=Path, default=Path("runs/time_to_bleu"))
    parser.add_argument("--out", type=Path, help="the markdown file (the plot and JSON beside it)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument(
        "--tformer-average",
        type=int,
        nargs="+",
        default=[0],
        help="a tformer row per N: the latest checkpoint (0) or the last N averaged",
    )
    parser.add_argument("--peer-lr", type=float, default=_peers.MARIAN.lr)
    parser.add_argument("--sweep-lr", nargs="+", action="append", default=[], metavar="SYSTEM LR")
    parser.add_argument("--peer-warmup", type=int, help="default: the tformer recipe's train.warmup_steps (scaled)")
    parser.add_argument("--smoke", action="store_true", help="made-up data, a tiny model, marks in seconds")
    parser.add_argument(
        "--side-by-side", action="store_true", help="each system in a process of its own, at the same time"
    )
    parser.add_argument(
        "--no-prepare", action="store_true", help="data.dir is prepared already (--side-by-side's own processes)"
    )
    parser.add_argument(
        "--budget",
        type=float,
        help="the minutes the schedule is scaled to (default: the last mark): a race's first marks alone, trained on "
        "the whole race's schedule",
    )
    parser.add_argument("--score-on", choices=["test", "valid"], default="test", help=argparse.SUPPRESS)
    args = parser.parse_intermixed_args(argv)
    args.sweep_lr = dict(sweep_rates(values, args.systems) for values in args.sweep_lr)
    if len({len(rates) for rates in args.sweep_lr.values()}) > 1:
        raise SystemExit("--sweep-lr: give each system swept as many rates (round i trains each at its i-th)")
    return args


def sweep_rates(values: list[str], systems: Sequence[str], option: str = "--sweep-lr") -> tuple[str, list[float]]:
    """OPTION SYSTEM LR...: the system checked and its rates (bench/lm_race.py's --lr and --sweep-lr too).

    Raises:
        SystemExit: a system not raced, no rate, or a rate that is not a positive number (one line each).
    """
    system, *numbers = values
    if system not in systems:
        raise SystemExit(f"{option} {system}: the systems raced are {', '.join(systems)}")
    try:
        rates = [float(n) for n in numbers]
    except ValueError:
        raise SystemExit(f"{option} {' '.join(values)}: learning rates are numbers (overrides go first)") from None
    if not rates or any(not lr > 0 for lr in rates):
        raise SystemExit(f"{option} {system}: give one or more learning rates > 0 after the system")
    return system, rates


def child_args(args: argparse.Namespace, bench: Bench, system: str, work: Path) -> list[str]:
    """The command line of one system's own process under --side-by-side: the bench's settings (with --smoke, its
    made-up data's paths), that system alone, its report in `work`; the data as this process prepared it."""
    argv = [*bench.overrides, "--recipe", str(args.recipe), "--minutes", *(f"{m:g}" for m in bench.minutes)]
    argv += ["--systems", system, "--work", str(work), "--threads", str(args.threads), "--no-prepare"]
    argv += ["--tformer-average", *map(str, args.tformer_average), "--peer-lr", repr(args.peer_lr)]
    argv += ["--test", args.test] if args.test else []
    argv += ["--valid", args.valid] if args.valid else []
    argv += ["--budget", f"{args.budget:g}"] if args.budget else []
    argv += ["--score-on", args.score_on]
    return argv + (["--peer-warmup", str(args.peer_warmup)] if args.peer_warmup is not None else [])


def loaded(path: Path) -> tuple[list[SystemResult], dict[str, str]]:
    """The systems and the signatures of a report's JSON (a side-by-side process's)."""
    raw = json.loads(path.read_text())
    systems = [SystemResult(**{**s, "marks": [Mark(**m) for m in s["marks"]]}) for s in raw["systems"]]
    return systems, raw["signatures"]


def side_by_side(args: argparse.Namespace, bench: Bench, report: Report) -> None:
    """Each of args.systems trained and scored in a process of its own, all at once; their rows into `report`. A
    process that ends without its report is a failed row naming its log, the others' rows stand; stopped (Ctrl-C,
    an error here), this one stops the processes still running."""
    procs = []
    try:
        for name in args.systems:
            own = bench.work / name
            own.mkdir(parents=True, exist_ok=True)
            (own / "time_to_bleu.json").unlink(missing_ok=True)  # an earlier run's, not to be read as this one's
            print(f"{name}: in a process of its own, its output in {own / 'time_to_bleu.log'}", flush=True)
            cmd = [sys.executable, str(Path(__file__).resolve()), *child_args(args, bench, name, own)]
            with (own / "time_to_bleu.log").open("w") as log:
                procs.append((name, own, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)))
        for name, own, proc in procs:
            proc.wait()
            if not (own / "time_to_bleu.json").is_file():
                error = f"its process exited {proc.returncode} with no report (log: {shown(own / 'time_to_bleu.log')})"
                report.systems.append(SystemResult(name, "", error=error))
                continue
            systems, signatures = loaded(own / "time_to_bleu.json")
            report.systems += systems
            report.signatures.update(signatures)
    finally:
        for _, _, proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()


def setup(args: argparse.Namespace) -> tuple[Bench, list[str]]:
    """The work folder (emptied of earlier runs), the prepared data, the scaled schedule, the test set."""
    from tformer_cli.data.prepare import prepare

    work = args.work.resolve()
    shutil.rmtree(work / "tformer", ignore_errors=True)  # an earlier run: tformer train would resume it
    work.mkdir(parents=True, exist_ok=True)
    overrides = list(args.overrides)
    if args.smoke:
        from _gpu_loop import made_up_corpus

        corpus = made_up_corpus(work / "corpus")
        data = [
            f"data.train={corpus / 'train'}",
            f"data.valid={corpus / 'newstest2013'}",
            f"data.test={corpus / 'newstest2014'}",
        ]
        overrides = [*data, f"data.dir={work / 'data'}", *SMOKE, *overrides]
    schedule = scaled_schedule(load_config(args.recipe, overrides), overrides, args.budget or max(args.minutes))
    config = load_config(args.recipe, [*overrides, *schedule])
    if not args.no_prepare:  # several processes at once would each check it, one preparing while another reads
        prepare(config.data, config.tokenizer, log=lambda line: print(f"prepare: {line}", file=sys.stderr))
    src, ref = test_files(config, args.valid if args.score_on == "valid" else args.test, args.score_on)
    bench = Bench(args.recipe, overrides, config, sorted(args.minutes), work, args.threads, src, list(read_lines(ref)))
    return bench, schedule


def main(argv: list[str] | None = None) -> Report:
    args = parse(argv)
    if args.smoke and args.minutes == [15, 30, 60]:
        args.minutes = SMOKE_MINUTES
    torch.set_num_threads(args.threads)
    command = "python bench/time_to_bleu.py " + " ".join(argv if argv is not None else sys.argv[1:])
    rows, sweep_set = sweep(args) if args.sweep_lr else ([], "")
    for system, lr in best_rates(rows).items():
        if system == "tformer":
            args.overrides = [*args.overrides, f"train.lr={lr!r}"]
        else:
            args.peer_lr = lr
    return race(args, command, rows, sweep_set)


def sweep(args: argparse.Namespace) -> tuple[list[SweepRow], str]:
    """--sweep-lr's rounds: the race stopped at its shortest mark, round i training each system at its i-th rate
    (one not swept at its own), side by side or not as the race, scored on the validation set; the rows of the
    systems swept, and the set's name."""
    rows, name = [], ""
    for i in range(len(next(iter(args.sweep_lr.values())))):
        rates = {system: values[i] for system, values in args.sweep_lr.items()}
        round_args = argparse.Namespace(**vars(args))
        round_args.minutes, round_args.budget = [min(args.minutes)], args.budget or max(args.minutes)
        round_args.work, round_args.out, round_args.score_on = args.work / "sweep" / f"round{i + 1}", None, "valid"
        round_args.tformer_average, round_args.sweep_lr = [0], {}
        round_args.overrides = [*args.overrides, *([f"train.lr={rates['tformer']!r}"] if "tformer" in rates else [])]
        round_args.peer_lr = rates.get("marian", args.peer_lr)
        print(f"sweep, round {i + 1}: {', '.join(f'{s} lr {lr:g}' for s, lr in rates.items())}", flush=True)
        report = race(round_args, "", [], "")
        name = report.test
        for result in report.systems:
            system = "tformer" if result.name == "tformer" else "marian"
            if system in rates:
                mark = result.marks[0] if result.marks else None
                rows.append(SweepRow(system, rates[system], mark, result.error or (None if mark else "no mark")))
    return rows, name


def best_rates(rows: list[SweepRow]) -> dict[str, float]:
    """Each swept system's rate of the highest validation BLEU (the lower rate where two score the same); none
    for a system whose every run failed."""
    best: dict[str, tuple[float, float]] = {}  # system: (validation BLEU, lr)
    for row in sorted(rows, key=lambda r: r.lr):
        if row.mark is not None and (row.system not in best or row.mark.bleu > best[row.system][0]):
            best[row.system] = (row.mark.bleu, row.lr)
    return {system: lr for system, (_, lr) in best.items()}


def race(args: argparse.Namespace, command: str, rows: list[SweepRow], sweep_set: str) -> Report:
    """The race (or a sweep's round) as `args` set it; its report, written where args.out says."""
    bench, schedule = setup(args)
    m = bench.config.model
    report = Report(
        machine=describe_machine(args.threads),
        command=command,
        model=f"d_model {m.d_model}, {m.n_layers}+{m.n_decoder_layers or m.n_layers} layers, {m.n_heads} heads, d_ff "
        f"{m.d_ff}, {m.ffn}, dropout {m.dropout}, {m.pos} positions (tformer; Marian's are sinusoidal), one shared "
        "tied vocabulary (the prepared SentencePiece model)",
        test=f"{bench.test_src.with_suffix('').name} ({len(bench.references):,} lines)",
        test_path=shown(bench.test_src.with_suffix("")),
        signatures=bench.signatures,
        minutes=bench.minutes,
        systems=[],
        notes=[ONMT],
        sweep=rows,
        sweep_set=sweep_set,
    )
    if args.side_by_side:
        report.notes.insert(
            0,
            f"Side by side: each system in a process of its own at the same time, {threads(args.threads)} each "
            "(`--side-by-side`).",
        )
        side_by_side(args, bench, report)
        write(report, args.out, bench.work, final=True)
        return report
    precision = resolved(bench.config.train.precision, "train.precision")
    for name in args.systems:
        try:
            if name == "tformer":
                report.systems += run_tformer(bench, schedule, args.tformer_average)
                precision = recorded_precision(bench.work / "tformer") or precision
            else:
                warmup = args.peer_warmup if args.peer_warmup is not None else bench.config.train.warmup_steps
                settings = _peers.PeerSettings(lr=args.peer_lr, warmup=warmup)
                report.systems.append(run_marian(bench, settings, precision))
        except Exception as exc:  # one failing system is reported; the others' numbers stand
            report.systems.append(
                SystemResult(name, "", error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            )
        write(report, args.out, bench.work, final=False)  # after each system: its numbers survive a later failure
    write(report, args.out, bench.work, final=True)
    return report


def recorded_precision(run_dir: Path) -> str | None:
    """train.precision as the tformer run's config.yaml records it (`auto` resolved when the run started)."""
    path = run_dir / CONFIG
    return yaml.safe_load(path.read_text())["train"]["precision"] if path.is_file() else None


if __name__ == "__main__":
    main()
