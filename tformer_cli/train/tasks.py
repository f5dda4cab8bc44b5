"""What the loop trains on: data, batches in a (seed, epoch)-determined order, loss and evaluation.

One task per data kind; the loop in `loop.py` only calls the methods below.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer_cli.data import pattern
from tformer_cli.data.batching import TokenArray, lm_blocks, shuffled_batches, token_budget_batches
from tformer_cli.data.manifest import MANIFEST, check_made_for, read_manifest
from tformer_cli.data.sources import locate
from tformer_cli.errors import ConfigError, DataError
from tformer_cli.model import build_model
from tformer_cli.schema import Config, ModelConfig
from tformer_cli.tokenizer import BOS_ID, PAD_ID


@dataclass
class Stats:
    """Sums over a stretch of batches (loss is summed per example/token so averages are exact)."""

    loss_sum: float = 0.0
    correct: int = 0
    count: int = 0

    def add(self, other: Stats) -> None:
        self.loss_sum += other.loss_sum
        self.correct += other.correct
        self.count += other.count

    @property
    def loss(self) -> float:
        return self.loss_sum / max(self.count, 1)

    @property
    def accuracy(self) -> float:
        return self.correct / max(self.count, 1)


class ClassifierTask:
    """PatternSequence classification: examples are (tokens, label), the metric is accuracy."""

    unit = "examples"
    tokenizer_fingerprint = None

    def __init__(self, config: Config) -> None:
        p = config.data.pattern
        self.config = config
        self.data = pattern.generate(
            p.seed, p.n_examples, p.n_train, p.seq_len, p.vocab_size, p.n_classes, p.pattern_len
        )
        self.vocab_size, self.n_classes = p.vocab_size, p.n_classes

    def build_model(self) -> nn.Module:
        return model_from_section(self.config.model, self.vocab_size, self.n_classes)

    def batches(self, epoch: int) -> list[Tensor]:
        """Index batches of the training set: a permutation drawn from (run.seed, epoch) only."""
        gen = torch.Generator().manual_seed(self.config.run.seed * 100_003 + epoch)
        order = torch.randperm(self.data.train_tokens.size(0), generator=gen)
        return list(order.split(self.config.train.batch_size))

    def count(self, batch: Tensor) -> int:
        """Examples in a batch (what the loss is averaged over)."""
        return len(batch)

    def loss(self, model: nn.Module, batch: Tensor, device: torch.device) -> tuple[Tensor, Stats]:
        """Mean cross-entropy over the batch, and its sums for logging."""
        tokens = self.data.train_tokens[batch].to(device)
        labels = self.data.train_labels[batch].to(device)
        logits = model(tokens)
        loss = F.cross_entropy(logits.float(), labels, label_smoothing=self.config.train.label_smoothing)
        correct = int((logits.argmax(-1) == labels).sum())
        return loss, Stats(float(loss.detach()) * len(batch), correct, len(batch))

    @torch.inference_mode()
    def predict(self, model: nn.Module, device: torch.device, batch_size: int = 500) -> tuple[Tensor, Tensor]:
        """(logits (N_valid, C), labels (N_valid,)) on the validation split."""
        model.eval()
        logits = [model(chunk.to(device)).float().cpu() for chunk in self.data.valid_tokens.split(batch_size)]
        return torch.cat(logits), self.data.valid_labels

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Validation loss and accuracy."""
        logits, labels = self.predict(model, device)
        return {
            "loss": float(F.cross_entropy(logits, labels)),
            "accuracy": float((logits.argmax(-1) == labels).float().mean()),
        }


def _load_prepared(config: Config) -> dict:
    """The manifest of data.dir, checked against the recipe before anything is trained on it.

    Raises:
        DataError: no or a damaged manifest, another data kind, data prepared with other data or
            tokenizer settings (or by an older tformer), or no validation split (one line each).
    """
    manifest_path = Path(config.data.dir) / MANIFEST
    manifest = read_manifest(manifest_path.parent)
    if manifest is None:
        raise DataError(f"{manifest_path} not found: run `tformer prepare` with this recipe first")
    if manifest.get("kind") != config.data.kind:
        raise DataError(
            f"{manifest_path} holds {manifest.get('kind')} data, the recipe says data.kind={config.data.kind}"
        )
    check_made_for(manifest, config, manifest_path)
    if "valid" not in manifest["splits"]:
        raise DataError(_no_validation_split(config))
    return manifest


def _no_validation_split(config: Config) -> str:
    """What to set when the prepared data (made with this recipe) has no validation split."""
    d = config.data
    if d.train is None:
        return (
            f"data.valid_split is empty: training needs a validation split; set data.valid_split=NAME "
            f"(a split of {d.hub}) and run `tformer prepare` again"
        )
    return (
        "data.valid is not set: training needs a validation split; set data.valid=PATH "
        "(or data.hub with a validation split) and run `tformer prepare` again"
    )


def _position_limit(model: ModelConfig) -> int | None:
    """The longest sequence the model's positions can take: model.max_len for a learned table.

    Sinusoidal positions extend past their precomputed table, and rope, alibi and the LSTM have no limit.
    """
    return model.max_len if model.pos == "learned" and model.kind != "lstm" else None


class _PreparedTask:
    """Shared by the tasks that read `prepare`'s output: vocabulary, tokenizer fingerprint, model."""

    unit = "tokens"
    n_classes = 0

    def __init__(self, config: Config) -> None:
        self.config = config
        self.manifest = _load_prepared(config)
        self.vocab_size = int(self.manifest["tokenizer"]["vocab_size"])
        self.tokenizer_fingerprint = self.manifest["tokenizer"]["fingerprint"]

    def array(self, split: str, side: str) -> TokenArray:
        base = Path(self.config.data.dir) / f"{split}.{side}"
        return TokenArray(
            base.with_suffix(base.suffix + ".bin"), base.with_suffix(base.suffix + ".idx"), self.manifest["dtype"]
        )

    def build_model(self) -> nn.Module:
        return model_from_section(self.config.model, self.vocab_size)

    def _token_loss(self, logits: Tensor, targets: Tensor, smoothing: float) -> tuple[Tensor, Stats]:
        """Mean (label-smoothed) cross-entropy over non-padding target tokens."""
        flat_logits, flat_targets = logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1)
        loss = F.cross_entropy(flat_logits, flat_targets, ignore_index=PAD_ID, label_smoothing=smoothing)
        real = flat_targets != PAD_ID
        correct = int((flat_logits.argmax(-1)[real] == flat_targets[real]).sum())
        n = int(real.sum())
        return loss, Stats(float(loss.detach()) * n, correct, n)

    @torch.inference_mode()
    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Validation loss (nats per token, no smoothing), perplexity and next-token accuracy."""
        model.eval()
        total = Stats()
        for batch in self.valid_batches():
            logits, targets = self.forward(model, batch, device)
            total.add(self._token_loss(logits, targets, 0.0)[1])
        return {"loss": total.loss, "ppl": math.exp(min(total.loss, 50.0)), "accuracy": total.accuracy}

    def loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[Tensor, Stats]:
        logits, targets = self.forward(model, batch, device)
        return self._token_loss(logits, targets, self.config.train.label_smoothing)


class LMTask(_PreparedTask):
    """Language modelling on the token stream cut into blocks of block_size + 1."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.train_stream = self.array("train", "text").tokens
        self.valid_stream = self.array("valid", "text").tokens
        self.block = config.data.block_size
        limit = _position_limit(config.model)
        if limit is not None and self.block > limit:
            raise ConfigError(
                f"data.block_size={self.block} is more than model.max_len={limit} (learned positions) takes: "
                "lower data.block_size or raise model.max_len"
            )
        self.starts = lm_blocks(self.train_stream.size, self.block)

    def count(self, batch: np.ndarray) -> int:
        return len(batch) * self.block

    def batches(self, epoch: int) -> list[np.ndarray]:
        blocks = shuffled_batches(self.starts.size, self.config.train.batch_size, self.config.run.seed, epoch)
        return [self.starts[b] for b in blocks]

    def valid_batches(self) -> list[np.ndarray]:
        starts = lm_blocks(self.valid_stream.size, self.block)
        return [("valid", chunk) for chunk in np.array_split(starts, max(1, starts.size // 32))]

    def collate(self, batch: Any) -> tuple[Tensor, Tensor]:
        """Block starts -> (inputs (B, block), targets (B, block)), targets shifted by one."""
        stream, starts = (self.valid_stream, batch[1]) if isinstance(batch, tuple) else (self.train_stream, batch)
        rows = torch.from_numpy(np.stack([np.asarray(stream[s : s + self.block + 1], dtype=np.int64) for s in starts]))
        return rows[:, :-1], rows[:, 1:]

    def forward(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[Tensor, Tensor]:
        inputs, targets = self.collate(batch)
        return model(inputs.to(device)), targets.to(device)


class Seq2SeqTask(_PreparedTask):
    """Translation: token-budget batches of (source, target) pairs."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.train_src, self.train_tgt = self.array("train", "src"), self.array("train", "tgt")
        self.valid_src, self.valid_tgt = self.array("valid", "src"), self.array("valid", "tgt")
        self.train_sizes = pair_sizes(self.train_src, self.train_tgt)
        self._check_fits("train", self.train_src, self.train_tgt)
        self._check_fits("valid", self.valid_src, self.valid_tgt)

    def _check_fits(self, split: str, src: TokenArray, tgt: TokenArray) -> None:
        """Refuse, before any update, a pair that the model's learned positions or a batch cannot take.

        Raises:
            DataError: naming the split, where its longest such pair was read, the length, the limit and the fix.
        """
        c = self.config
        limits = [("train.max_tokens", c.train.max_tokens, "one batch", (0, 1))]  # target + 1, as in pair_sizes
        positions = _position_limit(c.model)
        if positions is not None:
            limits.insert(0, ("model.max_len", positions, "learned positions", (0, 0)))
        for setting, limit, what, extra in limits:
            for side, lengths in enumerate((src.lengths + extra[0], tgt.lengths + extra[1])):
                too_long = int((lengths > limit).sum())
                if not too_long:
                    continue
                number = self.manifest["splits"][split]["longest"][self.manifest["sides"][side]]["example"]
                fix = "lower data.max_len" if split == "train" else "shorten or remove that line"
                others = f" ({too_long} {split} pairs are too long)" if too_long > 1 else ""
                raise DataError(
                    f"data.{split}: {locate(c, split, number, side)} has {int(lengths.max())} tokens, more than "
                    f"{setting}={limit} ({what}) takes{others}: raise {setting}, or {fix} and run "
                    "`tformer prepare` again"
                )

    def count(self, batch: np.ndarray) -> int:
        """Target tokens (including EOS) in a batch."""
        return int(self.train_tgt.lengths[batch].sum())

    def batches(self, epoch: int) -> list[np.ndarray]:
        return token_budget_batches(self.train_sizes, self.config.train.max_tokens, self.config.run.seed, epoch)

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Loss, perplexity and accuracy; plus greedy BLEU on the first train.valid_bleu_lines pairs."""
        metrics = super().evaluate(model, device)
        n = min(self.config.train.valid_bleu_lines, len(self.valid_src))
        if n:
            metrics["bleu"] = self._greedy_bleu(model, device, n)
        return metrics

    @torch.inference_mode()
    def _greedy_bleu(self, model: nn.Module, device: torch.device, n: int) -> float:
        from tformer_cli.decoding.search import greedy
        from tformer_cli.metrics import bleu_chrf
        from tformer_cli.tokenizer import Tokenizer

        tokenizer = Tokenizer(Path(self.config.data.dir) / "spm.model")
        hyps: list[str] = []
        for start in range(0, n, 32):
            src = pad_rows([self.valid_src[i] for i in range(start, min(start + 32, n))]).to(device)
            hyps += [tokenizer.decode(h.tokens) for h in greedy(model, src)]
        refs = [tokenizer.decode(self.valid_tgt[i].tolist()) for i in range(n)]
        return float(bleu_chrf(hyps, refs)["bleu"])

    def valid_batches(self) -> list[tuple[str, np.ndarray]]:
        sizes = pair_sizes(self.valid_src, self.valid_tgt)
        return [("valid", b) for b in token_budget_batches(sizes, self.config.train.max_tokens, 0, 0)]

    def collate(self, batch: Any) -> tuple[Tensor, Tensor, Tensor]:
        """Pair indices -> padded (source (B, S), decoder input (B, T), target (B, T))."""
        src_array, tgt_array, index = (
            (self.valid_src, self.valid_tgt, batch[1])
            if isinstance(batch, tuple)
            else (self.train_src, self.train_tgt, batch)
        )
        targets = [tgt_array[i] for i in index]  # each ends with EOS
        src = pad_rows([src_array[i] for i in index])
        tgt_in = pad_rows([np.concatenate([[BOS_ID], t[:-1]]) for t in targets])  # shifted right, BOS first
        return src, tgt_in, pad_rows(targets)

    def forward(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[Tensor, Tensor]:
        src, tgt_in, tgt = self.collate(batch)
        return model(src.to(device), tgt_in.to(device)), tgt.to(device)


def pair_sizes(src: TokenArray, tgt: TokenArray) -> np.ndarray:
    """(N,) what each pair counts against train.max_tokens: the longer of source and target + 1."""
    return np.maximum(src.lengths, tgt.lengths + 1)


def pad_rows(rows: list[np.ndarray]) -> Tensor:
    """Right-pad 1-D id arrays with PAD_ID into (B, T_max)."""
    out = torch.full((len(rows), max(len(r) for r in rows)), PAD_ID, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.from_numpy(np.asarray(row, dtype=np.int64))
    return out


Task = ClassifierTask | LMTask | Seq2SeqTask


def make_task(config: Config) -> Task:
    """The task for `data.kind` (a closed set)."""
    match config.data.kind:
        case "pattern":
            return ClassifierTask(config)
        case "text":
            return LMTask(config)
        case "parallel":
            return Seq2SeqTask(config)
    raise ConfigError(f"unknown data.kind {config.data.kind!r}")


def model_for_config(config: Config) -> nn.Module:
    """The model a recipe trains, built without its data: for text and parallel recipes the
    vocabulary is tokenizer.vocab_size (what `prepare` trains), so nothing needs preparing first."""
    if config.data.kind == "pattern":
        return ClassifierTask(config).build_model()
    return model_from_section(config.model, config.tokenizer.vocab_size)


def model_from_section(section: ModelConfig, vocab_size: int, n_classes: int = 0) -> nn.Module:
    """The recipe's `model:` section as `build_model` arguments (the one place they are unpacked)."""
    fields = dataclasses.asdict(section)
    kind = fields.pop("kind")
    return build_model(kind, vocab_size=vocab_size, n_classes=n_classes, pad_id=PAD_ID, **fields)
