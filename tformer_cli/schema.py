"""Every recipe key, its type and its default: one frozen dataclass per recipe section.

The `model:` section is the model's own settings, `ModelConfig` of `tformer_cli/model/spec.py`, so that the
architecture's settings and their types are written once. The defaults are the paper's (Vaswani et al.,
2017, base model) where the paper has one.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Literal

from tformer_cli.errors import ConfigError
from tformer_cli.kinds import DATA_KINDS, MODEL_KINDS
from tformer_cli.model.spec import ModelConfig


@dataclass(frozen=True)
class RunConfig:
    """run: where outputs go and how randomness is seeded."""

    name: str = "run"  # the run directory is out_dir/name
    out_dir: str = "runs"
    seed: int = 1
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int = 0  # CPU threads for torch; 0 leaves torch's default (all cores)
    # Deterministic kernels in training (train/reproducibility.py deterministic_kernels): a resumed run repeats a
    # straight one bit for bit on a GPU too, at some speed; on a CPU the kernels already are.
    deterministic: bool = False
    # Under torchrun (one process has no group): auto = NCCL on CUDA, gloo on the CPU; gloo on CUDA lets several
    # processes share one GPU (NCCL refuses two processes on the same GPU), e.g. to try DDP on a one-GPU machine.
    dist_backend: Literal["auto", "nccl", "gloo"] = "auto"
    # Where training's metrics go besides metrics.jsonl (train/tracking.py): tensorboard, mlflow, wandb (each an
    # optional extra), a list of them, or none; auto = tensorboard when its package is installed
    report_to: str | tuple[str, ...] = "auto"


@dataclass(frozen=True)
class PatternConfig:
    """data.pattern: the PatternSequence generator (data.kind: pattern)."""

    seed: int = 0
    n_examples: int = 10_000
    n_train: int = 8_000
    seq_len: int = 64
    vocab_size: int = 100
    n_classes: int = 10
    pattern_len: int = 5


@dataclass(frozen=True)
class SessionsConfig:
    """data.sessions: StreamRec's synthetic sessions (data.kind: sessions), chapter 10's generator.

    Items are ids 1..n_items (0 is padding). A session's first item is uniform; then, from the current
    item at position t (0-based), the next item is: with p_local, the current item + 1 (item n_items is
    followed by item 1); else, with p_long where t > long_after, a uniformly chosen earlier item of the
    session at least min_gap positions back; else a uniform item. See tformer_cli/data/sessions.py.
    """

    seed: int = 0
    n_sessions: int = 5_000  # train, then valid, then test
    n_valid: int = 500
    n_test: int = 500
    session_len: int = 20
    min_len: int | None = None  # None: every session is session_len long; else lengths uniform in min_len..session_len
    n_items: int = 1_000
    p_local: float = 0.4
    p_long: float = 0.3
    long_after: int = 3  # the long-range rule applies from the current position long_after + 1 on
    min_gap: int = 3  # a long-range item is at least this many positions before the current one


@dataclass(frozen=True)
class DataConfig:
    """data: what to train on.

    `pattern` and `sessions` are generated from a seed. `text` (language modelling) and `parallel`
    (translation) are read by `tformer prepare` from local files (data.train / valid / test) when they
    are set, else from the Hugging Face hub (data.hub), tokenized, and written to data.dir.
    """

    kind: Literal["pattern", "sessions", "text", "parallel"] = "parallel"
    pattern: PatternConfig = field(default_factory=PatternConfig)
    sessions: SessionsConfig = field(default_factory=SessionsConfig)
    dir: str = "data/prepared"  # where `prepare` writes and `train` reads
    hub: str | None = None  # a Hugging Face dataset name, e.g. wmt14 or wikitext
    hub_config: str | None = None  # e.g. de-en or wikitext-2-raw-v1
    hub_revision: str | None = None  # a commit or tag, for a reproducible download
    train_split: str = "train"
    valid_split: str = "validation"
    test_split: str = "test"
    # Local files. parallel: a prefix P read as P.<src_lang> and P.<tgt_lang> (plain or .gz), or a
    # .tsv/.jsonl file with src_field and tgt_field. text: a plain, .tsv or .jsonl file.
    # Each may be a list: its corpora are read one after the other, as one split.
    train: str | tuple[str, ...] | None = None
    valid: str | tuple[str, ...] | None = None
    test: str | tuple[str, ...] | None = None
    src_lang: str = "en"
    tgt_lang: str = "de"
    src_field: str | None = None  # default: translation.<src_lang> on the hub, <src_lang> in files
    tgt_field: str | None = None
    text_field: str = "text"
    max_len: int = 256  # parallel: pairs with a side longer than this many tokens are dropped (counted)
    max_len_ratio: float = 3.0  # parallel: pairs whose longer side is this many times the shorter are dropped
    block_size: int = 256  # text: tokens per training block (the stream is cut into block_size + 1)
    workers: int = 0  # processes for encoding; 0 = one per core


@dataclass(frozen=True)
class TokenizerConfig:
    """tokenizer: the SentencePiece model `prepare` trains (one joint model for translation)."""

    kind: Literal["bpe", "unigram"] = "bpe"
    vocab_size: int = 37_000  # the paper's joint BPE vocabulary is about 37k
    character_coverage: float = 1.0  # SentencePiece accepts 0.98 to 1
    input_sentence_size: int = 2_000_000  # sentences sampled from a large corpus to train on; 0 = all of them
    # SentencePiece training threads. The model it learns depends on this number (docs/benchmarks.md,
    # "Measurements behind the code's comments"), so it is a setting of the recipe, not the machine's core
    # count: the same recipe gives the same tokenizer everywhere.
    threads: int = 1


# model: the architecture, `ModelConfig` (imported above). Its keys, defaults and types are the model's own
# settings, written once in tformer_cli/model/spec.py (what build.py, Stack and Block take).


@dataclass(frozen=True)
class TrainConfig:
    """train: optimisation, schedule, precision, validation and checkpointing."""

    # muon: Muon on the Transformer blocks' weight matrices, AdamW (betas, eps) on the rest, one lr (train/muon.py)
    optimizer: Literal["adam", "adamw", "muon"] = "adamw"
    lr: float = 1e-3  # peak learning rate (inverse_sqrt: a multiplier of the paper's formula, see lr_scale)
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    weight_decay: float = 0.0
    decay_norms_biases_embeddings: bool = True  # false: weight decay on matrices of linear layers only
    schedule: Literal["inverse_sqrt", "cosine", "constant"] = "cosine"
    warmup_steps: int = 4000
    lr_scale: float = 1.0  # inverse_sqrt: lr = lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    min_lr_ratio: float = 0.0  # cosine: the floor as a fraction of lr
    epochs: int = 20
    max_updates: int | None = None  # stop after this many updates, whatever the epoch
    max_minutes: float = 0.0  # stop after this much time: setup (compile included) and resumes count; 0 = no limit.
    # The learning-rate schedule runs over updates (set max_updates to what fits in the budget), unless
    # fit_schedule_to_time (cosine): its decay past the warm-up then ends with whichever of max_updates and
    # max_minutes comes first, following the larger of the fractions of each spent (the time-budgeted schedules
    # of Izsak et al., 2021, and Geiping and Goldstein's Cramming, 2022): on a machine slower than the one
    # max_updates was set for, the learning rate still reaches its floor as the time runs out instead of
    # stopping high. The rate then depends on the clock: a resumed run goes on from the time it had spent,
    # not bit for bit as the straight run would have.
    fit_schedule_to_time: bool = False
    batch_size: int = 64  # examples per batch (classifier), blocks per batch (lm)
    max_tokens: int = 4096  # seq2seq: tokens per batch including padding (fairseq's --max-tokens)
    # seq2seq: source and target lengths of training and validation batches padded up to a multiple of this
    # (masked: the same loss and metrics; counted in max_tokens): fewer distinct batch shapes (what compiling
    # static shapes needs; train.compile's dynamic shapes do without), tensor-core-friendly sizes. 1: off
    pad_to_multiple: int = 1
    update_freq: int = 1  # micro-batches accumulated per update (effective batch x update_freq x processes)
    clip_norm: float = 1.0  # 0 disables clipping
    label_smoothing: float = 0.0
    # seq2seq with a bpe tokenizer: BPE-dropout (Provilkov et al., 2020) of the (source, target) side, each merge
    # skipped with this probability when the training pairs are segmented anew at every epoch (data/bpe_dropout.py;
    # one per side, as Marian's --sentencepiece-alphas); 0.1 in the paper. 0: that side keeps prepare's pieces
    bpe_dropout: tuple[float, float] = (0.0, 0.0)
    # text (lm): each epoch cuts the token stream into blocks at a new offset in [0, data.block_size) drawn from
    # (run.seed, epoch), so no block is seen twice alike (nanoGPT draws each block's start at random); false: the
    # same blocks every epoch
    shift_blocks: bool = False
    # lm/seq2seq: the output projection and the loss computed together this many target tokens at a time
    # (train/loss.py), so the batch's logits never exist whole (fp32 logits of 25k tokens x 37k: 3.7 GB).
    # Memory for speed; the same loss and gradients. 0: logits of the whole batch, then the loss
    loss_chunk: int = 0
    # bf16: autocast (fp32 weights); bf16-weights: a bf16 model, fp32 master weights in the optimizer (train/master.py);
    # auto: bf16 where the device multiplies bf16 natively, else fp32, chosen when the run starts (precision.py)
    precision: Literal["auto", "fp32", "bf16", "fp16", "bf16-weights"] = "fp32"
    log_every: int = 25  # updates between progress/metrics lines
    valid_every: int = 0  # updates between validations; 0 = at the end of every epoch
    # validation metric that picks best.pt; hit10 and mrr: sessions data (next-item ranking)
    best_metric: Literal["accuracy", "loss", "bleu", "hit10", "mrr"] = "accuracy"
    valid_bleu_lines: int = 0  # seq2seq: greedy BLEU on this many validation pairs at each validation
    compile: bool = False  # torch.compile the model with its loss (falls back to eager with a warning)
    keep_last: int = 5  # step checkpoints kept (the paper averages the last 5)
    keep_best: int = 1  # best step checkpoints kept besides those
    patience: int = 0  # stop after this many validations without improvement; 0 = never
    # a run folder or a checkpoint file: start from its model weights, with a new optimizer, schedule and update
    # count (nanoGPT init_from, fairseq --restore-file --reset-optimizer); null = random initialisation
    init_from: str | None = None
    max_nonfinite: int = 5  # stop after this many non-finite updates in a row (each is skipped)
    # > 0: an exponential moving average of the weights, updated after every update (train/ema.py), is what
    # validation scores and checkpoints hold as the model (Marian's --exponential-smoothing, fairseq's --ema-decay;
    # 0.999 averages over about the last thousand updates); 0 = off
    ema_decay: float = 0.0


HIGHER_IS_BETTER = ("accuracy", "bleu", "hit10", "mrr")  # the train.best_metric values to maximise


@dataclass(frozen=True)
class DecodeConfig:
    """decode: how `translate` and `generate` search (overridable at inference: decode.beam=1)."""

    beam: int = 4  # 1 = greedy
    len_penalty: float = 0.6  # GNMT alpha: rank by logprob / ((5 + len) / 6) ** alpha
    max_len_a: float = 1.0  # output length limit a * source_length + b (the paper: +50)
    max_len_b: int = 50
    nbest: int = 1
    # weights' dtype at inference (fp16: CUDA only); auto: bf16 where the device runs it natively, else fp32
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "fp32"
    max_tokens: int = 4096  # source tokens per translation batch (including padding)
    max_new_tokens: int = 200  # generate: tokens to add to the prompt
    temperature: float = 0.0  # generate: 0 = greedy
    top_k: int = 0  # generate: 0 = no top-k filter
    top_p: float = 1.0  # generate: nucleus threshold
    seed: int = 0  # generate: sampling seed
    samples: int = 1  # generate: outputs per prompt (nanoGPT num_samples, HF num_return_sequences)
    min_len: int = 0  # no end of sequence before this many new tokens (fairseq --min-len, HF min_new_tokens)
    no_repeat_ngram: int = 0  # no n-gram of this size twice in one output; 0 = off (HF no_repeat_ngram_size)
    repetition_penalty: float = 1.0  # a token already in the sequence: logit / p if > 0 else * p; 1 = off (HF, CTRL)
    static: Literal["auto", "always", "never"] = "auto"  # fixed-shape decoding with CUDA graphs: auto = on CUDA


@dataclass(frozen=True)
class Config:
    """The whole recipe."""

    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def problems(self) -> list[str]:
        """Every range and cross-field problem at once (an empty list when the recipe is consistent)."""
        m, t, d = self.model, self.train, self.data
        out = [
            *_run_problems(self.run),
            *_data_problems(d),
            *_tokenizer_problems(self.tokenizer),
            *_model_problems(m),
            *_train_problems(t),
            *_decode_problems(self.decode),
        ]
        if t.best_metric == "bleu" and not (MODEL_KINDS[m.kind].has_source and t.valid_bleu_lines > 0):
            out.append("train.best_metric=bleu needs model.kind=seq2seq and train.valid_bleu_lines > 0")
        if t.loss_chunk and not MODEL_KINDS[m.kind].predicts_tokens:
            out.append("train.loss_chunk needs a token-predicting model (lm, lstm, seq2seq); leave it 0 for classifier")
        if t.best_metric in ("hit10", "mrr") and t.best_metric not in DATA_KINDS[d.kind].metrics:
            out.append(f"train.best_metric={t.best_metric} needs data.kind=sessions (next-item ranking)")
        if any(t.bpe_dropout) and not (DATA_KINDS[d.kind].paired and self.tokenizer.kind == "bpe"):
            out.append("train.bpe_dropout needs data.kind=parallel and tokenizer.kind=bpe; leave it [0, 0] otherwise")
        if t.optimizer == "muon" and not MODEL_KINDS[m.kind].attention:
            out.append(f"train.optimizer=muon steps a Transformer's block matrices; model.kind={m.kind} has none")
        if t.fit_schedule_to_time and not (t.max_minutes and t.schedule == "cosine"):
            out.append(
                "train.fit_schedule_to_time needs train.max_minutes > 0 and train.schedule=cosine (the time to fit, "
                f"a schedule with an end), got max_minutes {t.max_minutes:g} and schedule {t.schedule}"
            )
        if t.shift_blocks and d.kind != "text":
            out.append("train.shift_blocks needs data.kind=text (a language model's token stream); leave it false")
        expected = DATA_KINDS[d.kind].models
        if m.kind not in expected:
            out.append(f"data.kind={d.kind} trains model.kind={' or '.join(expected)}, not {m.kind}")
        row, setting = row_length(self)
        limit = position_limit(m)
        if not DATA_KINDS[d.kind].paired and limit is not None and limit < row:  # pairs: their task checks them
            out.append(f"model.max_len must cover {setting.strip('()')} ({row}), got {m.max_len}")
        return out


# ---------------------------------------------------------------- the checks of each section
# A range is written as it reads in the message: ">= 1", "> 0", "in [0, 1)" (brackets as in maths),
# alternatives joined by " or " ("null or >= 1"), or "finite". Every float must also be finite.

_SEED = "in [0, 4294967295]"  # numpy refuses negative seeds; torch's 64 bits must hold run.seed * 100_003 + epoch

# Upper bounds: every count a user can type is one a machine can serve, so that a typo (an extra zero, 1e20)
# is refused in one line instead of forking, allocating or looping until the OS steps in. They are generous;
# whether a model and its batch fit the machine is `budget.py`'s question, asked before anything is allocated.
_CORES = 1024  # threads and worker processes: more than the cores of any one machine today
_LENGTH = 131_072  # tokens of one sequence (2^17: the longest contexts of today's open models, 128k)
_VOCAB = 1_048_576  # vocabulary entries and classes (2^20: four times the largest vocabularies in use, 256k)
_WIDTH = 65_536  # d_model and d_ff (d_ff 4 x 16384): past the widest published Transformers
_DEPTH = 1024  # layers and heads per side: ten times the deepest published Transformers
_COUNT = 100_000_000  # generated examples or sessions, validation lines (each is held in memory)
_STEPS = 1_000_000_000  # updates, epochs and intervals: more than any run can take
_TOKENS = 16_777_216  # tokens per batch (2^24): 25k is the paper's; 16M is a whole cluster's batch
_GENERATED = 1_073_741_824  # tokens of a generated data set (2^30), held in memory as int64: 8 GiB


def _run_problems(r: RunConfig) -> list[str]:
    out = _outside(("run.seed", r.seed, _SEED), ("run.threads", r.threads, f"in [0, {_CORES}]"))
    if not r.name.strip() or r.name in (".", "..") or any(c in r.name for c in "/\\\0"):
        out.append(f"run.name must be one folder name (not empty, '.' or '..', no '/' or '\\'), got {r.name!r}")
    if not r.out_dir.strip() or "\0" in r.out_dir:
        out.append(f"run.out_dir must be a folder (not empty), got {r.out_dir!r}")
    return out + _report_to_problems(r.report_to)


_REPORT_TO = ("auto", "none", "tensorboard", "mlflow", "wandb")  # train/tracking.py SETTINGS


def _report_to_problems(setting: str | tuple[str, ...]) -> list[str]:
    """run.report_to: one of _REPORT_TO, or a list of the backends (a "did you mean" for a typo)."""
    names = (setting,) if isinstance(setting, str) else setting
    allowed = _REPORT_TO if isinstance(setting, str) else _REPORT_TO[2:]
    for name in names:
        if name not in allowed:
            close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            takes = "auto, none, tensorboard, mlflow or wandb, or a list" if isinstance(setting, str) else "a list"
            return [f"run.report_to takes {takes} of tensorboard, mlflow and wandb, got {name!r}{hint}"]
    return []


def _data_problems(d: DataConfig) -> list[str]:
    out = _outside(
        ("data.max_len", d.max_len, f"in [2, {_LENGTH:_}]"),  # a token and the end of sentence
        ("data.max_len_ratio", d.max_len_ratio, ">= 1"),
        ("data.block_size", d.block_size, f"in [1, {_LENGTH:_}]"),
        ("data.workers", d.workers, f"in [0, {_CORES}]"),
    )
    if not d.dir.strip() or "\0" in d.dir or PurePath(d.dir).name in ("", ".."):  # prepare replaces that folder
        out.append(f"data.dir must name a folder (not empty, '.', '..' or '/'), got {d.dir!r}")
    if DATA_KINDS[d.kind].paired and d.src_lang == d.tgt_lang:
        out.append(f"data.src_lang and data.tgt_lang must differ, got {d.src_lang!r} for both")
    return out + _pattern_problems(d.pattern) + _sessions_problems(d.sessions)


def _pattern_problems(p: PatternConfig) -> list[str]:
    out = _outside(
        ("data.pattern.seed", p.seed, _SEED),
        ("data.pattern.n_examples", p.n_examples, f"in [2, {_COUNT:_}]"),
        ("data.pattern.n_train", p.n_train, f"in [1, {_COUNT:_}]"),
        ("data.pattern.seq_len", p.seq_len, f"in [1, {_LENGTH:_}]"),
        # ids 0 and 1 are reserved: two ordinary tokens at least
        ("data.pattern.vocab_size", p.vocab_size, f"in [4, {_VOCAB:_}]"),
        ("data.pattern.n_classes", p.n_classes, f"in [2, {_VOCAB:_}]"),
        ("data.pattern.pattern_len", p.pattern_len, f"in [1, {_LENGTH:_}]"),
    )
    if out:
        return out
    if p.n_train >= p.n_examples:
        out.append(f"data.pattern.n_train must be < data.pattern.n_examples ({p.n_examples}), got {p.n_train}")
    if p.n_examples * p.seq_len > _GENERATED:
        out.append(
            f"data.pattern.n_examples x data.pattern.seq_len must be <= {_GENERATED:_} (generated tokens, held in "
            f"memory), got {p.n_examples:_} x {p.seq_len:_}"
        )
    if p.pattern_len > p.seq_len:
        out.append(f"data.pattern.pattern_len must be <= data.pattern.seq_len ({p.seq_len}), got {p.pattern_len}")
    # the generator draws n_classes distinct patterns and would loop forever if there are fewer; the
    # capped exponent keeps the number small and changes nothing (2 ** bit_length > n_classes)
    n_patterns = (p.vocab_size - 2) ** min(p.pattern_len, p.n_classes.bit_length())
    if n_patterns < p.n_classes:
        out.append(
            f"data.pattern.n_classes must be <= {n_patterns} (the distinct patterns of data.pattern.pattern_len "
            f"tokens out of data.pattern.vocab_size - 2), got {p.n_classes}"
        )
    return out


def _sessions_problems(s: SessionsConfig) -> list[str]:
    out = _outside(
        ("data.sessions.seed", s.seed, _SEED),
        # a training, a validation and a test session
        ("data.sessions.n_sessions", s.n_sessions, f"in [3, {_COUNT:_}]"),
        ("data.sessions.n_valid", s.n_valid, f"in [1, {_COUNT:_}]"),
        ("data.sessions.n_test", s.n_test, f"in [1, {_COUNT:_}]"),
        ("data.sessions.session_len", s.session_len, f"in [2, {_LENGTH:_}]"),  # an item and its next item
        ("data.sessions.min_len", s.min_len, f"null or in [2, {_LENGTH:_}]"),
        ("data.sessions.n_items", s.n_items, f"in [2, {_VOCAB - 1:_}]"),  # + 1: padding
        ("data.sessions.p_local", s.p_local, "in [0, 1]"),
        ("data.sessions.p_long", s.p_long, "in [0, 1]"),
        ("data.sessions.long_after", s.long_after, f"in [0, {_LENGTH:_}]"),
        ("data.sessions.min_gap", s.min_gap, f"in [1, {_LENGTH:_}]"),
    )
    if out:
        return out
    if s.n_valid + s.n_test >= s.n_sessions:
        out.append(
            f"data.sessions.n_sessions must be > data.sessions.n_valid + data.sessions.n_test "
            f"({s.n_valid + s.n_test}, so that some sessions are left to train on), got {s.n_sessions}"
        )
    if s.n_sessions * s.session_len > _GENERATED:
        out.append(
            f"data.sessions.n_sessions x data.sessions.session_len must be <= {_GENERATED:_} (generated items, held "
            f"in memory), got {s.n_sessions:_} x {s.session_len:_}"
        )
    if s.min_len is not None and s.min_len > s.session_len:
        out.append(f"data.sessions.min_len must be <= data.sessions.session_len ({s.session_len}), got {s.min_len}")
    return out


def _tokenizer_problems(tk: TokenizerConfig) -> list[str]:
    # the ranges SentencePiece checks itself, here so that `check` finds them before the corpus is read
    return _outside(
        ("tokenizer.vocab_size", tk.vocab_size, f"in [5, {_VOCAB:_}]"),  # pad, unk, bos, eos and one piece
        ("tokenizer.character_coverage", tk.character_coverage, "in [0.98, 1]"),
        ("tokenizer.input_sentence_size", tk.input_sentence_size, f"0 or in (100, {_COUNT * 10:_}]"),
        ("tokenizer.threads", tk.threads, f"in [1, {_CORES}]"),
    )


def _model_problems(m: ModelConfig) -> list[str]:
    out = _outside(
        ("model.d_model", m.d_model, f"in [1, {_WIDTH:_}]"),
        ("model.n_heads", m.n_heads, f"in [1, {_DEPTH}]"),
        ("model.n_kv_heads", m.n_kv_heads, f"null or in [1, {_DEPTH}]"),
        ("model.n_layers", m.n_layers, f"in [1, {_DEPTH}]"),
        ("model.n_decoder_layers", m.n_decoder_layers, f"null or in [1, {_DEPTH}]"),
        ("model.d_ff", m.d_ff, f"in [1, {_WIDTH * 4:_}]"),
        ("model.dropout", m.dropout, "in [0, 1)"),
        ("model.attn_dropout", m.attn_dropout, "in [0, 1)"),
        ("model.activation_dropout", m.activation_dropout, "in [0, 1)"),
        ("model.max_len", m.max_len, f"in [1, {_LENGTH:_}]"),
    )
    if m.d_model < 1 or m.n_heads < 1:
        return out
    if m.d_model % m.n_heads:
        out.append(f"model.d_model ({m.d_model}) must be a multiple of model.n_heads ({m.n_heads})")
    elif m.pos == "rope" and (m.d_model // m.n_heads) % 2:
        out.append(f"model.pos=rope needs an even head width d_model / n_heads, got {m.d_model // m.n_heads}")
    if m.n_kv_heads is not None and m.n_kv_heads >= 1 and m.n_heads % m.n_kv_heads:
        out.append(f"model.n_heads ({m.n_heads}) must be a multiple of model.n_kv_heads ({m.n_kv_heads})")
    return out + _attention_score_problems(m)


def _attention_score_problems(m: ModelConfig) -> list[str]:
    if m.attention_score == "scaled_dot":
        return []
    if not MODEL_KINDS[m.kind].attention:
        return [f"model.attention_score={m.attention_score}: model.kind=lstm has no attention (leave it scaled_dot)"]
    if m.pos == "rope" and m.attention_score in ("general", "additive"):
        return [
            f"model.attention_score={m.attention_score} with model.pos=rope: RoPE rotates q and k so that their dot "
            "product depends on relative position only, and this score is not their dot product "
            "(use attention_score scaled_dot or dot, or another model.pos)"
        ]
    return []


def _train_problems(t: TrainConfig) -> list[str]:
    return _outside(
        ("train.lr", t.lr, "> 0"),
        ("train.betas", t.betas, "in [0, 1)"),
        ("train.eps", t.eps, "> 0"),
        ("train.weight_decay", t.weight_decay, ">= 0"),
        ("train.warmup_steps", t.warmup_steps, f"in [0, {_STEPS:_}]"),
        ("train.lr_scale", t.lr_scale, "> 0"),
        ("train.min_lr_ratio", t.min_lr_ratio, "in [0, 1]"),
        ("train.epochs", t.epochs, f"in [1, {_STEPS:_}]"),
        ("train.max_updates", t.max_updates, f"null or in [1, {_STEPS:_}]"),
        ("train.max_minutes", t.max_minutes, "in [0, 5_256_000]"),  # ten years
        ("train.batch_size", t.batch_size, f"in [1, {_TOKENS:_}]"),
        ("train.max_tokens", t.max_tokens, f"in [1, {_TOKENS:_}]"),
        ("train.pad_to_multiple", t.pad_to_multiple, f"in [1, {_LENGTH:_}]"),
        ("train.update_freq", t.update_freq, "in [1, 65536]"),
        ("train.clip_norm", t.clip_norm, ">= 0"),
        ("train.label_smoothing", t.label_smoothing, "in [0, 1)"),
        ("train.bpe_dropout", t.bpe_dropout, "in [0, 1)"),
        ("train.loss_chunk", t.loss_chunk, f"in [0, {_TOKENS:_}]"),
        ("train.log_every", t.log_every, f"in [1, {_STEPS:_}]"),
        ("train.valid_every", t.valid_every, f"in [0, {_STEPS:_}]"),
        ("train.valid_bleu_lines", t.valid_bleu_lines, f"in [0, {_COUNT:_}]"),
        ("train.keep_last", t.keep_last, "in [1, 10000]"),  # checkpoints on disk
        ("train.keep_best", t.keep_best, "in [0, 10000]"),
        ("train.patience", t.patience, f"in [0, {_STEPS:_}]"),
        ("train.max_nonfinite", t.max_nonfinite, f"in [1, {_STEPS:_}]"),
        ("train.ema_decay", t.ema_decay, "in [0, 1)"),
    )


def _decode_problems(dc: DecodeConfig) -> list[str]:
    out = _outside(
        ("decode.beam", dc.beam, "in [1, 1024]"),  # hypotheses per sentence, each a cache
        ("decode.len_penalty", dc.len_penalty, "finite"),  # < 0 favours short outputs: odd, not wrong
        ("decode.max_len_a", dc.max_len_a, "in [0, 1000]"),
        ("decode.max_len_b", dc.max_len_b, f"in [1, {_LENGTH:_}]"),
        ("decode.nbest", dc.nbest, "in [1, 1024]"),
        ("decode.max_tokens", dc.max_tokens, f"in [1, {_TOKENS:_}]"),
        ("decode.max_new_tokens", dc.max_new_tokens, f"in [1, {_LENGTH:_}]"),
        ("decode.temperature", dc.temperature, ">= 0"),
        ("decode.top_k", dc.top_k, f"in [0, {_VOCAB:_}]"),
        ("decode.top_p", dc.top_p, "in (0, 1]"),
        ("decode.seed", dc.seed, _SEED),
        ("decode.samples", dc.samples, "in [1, 1024]"),  # each a row of the batch
        ("decode.min_len", dc.min_len, f"in [0, {_LENGTH:_}]"),
        ("decode.no_repeat_ngram", dc.no_repeat_ngram, f"in [0, {_LENGTH:_}]"),
        ("decode.repetition_penalty", dc.repetition_penalty, "> 0"),
    )
    if dc.nbest > dc.beam >= 1:
        out.append(f"decode.nbest must be <= decode.beam ({dc.beam}), got {dc.nbest}")
    return out


def check_samples(cfg: DecodeConfig) -> None:
    """decode.samples > 1 needs sampling: greedy decoding (temperature 0, or top_k 1: decoding's `sample_next`
    takes the argmax) gives the same output every time. Checked where samples are drawn (`tformer generate`, the
    Hugging Face export's generation config), not among a recipe's problems: decode.samples is read there alone,
    and a run trained with it set still loads for every other command.

    Raises:
        ConfigError: samples > 1 with greedy decoding, in one line naming the keys.
    """
    if cfg.samples > 1 and (cfg.temperature <= 0.0 or cfg.top_k == 1):
        greedy = f"decode.temperature {cfg.temperature}" if cfg.temperature <= 0.0 else "decode.top_k 1"
        raise ConfigError(
            f"decode.samples {cfg.samples} with greedy decoding ({greedy}) gives {cfg.samples} identical outputs: "
            "sample (e.g. decode.temperature=0.8) or set decode.samples=1"
        )


# ---------------------------------------------------------------- ranges


def _outside(*checks: tuple[str, Any, str]) -> list[str]:
    """`key must be <range>, got <value>` for each (key, value, range) whose value is outside its range."""
    out = []
    for key, value, allowed in checks:
        if not _within(value, allowed):
            shown = list(value) if isinstance(value, tuple) else value
            each = " each" if isinstance(value, tuple) else ""
            finite = "finite and " if _non_finite(value) and allowed != "finite" else ""
            out.append(f"{key} must be {finite}{allowed}{each}, got {shown}")
    return out


def _non_finite(value: Any) -> bool:
    items = value if isinstance(value, tuple) else (value,)
    return any(isinstance(v, float) and not math.isfinite(v) for v in items)


def _within(value: Any, allowed: str) -> bool:
    """Whether `value` (a number, None, or a tuple of numbers: each) lies in `allowed` (see above)."""
    if isinstance(value, tuple):
        return all(_within(v, allowed) for v in value)
    if _non_finite(value):
        return False
    return any(_within_one(value, alternative) for alternative in allowed.split(" or "))


def _within_one(value: float | None, allowed: str) -> bool:
    if allowed == "null" or value is None:
        return allowed == "null" and value is None
    if allowed == "finite":
        return True
    if allowed.startswith("in "):
        low, high = (float(bound) for bound in allowed[4:-1].split(","))
        above = value >= low if allowed[3] == "[" else value > low
        below = value <= high if allowed[-1] == "]" else value < high
        return above and below
    if allowed.startswith(">"):
        op, bound = allowed.split()
        return value >= float(bound) if op == ">=" else value > float(bound)
    return value == float(allowed)


def config_to_dict(config: Config) -> dict[str, Any]:
    """Plain nested dicts and lists (YAML- and `weights_only`-safe)."""

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return plain(dataclasses.asdict(config))


# ---------------------------------------------------------------- what a recipe's data gives the model


def vocabulary(config: Config, vocab_size: int | None = None) -> tuple[int, int]:
    """(vocabulary, classes) of the model a recipe trains (the kinds table's `vocabulary` names what sets it):
    pattern data its tokens and classes from data.pattern, sessions data n_items + 1 (item k is token k; 0 is
    padding), prepared data `vocab_size` (the prepared tokenizer's), or tokenizer.vocab_size (what `prepare`
    trains) when None."""
    d = config.data
    match d.kind:  # each kind's own settings, by its own rule: the one place that computes them
        case "pattern":
            return d.pattern.vocab_size, d.pattern.n_classes
        case "sessions":
            return d.sessions.n_items + 1, 0
        case _:  # text, parallel
            return (config.tokenizer.vocab_size if vocab_size is None else vocab_size), 0


def position_limit(model: ModelConfig) -> int | None:
    """The longest sequence the model's positions can take: model.max_len for a learned table; None where there
    is no limit (sinusoidal positions extend past their precomputed table; rope, alibi and the LSTM have none)."""
    return model.max_len if model.pos == "learned" and MODEL_KINDS[model.kind].attention else None


def row_length(config: Config) -> tuple[int, str]:
    """(tokens of a training row's input, the setting that makes it) of a recipe's data."""
    d = config.data
    match d.kind:  # each kind's own setting, by its own rule: the one place that computes it
        case "pattern":
            return d.pattern.seq_len, "data.pattern.seq_len"
        case "sessions":  # a session's last item is only a target
            return d.sessions.session_len - 1, "(data.sessions.session_len - 1)"
        case "parallel":
            return d.max_len, "data.max_len"
        case _:  # text
            return d.block_size, "data.block_size"
