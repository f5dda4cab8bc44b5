"""bench/gpu_train.py's real loop: recipes/wmt14_base.yaml prepared and trained through the library, its rate read
from metrics.jsonl, and tformer's own update() on random batches with the loop's settings (what the loop is
compared with). A made-up parallel corpus for smoke runs.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import torch
from _systems import Shape, random_batch
from torch import Tensor, nn

from tformer_cli.config import load_config
from tformer_cli.data.prepare import prepare
from tformer_cli.metrics import Stats
from tformer_cli.run import build_model_from_config
from tformer_cli.run.layout import METRICS
from tformer_cli.schema import Config, TrainConfig
from tformer_cli.train.dist import World
from tformer_cli.train.loop import train
from tformer_cli.train.optim import build_optimizer
from tformer_cli.train.step import Step, build_engine, update
from tformer_cli.train.tasks import make_task, next_token_loss

RECIPE = Path(__file__).parents[1] / "recipes" / "wmt14_base.yaml"
SPLITS = (
    "train",
    "newstest2013",
    "newstest2014",
)  # the WMT14 sample's files (the data root's wmt14-en-de/), .en and .de
LOOP_SAMPLE = ("tokenizer.vocab_size=8000",)  # the loop's overrides on the WMT14 sample, as bench/gpu_check.sh's
LOOP_SMOKE = (  # the smoke shape on the made-up corpus
    "tokenizer.vocab_size=100",
    "model.d_model=64",
    "model.n_heads=4",
    "model.n_layers=2",
    "model.d_ff=256",
    "train.max_tokens=256",
    "train.precision=fp32",
)

Batch = tuple[Tensor, Tensor, Tensor]


@dataclass(frozen=True)
class Loop:
    """Where and how long the real loop trains."""

    corpus: Path  # SPLITS as .en / .de files
    work: Path  # the prepared data, kept between calls (prepare skips it when up to date)
    device: torch.device
    updates: int  # train.max_updates
    minutes: float  # train.max_minutes: a bound in case an update is much slower than expected
    overrides: tuple[str, ...]  # last (they win): the sizes, then the user's settings


@dataclass(frozen=True)
class LoopResult:
    """What the loop's metrics say."""

    config: Config  # the run's resolved recipe
    vocab: int  # the prepared tokenizer's
    updates: int  # training records (train.log_every=1: one per update)
    first_update_s: float  # from the metrics log's start (the model built) to the first record: compiling included
    rate: float  # median target tokens/s of the records after the first
    ms_per_update: float  # median time between consecutive records after the first
    tokens_per_update: float  # real target tokens: the mean over an epoch's batches x update_freq
    losses: list[float]  # the training loss of each update, in order
    valid_loss: float  # the validation loss after the last update


def run_loop(loop: Loop) -> LoopResult:
    """Prepare the loop's data (into loop.work), train it into a temporary folder, read its metrics.

    Raises:
        FileNotFoundError: a file of the corpus is missing.
        RuntimeError: fewer than two updates were logged.
    """
    for name in SPLITS:
        for lang in ("en", "de"):
            if not (loop.corpus / f"{name}.{lang}").is_file():
                raise FileNotFoundError(
                    f"{loop.corpus / f'{name}.{lang}'} not found: give --data DATA_ROOT/wmt14-en-de or set TFORMER_DATA"
                )
    data = [
        f"data.train={loop.corpus / 'train'}",
        f"data.valid={loop.corpus / 'newstest2013'}",
        f"data.test={loop.corpus / 'newstest2014'}",
        f"data.dir={loop.work / 'data'}",
        f"run.device={loop.device.type}",
    ]
    config = load_config(RECIPE, [*data, *loop.overrides])
    manifest = prepare(config.data, config.tokenizer, log=lambda line: print(f"  prepare: {line}"))
    with tempfile.TemporaryDirectory() as out:
        timing = [
            f"run.out_dir={out}",
            "run.name=loop",
            f"train.max_updates={loop.updates}",
            f"train.max_minutes={loop.minutes}",
            "train.log_every=1",  # one record per update
            "train.valid_every=1000000",  # no validation inside the timed updates; one at the end
        ]
        config = load_config(RECIPE, [*data, *timing, *loop.overrides])
        run_dir = Path(config.run.out_dir) / config.run.name
        try:
            train(config, run_dir)
        finally:
            torch._dynamo.reset()  # train.compile's graphs: what is compiled next starts afresh
        records = [json.loads(line) for line in (run_dir / METRICS).read_text().splitlines()]
    logged = [r for r in records if r["split"] == "train"]
    validated = [r for r in records if r["split"] == "valid"]
    if len(logged) < 2:
        raise RuntimeError(f"the loop logged {len(logged)} update(s): too few for a rate after the first")
    times = [r["time"] for r in logged]
    task = make_task(config)
    tokens = statistics.mean(task.count(batch) for batch in task.batches(0)) * config.train.update_freq
    return LoopResult(
        config=config,
        vocab=int(manifest["tokenizer"]["vocab_size"]),
        updates=len(logged),
        first_update_s=times[0],
        rate=statistics.median(r["tokens_per_s"] for r in logged[1:]),
        ms_per_update=1000 * statistics.median(b - a for a, b in pairwise(times)),
        tokens_per_update=tokens,
        losses=[r["loss"] for r in logged],
        valid_loss=validated[-1]["loss"] if validated else float("nan"),
    )


def loop_shape(config: Config, vocab: int, batch: Shape) -> Shape:
    """The loop's model at `vocab`, with `batch`'s batch (for random batches and FLOPs)."""
    m = config.model
    return Shape(
        m.d_model,
        m.n_layers,
        m.n_heads,
        m.d_ff,
        vocab,
        batch.batch,
        batch.src,
        batch.tgt,
        m.n_decoder_layers,
        m.dropout,
    )


class _RandomBatches:
    """What step.update and step.compiled ask of a Task, on random batches already on the device (no padding)."""

    unit = "tokens"

    def __init__(self, check_batch: Batch, train: TrainConfig) -> None:
        self.check_batch, self.train = check_batch, train

    def batches(self, epoch: int) -> list[Batch]:
        return [self.check_batch]

    def count(self, batch: Batch) -> int:
        return batch[2].numel()  # every target is real: no host sync

    def inputs(self, batch: Batch, device: torch.device) -> Batch:
        return batch

    def loss_on(self, model: nn.Module, *inputs: Tensor) -> tuple[Tensor, Stats]:
        """The seq2seq task's training loss (train/tasks.py)."""
        return next_token_loss(model, inputs, self.train)


def update_as_the_loop(config: Config, shape: Shape) -> Callable[[torch.device], Callable[[Batch], Tensor]]:
    """A builder of tformer's update() with the loop's model, optimizer, precision, compile and loss settings."""

    def make(device: torch.device) -> Callable[[Batch], Tensor]:
        tc = config.train
        model = build_model_from_config(config, shape.vocab).to(device)
        check = tuple(t.to(device).contiguous() for t in random_batch(shape, 0))
        task = _RandomBatches(check, tc)
        scaler = torch.amp.GradScaler(device.type, enabled=tc.precision == "fp16")
        engine = build_engine(model, task, build_optimizer(model, tc), scaler, tc, World())  # type: ignore[arg-type]

        def step(batch: Batch) -> Tensor:
            stats, status = update(engine, Step([batch], True, 1e-4))
            if status != "ok":
                raise RuntimeError(f"update(): {status}")
            return torch.as_tensor(stats.loss_sum) / stats.count

        return step

    return make


WORDS = (
    "the a one two red blue small big house tree river stone bird dog cat child woman man sees finds takes gives "
    "near under over with without and but old new green black white quick slow city road field light water"
).split()


def wmt14_sample() -> Path | None:
    """The WMT14 sample under the data root $TFORMER_DATA (the recipes' data root), or None where it is not set."""
    root = os.environ.get("TFORMER_DATA")
    return Path(root) / "wmt14-en-de" if root else None


def made_up_corpus(folder: Path, seed: int = 0) -> Path:
    """SPLITS of made-up parallel text (400 / 40 / 10 lines): the "German" side is each English word reversed
    with "en" added, the last two words swapped. The same files for the same seed (prepare stays up to date)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name, lines in zip(SPLITS, (400, 40, 10), strict=True):
        english = [[rng.choice(WORDS) for _ in range(rng.randint(3, 10))] for _ in range(lines)]
        german = [[w[::-1] + "en" for w in s[:-2]] + [s[-1][::-1] + "en", s[-2][::-1] + "en"] for s in english]
        (folder / f"{name}.en").write_text("".join(" ".join(s) + "\n" for s in english))
        (folder / f"{name}.de").write_text("".join(" ".join(s) + "\n" for s in german))
    return folder
