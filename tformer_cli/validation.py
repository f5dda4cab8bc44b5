"""The validation split of a recipe's data and the metrics a model scores on it.

Training validates with these (make_task in train/tasks.py gives each task one) and `tformer eval` recomputes them
from a checkpoint alone (evaluate.py): both make a validation set one way, `validation_from` on the data as
data/splits.py read it, so the two agree and neither imports the other. It sits below both training and
`tformer eval` (nothing outside train/ imports train/); the sums and the token loss it shares with training
(`Stats`, `token_loss`) are in metrics.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer_cli.data import sessions
from tformer_cli.data.batching import (
    TokenArray,
    lm_blocks,
    lm_rows,
    pad_rows,
    pair_rows,
    pair_sizes,
    token_budget_batches,
)
from tformer_cli.data.splits import PreparedSplits, Splits, read_splits
from tformer_cli.errors import ConfigError
from tformer_cli.kinds import DATA_KINDS
from tformer_cli.metrics import Stats, bleu_chrf, token_loss
from tformer_cli.ranking import RankSums, best_sums, model_sums
from tformer_cli.schema import Config, SessionsConfig

if TYPE_CHECKING:
    from tformer_cli.data.pattern import PatternData
    from tformer_cli.model.seq2seq import Seq2Seq


def classifier_scores(logits: Tensor, labels: Tensor) -> dict[str, float]:
    """Loss and accuracy of (N, C) logits against (N,) labels."""
    return {
        "loss": float(F.cross_entropy(logits, labels)),
        "accuracy": float((logits.argmax(-1) == labels).float().mean()),
    }


class PatternValidation:
    """The validation examples of a PatternSequence recipe; the metrics are loss and accuracy."""

    tokenizer_fingerprint = None

    def __init__(self, tokens: Tensor, labels: Tensor, n_classes: int) -> None:
        self.tokens, self.labels, self.n_classes = tokens, labels, n_classes

    @torch.inference_mode()
    def predict(self, model: nn.Module, device: torch.device, batch_size: int = 500) -> tuple[Tensor, Tensor]:
        """(logits (N_valid, C) in fp32 on the CPU, labels (N_valid,))."""
        model.eval()
        logits = [model(chunk.to(device)).float().cpu() for chunk in self.tokens.split(batch_size)]
        return torch.cat(logits), self.labels

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Validation loss and accuracy."""
        return classifier_scores(*self.predict(model, device))


class SessionValidation:
    """Held-out generated sessions (validation or test): next-item loss, perplexity, accuracy, Hit@10 and
    MRR, overall and by the rule that made each target (ranking.py), beside the Bayes-optimal numbers
    of the generator on the same sessions (`bayes_*`: the best any predictor can do given the history).
    """

    tokenizer_fingerprint = None
    batch_size = 64  # sessions per forward pass (and per chunk of the Bayes-optimal computation)

    def __init__(self, data: sessions.Sessions, cfg: SessionsConfig) -> None:
        self.data, self.cfg = data, cfg
        self.best = self._best()  # a function of the data alone: computed once

    def _chunks(self) -> list[Tensor]:
        return list(torch.arange(len(self.data)).split(self.batch_size))

    def _best(self) -> dict[str, float]:
        """`bayes_loss` (the generator's own cross-entropy: the expected entropy of the next item given the
        history), then the Bayes-optimal ranks (ranking.best_sums), all prefixed `bayes_`."""
        ranks, entropy, n = RankSums(), 0.0, 0
        for rows in self._chunks():
            part = self.data.rows(rows)
            probs = sessions.next_item_probabilities(part.items, self.cfg)[part.rules != sessions.NO_TARGET]
            ranks.add(best_sums(probs))  # probs: (M, R, I) for the M real targets
            p = probs.sum(1)  # (M, I)
            entropy -= float(torch.where(p > 0, p * p.log(), 0.0).sum())
            n += p.size(0)
        return {"bayes_loss": entropy / max(n, 1), **ranks.metrics("bayes_")}

    def counts(self) -> dict[str, int]:
        """Sessions, targets, and targets made by each rule."""
        rules = self.data.rules[self.data.rules != sessions.NO_TARGET]
        by_rule = {f"n_{name}": int((rules == r).sum()) for r, name in enumerate(sessions.RULES)}
        return {"sessions": len(self.data), "n": int(rules.numel()), **by_rule}

    @torch.inference_mode()
    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Loss (nats per target) and perplexity, then accuracy, hit10 and mrr overall and per rule
        (`_local`, `_long`, `_random`), then the same with the `bayes_` prefix."""
        model.eval()
        loss, ranks = Stats(), RankSums()
        for rows in self._chunks():
            part = self.data.rows(rows)
            targets, rules = part.targets.to(device), part.rules.to(device)
            logits = model(part.inputs.to(device))  # (B, T, V): V = 1 + n_items, id 0 is padding
            loss.add(token_loss(logits, targets, 0.0)[1])
            real = rules != sessions.NO_TARGET
            items = logits[real][:, 1:].float()  # (M, n_items): padding is no candidate
            ranks.add(model_sums(items, targets[real] - 1, rules[real]))
        return {"loss": loss.loss, "ppl": math.exp(min(loss.loss, 50.0)), **ranks.metrics(), **self.best}


class _TokenValidation:
    """Shared by language modelling and translation: the loss over every target token of the split."""

    def __init__(self, tokenizer_fingerprint: str) -> None:
        self.tokenizer_fingerprint = tokenizer_fingerprint

    def batches(self) -> list[np.ndarray]:
        raise NotImplementedError

    def forward(self, model: nn.Module, batch: np.ndarray, device: torch.device) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    @torch.inference_mode()
    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Validation loss (nats per token, no smoothing), perplexity and next-token accuracy."""
        model.eval()
        total = Stats()
        for batch in self.batches():
            logits, targets = self.forward(model, batch, device)
            total.add(token_loss(logits, targets, 0.0)[1])
        return {"loss": total.loss, "ppl": math.exp(min(total.loss, 50.0)), "accuracy": total.accuracy}


class LMValidation(_TokenValidation):
    """The validation token stream cut into blocks of block_size + 1, as training cuts its own."""

    def __init__(self, stream: np.ndarray, block_size: int, tokenizer_fingerprint: str) -> None:
        super().__init__(tokenizer_fingerprint)
        self.stream, self.block = stream, block_size

    def batches(self) -> list[np.ndarray]:
        starts = lm_blocks(self.stream.size, self.block)
        return np.array_split(starts, max(1, starts.size // 32))

    def forward(self, model: nn.Module, batch: np.ndarray, device: torch.device) -> tuple[Tensor, Tensor]:
        inputs, targets = lm_rows(self.stream, batch, self.block)
        return model(inputs.to(device)), targets.to(device)


@dataclass(frozen=True)
class Translations:
    """What validation BLEU scored: the first validation pairs, decoded, and the model's greedy translations."""

    sources: list[str]
    references: list[str]
    hypotheses: list[str]


class PairValidation(_TokenValidation):
    """The validation pairs in token-budget batches, padded as training pads them; plus greedy BLEU on the
    first `bleu_lines` pairs, whose translations `translations` keeps (training writes and shows them)."""

    def __init__(
        self,
        src: TokenArray,
        tgt: TokenArray,
        max_tokens: int,
        pad_to_multiple: int,
        bleu_lines: int,
        tokenizer_path: Path,
        tokenizer_fingerprint: str,
    ) -> None:
        super().__init__(tokenizer_fingerprint)
        self.src, self.tgt, self.max_tokens, self.pad_to_multiple = src, tgt, max_tokens, pad_to_multiple
        self.bleu_lines, self.tokenizer_path = bleu_lines, tokenizer_path
        self.translations: Translations | None = None  # those of the last `evaluate` (None: no BLEU lines)

    def batches(self) -> list[np.ndarray]:
        return token_budget_batches(pair_sizes(self.src, self.tgt, self.pad_to_multiple), self.max_tokens, 0, 0)

    def forward(self, model: nn.Module, batch: np.ndarray, device: torch.device) -> tuple[Tensor, Tensor]:
        src, tgt_in, tgt = pair_rows(self.src, self.tgt, batch, self.pad_to_multiple)
        return model(src.to(device), tgt_in.to(device)), tgt.to(device)

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Loss, perplexity and accuracy; plus greedy BLEU on the first train.valid_bleu_lines pairs (whose
        translations are then in `self.translations`)."""
        metrics = super().evaluate(model, device)
        n = min(self.bleu_lines, len(self.src))
        if n:
            self.translations = self._greedy_translations(model, device, n)
            metrics["bleu"] = float(bleu_chrf(self.translations.hypotheses, self.translations.references)["bleu"])
        return metrics

    @torch.inference_mode()
    def _greedy_translations(self, model: nn.Module, device: torch.device, n: int) -> Translations:
        from tformer_cli.decoding.api import SearchSettings, translate_batch
        from tformer_cli.tokenizer import Tokenizer

        tokenizer = Tokenizer(self.tokenizer_path)
        settings = SearchSettings(static="never")  # greedy, outputs up to |source| + 50 tokens, the dynamic path
        hyps: list[str] = []
        for start in range(0, n, 32):
            src = pad_rows([self.src[i] for i in range(start, min(start + 32, n))]).to(device)
            found = translate_batch(cast("Seq2Seq", model), src, settings)  # pairs: a seq2seq
            hyps += [tokenizer.decode(best[0].tokens) for best in found]
        sources = [tokenizer.decode(self.src[i].tolist()) for i in range(n)]
        refs = [tokenizer.decode(self.tgt[i].tolist()) for i in range(n)]
        return Translations(sources, refs, hyps)


Validation = PatternValidation | SessionValidation | LMValidation | PairValidation


def validation_from(config: Config, data: Splits, split: str = "valid") -> Validation:
    """The validation set of `config`'s data as `read_splits` read it, reading nothing more: what a training
    task holds (make_task) and what `tformer eval` scores (`validation_set`), made one way for both (a closed
    set of kinds).

    Args:
        split: one of the kind's splits (the kinds table's `splits`): "valid"; generated sessions also "test".
    """
    known = DATA_KINDS.get(config.data.kind)
    if known is not None and split not in known.splits:  # a caller's bug: `tformer eval` refuses such a --split
        raise ValueError(f"data.kind={config.data.kind} has no {split!r} split")
    match config.data.kind:  # read_splits chose by data.kind too: the data of this kind
        case "pattern":
            generated = cast("PatternData", data)
            return PatternValidation(generated.valid_tokens, generated.valid_labels, config.data.pattern.n_classes)
        case "sessions":
            return SessionValidation(cast("dict[str, sessions.Sessions]", data)[split], config.data.sessions)
        case "text":
            text = cast(PreparedSplits, data)
            (stream,) = text.valid
            return LMValidation(stream.tokens, config.data.block_size, text.prepared.tokenizer_fingerprint)
        case "parallel":
            pairs = cast(PreparedSplits, data)
            (src, tgt), t, prepared = pairs.valid, config.train, pairs.prepared
            return PairValidation(
                src,
                tgt,
                t.max_tokens,
                t.pad_to_multiple,
                t.valid_bleu_lines,
                prepared.tokenizer_path,
                prepared.tokenizer_fingerprint,
            )
    raise ConfigError(f"unknown data.kind {config.data.kind!r}")


def validation_set(config: Config, split: str = "valid") -> Validation:
    """The `split` of `config`'s data ("valid"; "test" too for sessions), read here and made as training makes
    its own (`validation_from`): what `tformer eval` recomputes from a checkpoint alone.

    Raises:
        DataError: see `read_splits` (the training split's arrays are not opened).
    """
    return validation_from(config, read_splits(config.data, config.tokenizer, for_training=False), split)
