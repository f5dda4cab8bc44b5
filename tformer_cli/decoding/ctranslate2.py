"""`tformer translate --engine ctranslate2`: the native engine's lines in and out, decoded by CTranslate2.

The model is the run's CTranslate2 export (export/ctranslate2.py `run_export`: built on first use into
the run directory, reused while the checkpoint is unchanged). The batches are the native engine's
(length-sorted, `decode.max_tokens` source tokens each), an empty line gets an empty output, and the
lines written are `format_output`'s. Each `decode.*` setting is mapped onto CTranslate2's
`translate_batch` so that the hypotheses are those of tformer's search (by decoding/rules.py's rules):

- beam: `beam_size` (1: CTranslate2's greedy search). CTranslate2's beam search follows the same rules for which
  continuations go on and which finish (decoding/rules.py, "Beam search").
- len_penalty: tformer ranks the finished hypotheses by logprob / ((5 + length) / 6) ** alpha (GNMT),
  CTranslate2 by logprob / length ** alpha. CTranslate2 runs with a length penalty of 1e-30 (RAW_SCORES):
  every score is divided by exactly 1.0 in float32, so its scores are raw log-probabilities, while its
  stopping rule stays tformer's (`beam` finished hypotheses; with 0 it would stop as soon as the best
  beam ends). The hypotheses it returns are ranked here with tformer's penalty.
- nbest: the best `nbest` of tformer's `beam` finished hypotheses. Both searches finish hypotheses in
  the same order (by length, then log-probability); where tformer stops at `beam`, CTranslate2 also
  keeps the others that end at the same last step and returns the `beam` best by log-probability, so
  an earlier, shorter one can be missing. The best one is never affected (a longer hypothesis with a
  higher log-probability outranks it when alpha >= 0); for nbest > 1 (or alpha < 0), a sentence where
  two of the returned hypotheses end at the last step is decoded again, returning every hypothesis
  finished before that step.
- max_len_a, max_len_b: tformer's limit is per sentence, a * source_length + b (EOS included); a
  CTranslate2 call has one `max_decoding_length`, the batch's largest limit. A sentence that reaches
  its own limit is ended as tformer ends it, with EOS as the limit-th token: greedy keeps its first
  limit - 1 tokens (exactly tformer's output); beam search is decoded again to limit - 1 tokens and
  its open hypotheses are ended with EOS. That is close to tformer, which also ends there the beams
  kept from below the best `beam` candidates of the step before (CTranslate2 does not return those).
  Hypotheses ended this way are scored by CTranslate2's `score_batch`. The limit is also capped at
  the export's positions (export/ctranslate2.py `position_limit`).
- PAD and BOS are never generated: `suppress_sequences`, which takes them out of the softmax, where
  tformer leaves them in it and only never picks them. Each token's log-probability is therefore
  higher by -log(1 - p(PAD) - p(BOS)), negligible once a model has learned never to predict them (a
  trained model), and visible in the scores of a barely trained one. EOS may come first (minimum
  length 0, unless decode.min_len), and sources are never truncated.
- min_len, no_repeat_ngram, repetition_penalty: `min_decoding_length` (CTranslate2 too bans EOS at the
  first min_len steps: min_len tokens before it), `no_repeat_ngram_size` and `repetition_penalty`. With
  greedy search they give tformer's tokens: CTranslate2 applies them to the logits, as tformer's greedy
  search does (and Hugging Face's), and the chosen token is the same (its score is not shown). With beam
  search they are refused (`check_controls`): CTranslate2 takes the banned tokens out of the softmax and
  penalises logits, where tformer's beam search, as Hugging Face's, bans and penalises log-probabilities
  (decoding/search.py), so the beams' scores, and the beams, differ exactly where a control acts.
- precision: fp32 only; CTranslate2's weight types are chosen with `--quantization`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tformer_cli.decoding.rules import Hypothesis, length_penalty
from tformer_cli.decoding.search import max_lengths
from tformer_cli.decoding.translate import length_sorted_batches
from tformer_cli.errors import TformerError
from tformer_cli.export.ctranslate2 import position_limit, run_export
from tformer_cli.export.ctranslate2_card import RAW_SCORES
from tformer_cli.export.folder import require
from tformer_cli.run import Run
from tformer_cli.schema import DecodeConfig
from tformer_cli.tokenizer import EOS_ID, Tokenizer

EOS, PAD, BOS = "</s>", "<pad>", "<s>"


class CT2Translator:
    """A CTranslate2 translator over a run's export, and what translating needs to know about that export."""

    def __init__(self, translator: Any, pieces: list[str], positions: int | None) -> None:
        self.translator = translator
        self.pieces = pieces  # the vocabulary, by id
        self.ids = {piece: i for i, piece in enumerate(pieces)}
        self.positions = positions  # the export's position limit (None: no limit)


def load_engine(
    run: Run, quantization: str | None, device: str, log: Callable[[str], None] | None = None
) -> CT2Translator:
    """The CTranslate2 engine of a seq2seq `run` (its fp32 weights, as `load_run(cast=False)` gives them).

    Args:
        run: the loaded run; its decode.* settings are the ones `translate_lines` is given.
        quantization: None (float32), int8, int8_float16 or float16: the export's weights.
        device: auto, cpu or cuda.
        log: told when the export is (re)built.

    Raises:
        TformerError: decode.precision other than fp32, a decoding control with beam search (`check_controls`),
            an unknown device or cuda where CTranslate2 has none, the `ctranslate2` package missing, or a model
            the export refuses.
    """
    check_controls(run.config.decode)
    if run.config.decode.precision not in ("fp32", "auto"):  # auto: fp32 weights here, --quantization picks
        raise TformerError(
            f"decode.precision={run.config.decode.precision} applies to --engine native; "
            "--engine ctranslate2 takes --quantization (int8, int8_float16 or float16)"
        )
    ctranslate2 = require("ctranslate2")
    target = _device(ctranslate2, device)
    folder = run_export(run, quantization, log)
    translator = ctranslate2.Translator(str(folder), device=target, intra_threads=torch.get_num_threads())
    assert run.tokenizer is not None  # a seq2seq run reads text: it has its tokenizer
    pieces = run.tokenizer.pieces(list(range(run.tokenizer.vocab_size)))
    return CT2Translator(translator, pieces, position_limit(run.config.model))


def _device(ctranslate2: Any, device: str) -> str:
    if device not in ("auto", "cpu", "cuda"):
        raise TformerError(f"run.device {device}: choose auto, cpu or cuda")
    cuda = ctranslate2.get_cuda_device_count() > 0
    if device == "cuda" and not cuda:
        raise TformerError("cuda asked for (run.device) but CTranslate2 sees no CUDA device; use cpu")
    return "cuda" if device == "auto" and cuda else "cpu" if device == "auto" else device


def check_controls(cfg: DecodeConfig) -> None:
    """The decoding controls CTranslate2 applies as tformer does: all three with greedy search, none with beam
    search (the module's docstring).

    Raises:
        TformerError: decode.min_len, decode.no_repeat_ngram or decode.repetition_penalty set with decode.beam > 1,
            in one line naming them.
    """
    if cfg.beam == 1:
        return
    keys = [
        f"{key} {value}"
        for key, value, off in (
            ("decode.min_len", cfg.min_len, 0),
            ("decode.no_repeat_ngram", cfg.no_repeat_ngram, 0),
            ("decode.repetition_penalty", cfg.repetition_penalty, 1.0),
        )
        if value != off
    ]
    if keys:
        raise TformerError(
            f"{', '.join(keys)} with beam search (decode.beam {cfg.beam}): CTranslate2 applies it before the softmax, "
            "tformer's beam search (as Hugging Face's) to the log-probabilities, so the beams would differ; "
            "translate with --engine native, or greedy (decode.beam=1)"
        )


def translate_lines(
    engine: CT2Translator,
    tokenizer: Tokenizer,
    lines: list[str],
    cfg: DecodeConfig,
    on_done: Callable[[int], None] | None = None,
) -> list[list[Hypothesis]]:
    """Translate `lines` as `decoding.translate.translate_lines` does; an empty line gets no hypothesis.
    on_done(n): told how many more lines are translated, after each batch (progress).

    Raises:
        TformerError: a decoding control with beam search (`check_controls`).
    """
    check_controls(cfg)
    pieces = [tokenizer.pieces(ids) for ids in tokenizer.encode(lines)]
    real = [i for i, line in enumerate(lines) if line.strip()]
    results: list[list[Hypothesis]] = [[] for _ in lines]
    if on_done is not None:
        on_done(len(lines) - len(real))
    for batch in length_sorted_batches([len(pieces[i]) + 1 for i in real], cfg.max_tokens):  # + 1: EOS
        index = [real[j] for j in batch]
        sources = [pieces[i] for i in index]
        for i, hyps in zip(index, _search(engine, sources, _limits(engine, sources, cfg), cfg), strict=True):
            results[i] = hyps
        if on_done is not None:
            on_done(len(index))
    return results


def _limits(engine: CT2Translator, sources: list[list[str]], cfg: DecodeConfig) -> list[int]:
    """tformer's output limits (search.max_lengths), capped at the export's positions.

    Raises:
        TformerError: a source longer than the export's positions.
    """
    lengths = torch.tensor([len(source) + 1 for source in sources])  # + 1: EOS
    if engine.positions is not None and int(lengths.max()) > engine.positions:
        raise TformerError(
            f"a source of {int(lengths.max())} tokens is longer than the {engine.positions} positions of the "
            "CTranslate2 export (model.max_len); translate it with --engine native"
        )
    src = (torch.arange(int(lengths.max()))[None, :] < lengths[:, None]).long()  # ones, then PAD (0)
    limits = max_lengths(src, cfg.max_len_a, cfg.max_len_b).tolist()
    return [min(limit, engine.positions) for limit in limits] if engine.positions is not None else limits


def _search(
    engine: CT2Translator, sources: list[list[str]], limits: list[int], cfg: DecodeConfig
) -> list[list[Hypothesis]]:
    """tformer's best `nbest` hypotheses for a batch: one CTranslate2 call, then what tformer would finish."""
    found = _decode(engine, sources, max(limits), cfg)
    if cfg.beam == 1:
        return [_greedy(engine, s, limit, hyps[0]) for s, limit, hyps in zip(sources, limits, found, strict=True)]
    at_limit = [j for j, hyps in enumerate(found) if not _ended_before(hyps, limits[j])]
    tied = [j for j, hyps in enumerate(found) if j not in at_limit and _tied(hyps, cfg)]
    finished = _untie(engine, sources, found, tied, cfg)
    for j in at_limit:
        finished[j] = _ended_at_limit(engine, sources[j], limits[j], cfg)
    return [_best(finished.get(j, hyps), cfg) for j, hyps in enumerate(found)]


def _greedy(engine: CT2Translator, source: list[str], limit: int, hyp: Hypothesis) -> list[Hypothesis]:
    """The greedy hypothesis, cut at the sentence's own limit as tformer cuts it."""
    if hyp.tokens[-1:] == [EOS_ID] and len(hyp.tokens) <= limit:  # at the limit: the EOS the limit forces
        return [hyp]
    return _with_eos(engine, source, [hyp.tokens[: limit - 1]])


def _last(hyps: list[Hypothesis]) -> int:
    return max(len(h.tokens) for h in hyps)


def _ended_before(hyps: list[Hypothesis], limit: int) -> bool:
    """Every hypothesis ended with EOS before the step where the limit would have ended them."""
    return all(h.tokens[-1:] == [EOS_ID] for h in hyps) and _last(hyps) < limit


def _tied(hyps: list[Hypothesis], cfg: DecodeConfig) -> bool:
    """Two returned hypotheses end at the last step, and a left-out earlier one could be in the n-best."""
    last = _last(hyps)
    return sum(len(h.tokens) == last for h in hyps) > 1 and (cfg.nbest > 1 or cfg.len_penalty < 0)


def _untie(
    engine: CT2Translator, sources: list[list[str]], found: list[list[Hypothesis]], tied: list[int], cfg: DecodeConfig
) -> dict[int, list[Hypothesis]]:
    """tformer's finished hypotheses of the tied sentences: all that ended before the last step (decoded
    again, every one kept), then the best (by log-probability) of those ending at it, up to `beam`.

    The latter are among CTranslate2's `beam` best: only hypotheses that ended earlier can be left out.
    """
    if not tied:
        return {}
    steps = [_last(found[j]) - 1 for j in tied]
    again = _decode(engine, [sources[j] for j in tied], max(steps), cfg, every=True)
    out = {}
    for j, step, hyps in zip(tied, steps, again, strict=True):
        early = [h for h in hyps if h.tokens[-1:] == [EOS_ID] and len(h.tokens) <= step]
        finals = _by_logprob([h for h in found[j] if len(h.tokens) == step + 1])
        out[j] = early + finals[: cfg.beam - len(early)]
    return out


def _ended_at_limit(engine: CT2Translator, source: list[str], limit: int, cfg: DecodeConfig) -> list[Hypothesis]:
    """A sentence at its limit: the hypotheses ended before it, then its open ones ended with EOS, best first."""
    before = _decode(engine, [source], limit - 1, cfg, every=True)[0] if limit > 1 else []
    early = [h for h in before if h.tokens[-1:] == [EOS_ID]]
    open_ = [h.tokens for h in before if h.tokens[-1:] != [EOS_ID]] if limit > 1 else [[]]
    return early + _by_logprob(_with_eos(engine, source, open_))[: cfg.beam - len(early)]


def _by_logprob(hyps: list[Hypothesis]) -> list[Hypothesis]:
    return sorted(hyps, key=lambda h: -h.logprob)


def _decode(
    engine: CT2Translator, sources: list[list[str]], max_length: int, cfg: DecodeConfig, every: bool = False
) -> list[list[Hypothesis]]:
    """CTranslate2's finished hypotheses per source, scored by raw log-probability, EOS included when reached.

    Args:
        every: False: the `beam` best (1 for greedy), the search stopping once `beam` have finished.
            True (beam search): every hypothesis finished within `max_length` steps, and the best
            `beam` continuations still open then.
    """
    patience = max_length + 1 if every else 1  # every: never `beam * patience` finished before the end
    results = engine.translator.translate_batch(
        sources,
        beam_size=cfg.beam,
        patience=patience,
        num_hypotheses=cfg.beam * patience,
        length_penalty=RAW_SCORES if cfg.beam > 1 else 0.0,
        max_decoding_length=max_length,
        min_decoding_length=min(cfg.min_len, max_length),  # the limit wins, as in tformer's search
        no_repeat_ngram_size=cfg.no_repeat_ngram,
        repetition_penalty=cfg.repetition_penalty,
        max_input_length=0,
        suppress_sequences=[[PAD], [BOS]],
        return_end_token=True,
        return_scores=True,
    )
    return [
        [
            Hypothesis([engine.ids[p] for p in tokens], score, score)
            for tokens, score in zip(r.hypotheses, r.scores, strict=True)
        ]
        for r in results
    ]


def _with_eos(engine: CT2Translator, source: list[str], bodies: list[list[int]]) -> list[Hypothesis]:
    """Each body followed by EOS, scored by CTranslate2 (the log-probabilities of its tokens, then of EOS)."""
    scored = engine.translator.score_batch(
        [source] * len(bodies), [[engine.pieces[t] for t in body] for body in bodies], max_input_length=0
    )
    return [
        Hypothesis(body + [EOS_ID], sum(s.log_probs), sum(s.log_probs)) for body, s in zip(bodies, scored, strict=True)
    ]


def _best(hyps: list[Hypothesis], cfg: DecodeConfig) -> list[Hypothesis]:
    """Greedy: the hypothesis, scored by its log-probability; beam: ranked with tformer's penalty, best nbest."""
    if cfg.beam == 1:
        return hyps[:1]
    ranked = [Hypothesis(h.tokens, h.logprob / length_penalty(len(h.tokens), cfg.len_penalty), h.logprob) for h in hyps]
    return sorted(ranked, key=lambda h: -h.score)[: cfg.nbest]
