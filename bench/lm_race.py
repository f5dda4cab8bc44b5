"""A perplexity race on WikiText-2: tformer's Transformer recipe, tformer's LSTM recipe and Hugging Face's GPT-2
architecture trained from scratch at the Transformer's size, each in a process of its own at the same time, each
scored at wall-clock marks by the same perplexity code.

    python bench/lm_race.py                                       # 15 / 30 / 60 min -> docs/lm_race.{md,json,png}
    python bench/lm_race.py --sweep-lr gpt2 5e-4 1e-3 2e-3 --sweep-lr lstm 1e-3 2e-3 4e-3
    python bench/lm_race.py --lr gpt2 1e-3 train.batch_size=32    # key=value: both tformer recipes (and GPT-2's)
    python bench/lm_race.py lstm:model.d_model=512                # SYSTEM:key=value: that system only
    python bench/lm_race.py gpt2:train.max_updates=1500           # (tformer:key=value sets GPT-2's size too)
    python bench/lm_race.py --minutes 0.3 0.6 --out /tmp/race/lm_race.md model.n_layers=1 ...   # a short look

The systems (`--systems`, default all three):
- tformer: `tformer train recipes/wikitext2_lm.yaml` once per mark with train.max_minutes=MARK, each resuming the
  last (time_to_bleu.py's way: the run's clock counts its time before a resume); train.max_updates and
  train.warmup_steps scaled from the recipe's budget (train.max_minutes) to the last mark unless given.
- lstm: the same with recipes/wikitext2_lstm.yaml (`--lstm-recipe`), on the same prepared data.
- gpt2: GPT2LMHeadModel at the tformer recipe's size, data, batches, optimiser and schedule (bench/_lm_peer.py says
  what is shared), trained in this script's plain PyTorch loop, a checkpoint saved at each mark.
At each mark, with the training clock stopped, the system's checkpoint is scored by tformer's own perplexity code
(evaluate.py `evaluate_lm_text`, the code of `tformer perplexity RUN FILE`) on the raw test and validation files:
non-overlapping blocks of data.block_size tokens over the text's lines, each line ending with an end-of-line token,
perplexity per token and per word (words: line.split() + ['<eos>'] per line: 245,569 on WikiText-2's test set), in
fp32 for all three. GPT-2 goes through the same function behind a two-call adapter (`_lm_peer.Scorer`).

--sweep-lr SYSTEM LR LR LR (repeatable): before the race, the race itself stopped at its shortest mark once per
learning rate (the same schedule, budget and load: as many processes at once as the race has systems); the lowest
validation perplexity per word picks the rate the race then uses. --lr SYSTEM LR fixes one instead (default: the
recipe's train.lr; GPT-2's: the tformer recipe's).

Writes the markdown (--out, default docs/lm_race.md), the JSON and the plot (perplexity per word against minutes)
beside it; runs and checkpoints stay in --work (emptied at the start).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import _lm_peer  # noqa: E402
import _lm_report  # noqa: E402
from _lm_report import Mark, Report, SweepRow, SystemResult  # noqa: E402
from _peers import parameter_count  # noqa: E402
from time_to_bleu import (  # noqa: E402
    describe_machine,
    recorded_precision,
    resolved,
    run_cli,
    scaled_schedule,
    shown,
    sweep_rates,
    training_rate,
)

from tformer_cli.config import load_config  # noqa: E402
from tformer_cli.data.text import read_lines  # noqa: E402
from tformer_cli.schema import Config  # noqa: E402

ROOT = Path(__file__).parents[1]
RECIPES = {"tformer": ROOT / "recipes" / "wikitext2_lm.yaml", "lstm": ROOT / "recipes" / "wikitext2_lstm.yaml"}
SYSTEMS = ("tformer", "lstm", "gpt2")
SHAPE_OF = {"tformer": "tformer", "lstm": "lstm", "gpt2": "tformer"}  # whose recipe (and overrides) sets the size
RESULT = "result.json"


@dataclass(frozen=True)
class Bench:
    """What every system's process shares."""

    recipes: dict[str, Path]
    overrides: list[str]  # as given: key=value for every recipe, SYSTEM:key=value for one
    minutes: list[float]  # the marks this process stops at
    budget: float  # the race's last mark: the schedules are scaled to it
    work: Path
    threads: int
    valid: Path
    test: Path | None  # None: a sweep's run, scored on validation only

    def overrides_for(self, system: str) -> list[str]:
        """The overrides that apply to `system`, without their prefixes: unprefixed ones, those of the recipe that
        sets its size (GPT-2 takes tformer:'s), then its own (gpt2:key=value, for the peer alone)."""
        out, own = [], []
        for item in self.overrides:
            head, _, rest = item.partition(":")
            if head in SYSTEMS and "=" in rest and "=" not in head:
                out += [rest] if head == SHAPE_OF[system] else []
                own += [rest] if head == system != SHAPE_OF[system] else []
            else:
                out.append(item)
        return out + own

    def config(self, system: str, lr: float | None = None) -> tuple[Config, list[str]]:
        """The recipe of `system` with its overrides, its schedule scaled to the budget and `lr` (None: the
        recipe's); and the overrides that made it."""
        recipe = self.recipes[SHAPE_OF[system]]
        given = self.overrides_for(system)
        given += scaled_schedule(load_config(recipe, given), given, self.budget)
        given += [f"train.lr={lr!r}"] if lr is not None else []
        return load_config(recipe, given), given


def evaluate(bench: Bench, model, tokenizer, block: int) -> dict[str, float]:
    """Validation (and, where `bench.test` is set, test) perplexity of `model` by tformer's `evaluate_lm_text`: blocks
    of `block` tokens, fp32."""
    from tformer_cli.evaluate import evaluate_lm_text

    start = time.perf_counter()
    scores = {}
    for split, path in (("valid", bench.valid), ("test", bench.test)):
        if path is not None:
            result = evaluate_lm_text(model, tokenizer, list(read_lines(path)), block, block)
            scores |= {f"{split}_ppl_word": result["ppl_word"], f"{split}_ppl_token": result["ppl_token"]}
            scores |= {f"{split}_words": result["words"]}
    return scores | {"eval_s": time.perf_counter() - start}


def settings_line(config: Config, precision: str) -> str:
    """The training settings a row of the table states."""
    t, m = config.train, config.model
    return (
        f"{t.optimizer} lr {t.lr:g} {t.schedule} over {t.max_updates:,} updates (warm-up {t.warmup_steps:,}), weight "
        f"decay {t.weight_decay:g}, {t.batch_size} x {config.data.block_size} tokens x {t.update_freq} per update, "
        f"dropout {m.dropout:g}, clip {t.clip_norm:g}, precision {precision}"
    )


def run_tformer(bench: Bench, system: str, lr: float) -> SystemResult:
    """`tformer train` up to each mark in turn (resuming), the latest checkpoint scored after each."""
    from tformer_cli.run import load_run
    from tformer_cli.run.checkpoints import load_verified, read_index
    from tformer_cli.run.layout import CHECKPOINTS, METRICS

    config, given = bench.config(system, lr)
    recipe, run_dir = bench.recipes[system], bench.work / system
    result = SystemResult(system, lr=lr)
    common = [*given, f"run.out_dir={bench.work}", f"run.name={system}", f"run.threads={bench.threads}"]
    for minutes in bench.minutes:
        log = bench.work / f"{system}_train_{minutes:g}min.log"
        run_cli(["train", str(recipe), *common, f"train.max_minutes={minutes:g}"], log)
        latest = run_dir / CHECKPOINTS / read_index(run_dir / CHECKPOINTS)["latest"]
        position = load_verified(latest)["position"]
        run = load_run(latest, device="cpu", cast=False)  # as trained: all three systems are scored in fp32
        scores = evaluate(bench, run.model, run.tokenizer, config.data.block_size)
        result.marks.append(Mark(minutes, position["seconds"], position["step"], shown(latest), **scores))
        result.parameters = parameter_count(run.model)
        print(f"{system} at {minutes:g} min: {result.marks[-1].line()}", flush=True)
    precision = recorded_precision(run_dir) or config.train.precision
    m = config.model
    shape = f"{m.n_layers} layers, d_model {m.d_model}" + (f", {m.n_heads} heads, {m.pos}" if m.kind == "lm" else "")
    result.settings = f"`tformer train {recipe.name}` ({m.kind}: {shape}): {settings_line(config, precision)}"
    try:
        result.tokens_per_s = training_rate(run_dir / METRICS)
    except RuntimeError:  # fewer updates than train.log_every: no rate logged
        result.tokens_per_s = 0.0
    return result


def run_gpt2(bench: Bench, lr: float) -> SystemResult:
    """The peer trained in this process; at each mark a checkpoint saved, loaded back and scored."""
    from tformer_cli.data.prepared import PreparedData
    from tformer_cli.tokenizer import Tokenizer

    config, _ = bench.config("gpt2", lr)
    data = PreparedData(config.data, config.tokenizer)
    tokenizer, vocab = Tokenizer(data.tokenizer_path), data.vocab_size
    precision = resolved(config.train.precision, "train.precision")
    m = config.model
    result = SystemResult("gpt2", lr=lr)
    result.settings = (
        f"plain PyTorch loop: GPT2LMHeadModel ({m.n_layers} layers, n_embd {m.d_model}, {m.n_heads} heads, n_inner "
        f"{m.d_ff}, learned positions, gelu_new), tformer's batches, optimiser and schedule: "
        f"{settings_line(config, precision)}"
    )

    def on_mark(mark: _lm_peer.Mark) -> None:
        path = bench.work / "gpt2" / f"checkpoint_{mark.minutes:g}min.pt"
        _lm_peer.save(model, path)
        scores = evaluate(bench, _lm_peer.Scorer(_lm_peer.load(path)), tokenizer, config.data.block_size)
        result.marks.append(Mark(mark.minutes, mark.seconds, mark.updates, shown(path), **scores))
        print(f"gpt2 at {mark.minutes:g} min: {result.marks[-1].line()}", flush=True)

    torch.manual_seed(config.run.seed)
    model = _lm_peer.gpt2_model(config, vocab)
    result.parameters = parameter_count(model)
    result.tokens_per_s = _lm_peer.train(model, config, precision, bench.minutes, on_mark)
    return result


def job(args: argparse.Namespace, bench: Bench) -> None:
    """This process is one system's run (--job): its result into WORK/result.json, or the error that ended it."""
    torch.set_num_threads(args.threads)
    lr = args.lr.get(args.job)
    try:
        result = run_gpt2(bench, lr) if args.job == "gpt2" else run_tformer(bench, args.job, lr)
    except Exception as exc:  # the row says why; the other systems' stand
        result = SystemResult(args.job, lr=lr, error=f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}")
    (bench.work / RESULT).write_text(json.dumps(asdict(result), indent=1) + "\n")
    if result.error:
        raise SystemExit(result.error)


@dataclass
class Job:
    """One system's run in a process of its own: the race's, or one learning rate of a sweep."""

    system: str
    lr: float
    minutes: list[float]
    work: Path
    valid_only: bool = False
    proc: subprocess.Popen | None = field(default=None, repr=False)


def child_args(args: argparse.Namespace, bench: Bench, one: Job) -> list[str]:
    """The command line of `one`'s process: the race's settings, that system and rate alone."""
    argv = [*bench.overrides, "--job", one.system, "--lr", one.system, repr(one.lr), "--work", str(one.work)]
    argv += ["--minutes", *(f"{m:g}" for m in one.minutes), "--budget", f"{bench.budget:g}"]
    argv += ["--threads", str(args.threads), "--valid", str(bench.valid)]
    argv += ["--recipe", str(bench.recipes["tformer"]), "--lstm-recipe", str(bench.recipes["lstm"])]
    if one.valid_only:
        return [*argv, "--valid-only"]
    return argv + (["--test", str(bench.test)] if bench.test is not None else [])


def run_jobs(args: argparse.Namespace, bench: Bench, jobs: list[Job], at_once: int) -> list[SystemResult]:
    """`jobs` in processes of their own, `at_once` at a time (each group waited for before the next starts, so
    that every run trains beside as many others); their results in order. A process that ends without its result
    is a failed row naming its log; stopped (Ctrl-C, an error here), this one stops the processes still running."""
    results = []
    try:
        for first in range(0, len(jobs), at_once):
            group = jobs[first : first + at_once]
            for one in group:
                shutil.rmtree(one.work, ignore_errors=True)  # an earlier run: tformer train would resume it
                one.work.mkdir(parents=True)
                print(f"{one.system} lr {one.lr:g}: its output in {one.work / 'race.log'}", flush=True)
                cmd = [sys.executable, str(Path(__file__).resolve()), *child_args(args, bench, one)]
                with (one.work / "race.log").open("w") as log:
                    one.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            for one in group:
                assert one.proc is not None
                one.proc.wait()
                results.append(read_result(one))
    finally:
        for one in jobs:
            if one.proc is not None and one.proc.poll() is None:
                one.proc.terminate()
                one.proc.wait()
    return results


def read_result(one: Job) -> SystemResult:
    """The result a job's process wrote, or a failed row naming its log."""
    path = one.work / RESULT
    if not path.is_file():
        assert one.proc is not None
        error = f"its process exited {one.proc.returncode} with no result (log: {shown(one.work / 'race.log')})"
        return SystemResult(one.system, lr=one.lr, error=error)
    return SystemResult.from_dict(json.loads(path.read_text()))


def sweep(args: argparse.Namespace, bench: Bench, report: Report) -> dict[str, float]:
    """Each --sweep-lr system run at the shortest mark once per rate; the rows into `report`; the best rates."""
    shortest = bench.minutes[:1]
    jobs = [
        Job(system, lr, shortest, bench.work / "sweep" / f"{system}_lr{lr:g}", valid_only=True)
        for system, rates in args.sweep_lr.items()
        for lr in rates
    ]
    best: dict[str, float] = {}
    for result in run_jobs(args, bench, jobs, len(args.systems)):
        mark = result.marks[0] if result.marks else None
        report.sweep.append(SweepRow(result.name, result.lr, shortest[0], mark, result.error))
    for system in args.sweep_lr:
        rows = [row for row in report.sweep if row.system == system and row.mark is not None]
        if rows:
            best[system] = _lm_report.best_rate(rows)
    return best


def rates(bench: Bench, given: dict[str, float], systems: list[str]) -> dict[str, float]:
    """Each system's learning rate: given (--lr, or a sweep's best), else its recipe's train.lr."""
    return {system: given.get(system, bench.config(system)[0].train.lr) for system in systems}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="key=value (the tformer recipes), SYSTEM:key=value (one)")
    parser.add_argument("--minutes", type=float, nargs="+", default=[15, 30, 60], help="the marks")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--threads", type=int, help="per system (default: usable cores // systems)")
    parser.add_argument("--lr", nargs=2, action="append", default=[], metavar=("SYSTEM", "LR"))
    parser.add_argument("--sweep-lr", nargs="+", action="append", default=[], metavar="SYSTEM LR")
    parser.add_argument("--recipe", type=Path, default=RECIPES["tformer"])
    parser.add_argument("--lstm-recipe", type=Path, default=RECIPES["lstm"])
    parser.add_argument("--valid", type=Path, help="raw validation text (default: data.valid)")
    parser.add_argument("--test", type=Path, help="raw test text (default: data.test)")
    parser.add_argument("--work", type=Path, default=Path("runs/lm_race"))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "lm_race.md", help="the JSON and plot beside")
    parser.add_argument("--job", choices=SYSTEMS, help=argparse.SUPPRESS)  # one system's own process
    parser.add_argument("--budget", type=float, help=argparse.SUPPRESS)  # its race's last mark
    parser.add_argument("--valid-only", action="store_true", help=argparse.SUPPRESS)  # a sweep's run
    args = parser.parse_intermixed_args(argv)
    if any(m <= 0 for m in args.minutes):
        raise SystemExit(f"--minutes {' '.join(f'{m:g}' for m in args.minutes)}: marks must be > 0")
    args.minutes = sorted(set(args.minutes))
    args.lr = {system: values[0] for system, values in (sweep_rates(pair, SYSTEMS, "--lr") for pair in args.lr)}
    args.sweep_lr = dict(sweep_rates(values, SYSTEMS) for values in args.sweep_lr)
    if both := sorted(set(args.lr) & set(args.sweep_lr)):
        raise SystemExit(f"--lr and --sweep-lr both name {', '.join(both)}: give one")
    if stray := sorted((set(args.lr) | set(args.sweep_lr)) - set(args.systems)):
        raise SystemExit(f"--lr/--sweep-lr name {', '.join(stray)}, which --systems leaves out")
    args.threads = args.threads or max(1, len(os.sched_getaffinity(0)) // len(args.systems))
    return args


def texts(args: argparse.Namespace, config: Config) -> tuple[Path, Path | None]:
    """The raw validation and test texts a run scores (no test for a sweep's run: its rate is chosen on
    validation, and scoring the test set too would cost its time)."""
    return text_file(args.valid, config, "valid"), None if args.valid_only else text_file(args.test, config, "test")


def text_file(given: Path | None, config: Config, split: str) -> Path:
    """The raw text of `split` ("valid", "test"): as given, else the recipe's data.<split>.

    Raises:
        SystemExit: neither names a file here (one line).
    """
    path = given or getattr(config.data, split)
    if not isinstance(path, (str, Path)):
        raise SystemExit(f"data.{split} is {path!r}: give the raw {split} text as --{split} FILE")
    if not Path(path).is_file():
        raise SystemExit(f"{path} not found (data.{split}, or --{split} FILE)")
    return Path(path)


def prepare_once(bench: Bench, systems: list[str]) -> None:
    """The prepared data all systems read (each recipe's data.dir, up to date or prepared now).

    Raises:
        SystemExit: two recipes share data.dir with other data or tokenizer settings (the second would replace
            what the first trains on).
    """
    from tformer_cli.data.prepare import prepare

    seen: dict[str, Config] = {}
    for system in dict.fromkeys(SHAPE_OF[s] for s in systems):
        config, _ = bench.config(system)
        other = seen.get(config.data.dir)
        if other is not None and (other.data, other.tokenizer) != (config.data, config.tokenizer):
            raise SystemExit(f"the recipes share data.dir={config.data.dir} with other data or tokenizer settings")
        if other is None:
            prepare(config.data, config.tokenizer, log=lambda line: print(f"prepare: {line}", file=sys.stderr))
            seen[config.data.dir] = config


def main(argv: list[str] | None = None) -> Report:
    args = parse(argv)
    recipes = {"tformer": args.recipe, "lstm": args.lstm_recipe}
    first = Bench(recipes, list(args.overrides), args.minutes, args.budget or max(args.minutes), args.work.resolve(),
                  args.threads, Path(), None)  # fmt: skip
    config, _ = first.config("tformer")
    valid, test = texts(args, config)
    bench = dataclasses.replace(first, valid=valid, test=test)
    if args.job:
        job(args, bench)
        return Report.empty()
    torch.set_num_threads(args.threads)
    bench.work.mkdir(parents=True, exist_ok=True)  # each run's own folder in it is emptied when the run starts
    prepare_once(bench, args.systems)
    report = Report(
        machine=describe_machine(args.threads),
        command="python bench/lm_race.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        test=f"{shown(test)} ({sum(len(line.split()) + 1 for line in read_lines(test)):,} words)",
        valid=shown(valid),
        minutes=bench.minutes,
        threads=args.threads,
    )
    chosen = dict(args.lr)
    if args.sweep_lr:
        chosen |= sweep(args, bench, report)
        _lm_report.write(report, args.out)  # the sweep's table survives a failure of the race
    lrs = rates(bench, chosen, args.systems)
    jobs = [Job(system, lrs[system], bench.minutes, bench.work / system) for system in args.systems]
    report.systems = run_jobs(args, bench, jobs, len(jobs))
    _lm_report.write(report, args.out)
    print(f"wrote {args.out}, {args.out.with_suffix('.json')}, {args.out.with_suffix('.png')}")
    return report


if __name__ == "__main__":
    main()
