"""The numbers a model is scored by: the token loss and its sums (`token_loss`, `Stats`: training and validation
alike), sacreBLEU BLEU, chrF and TER, and language-model perplexities (`tformer eval`).

BLEU, chrF and TER are computed by sacreBLEU on detokenized hypotheses against the raw references, and
always reported with their signatures, so that they can be compared with any paper that reports sacreBLEU.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from tformer_cli.model.lm import LanguageModel
from tformer_cli.tokenizer import PAD_ID


@dataclass
class Stats:
    """Sums over a stretch of batches (loss is summed per example/token so averages are exact).

    The sums may be 0-dim tensors on the model's device: training adds them up there and reads them
    (one host sync) only when it logs; `host()`, `loss` and `accuracy` give Python numbers.
    """

    loss_sum: float | Tensor = 0.0
    correct: int | Tensor = 0
    count: int | Tensor = 0

    def add(self, other: Stats) -> None:
        self.loss_sum += other.loss_sum
        self.correct += other.correct
        self.count += other.count

    def host(self) -> Stats:
        """The same sums as Python numbers (a host sync if they are on a GPU)."""
        return Stats(float(self.loss_sum), int(self.correct), int(self.count))

    @property
    def loss(self) -> float:
        return float(self.loss_sum) / max(int(self.count), 1)

    @property
    def accuracy(self) -> float:
        return int(self.correct) / max(int(self.count), 1)


def token_loss(logits: Tensor, targets: Tensor, smoothing: float) -> tuple[Tensor, Stats]:
    """Mean (label-smoothed) cross-entropy over non-padding target tokens, and its sums (0-dim tensors on
    the logits' device: no host sync).

    Args:
        logits: (B, T, V), any float dtype (the loss is taken in fp32).
        targets: (B, T) token ids, PAD_ID where there is no token.
        smoothing: label smoothing (0 for validation).
    """
    flat_logits, flat_targets = logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1)
    loss = F.cross_entropy(flat_logits, flat_targets, ignore_index=PAD_ID, label_smoothing=smoothing)
    real = flat_targets != PAD_ID
    correct = ((flat_logits.argmax(-1) == flat_targets) & real).sum()
    n = real.sum()
    return loss, Stats(loss.detach() * n, correct, n)


# Moses-style escapes and split punctuation that raw newstest text does not have.
_TOKENIZED = re.compile(r"&apos;|&quot;| @-@ | ' s\b|\w \.$| , | n't\b")


def looks_tokenized(lines: list[str]) -> bool:
    """True when many lines show Moses tokenization (a tokenized reference deflates BLEU comparisons)."""
    sample = [line for line in lines[:500] if line.strip()]
    hits = sum(bool(_TOKENIZED.search(line)) for line in sample)
    return bool(sample) and hits / len(sample) > 0.2


def bleu_chrf(hypotheses: list[str], references: list[str]) -> dict[str, float | str]:
    """sacreBLEU BLEU (13a tokenization, exp smoothing) and chrF2, with their signatures."""
    from sacrebleu.metrics import BLEU, CHRF

    bleu, chrf = BLEU(), CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": round(bleu_score.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "bleu_text": str(bleu_score),
        "chrf": round(chrf_score.score, 2),
        "chrf_signature": str(chrf.get_signature()),
    }


def ter(hypotheses: list[str], references: list[str]) -> dict[str, object]:
    """sacreBLEU's TER (translation edit rate, Snover et al., 2006: edits per reference word, in percent; lower
    is better), with its signature."""
    from sacrebleu.metrics import TER

    metric = TER()
    score = metric.corpus_score(hypotheses, [references])
    return {"ter": round(score.score, 2), "ter_signature": str(metric.get_signature())}


@dataclass(frozen=True)
class Perplexity:
    nll: float  # total negative log-likelihood (nats) over the scored tokens
    tokens: int  # scored subword tokens (including one end-of-line token per line)
    words: int  # whitespace words plus one end-of-line per line (the WikiText convention)
    bytes: int  # UTF-8 bytes of the text, one newline per line

    @property
    def per_token(self) -> float:
        return math.exp(self.nll / self.tokens)

    @property
    def per_word(self) -> float:
        return math.exp(self.nll / self.words)

    @property
    def bits_per_byte(self) -> float:
        return self.nll / math.log(2) / self.bytes


def count_words_and_bytes(lines: list[str]) -> tuple[int, int]:
    """Words as `line.split() + ['<eos>']` (PyTorch word_language_model), and UTF-8 bytes with newlines."""
    return sum(len(line.split()) + 1 for line in lines), sum(len(line.encode("utf-8")) + 1 for line in lines)


@torch.inference_mode()
def stream_nll(
    model: LanguageModel,
    stream: torch.Tensor,
    window: int,
    stride: int,
    batch: int = 8,
    on_scored: Callable[[int], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> tuple[float, int]:
    """Total NLL of stream[1:] given its prefix, scored window by window.

    Each window holds `window` + 1 tokens; windows start every `stride` tokens. The first window scores
    all its predictions; each later one scores only the predictions no earlier window scored (its last
    `stride` ones), keeping window - stride tokens of context. stride == window is block evaluation.
    `on_scored(n)`: told after each batch of windows how many more predictions are scored (progress).
    `stop()`: asked after each batch; True ends the scoring there, with the predictions scored so far (the
    first `count`, as a stream cut after them would give).
    """
    if not 0 < stride <= window:
        raise ValueError(f"stride must be in 1..{window}, got {stride}")
    model.eval()
    n_pred = stream.numel() - 1
    starts = list(range(0, max(n_pred - window, 0) + stride, stride))
    scored_upto, count = 0, 0
    device = next(model.parameters()).device
    total = torch.zeros((), dtype=torch.float64, device=device)  # summed on the device, read once
    for i in range(0, len(starts), batch):
        group = starts[i : i + batch]
        rows = [stream[s : s + window + 1] for s in group]
        width = max(r.numel() for r in rows)
        x = torch.zeros(len(rows), width, dtype=torch.long, device=stream.device)
        for j, r in enumerate(rows):
            x[j, : r.numel()] = r
        x = x.to(device)  # (n, width), one copy to the model's device
        hidden = model(x[:, :-1], head=False)  # (n, width - 1, D)
        scored, targets = [], []
        for j, s in enumerate(group):
            end = min(s + window, n_pred)  # predictions s .. end - 1 in this window
            first_new = max(scored_upto, s)
            if end > first_new:
                scored.append(hidden[j, first_new - s : end - s])
                targets.append(x[j, first_new - s + 1 : end - s + 1])
                count += end - first_new
                scored_upto = end
        if scored:  # the output projection of the scored positions only (a sliding window scores `stride`)
            logits = model.output(torch.cat(scored)).float()
            total += F.cross_entropy(logits, torch.cat(targets), reduction="sum").double()
        if on_scored is not None:
            on_scored(sum(t.numel() for t in targets))
        if stop is not None and stop():
            break
    return float(total), count
