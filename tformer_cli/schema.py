"""Every recipe key, its type and its default: one frozen dataclass per recipe section.

The defaults are the paper's (Vaswani et al., 2017, base model) where the paper has one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class RunConfig:
    """run: where outputs go and how randomness is seeded."""

    name: str = "run"  # the run directory is out_dir/name
    out_dir: str = "runs"
    seed: int = 1
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int = 0  # CPU threads for torch; 0 leaves torch's default (all cores)


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
class DataConfig:
    """data: what to train on.

    `pattern` is generated from a seed. `text` (language modelling) and `parallel` (translation) are
    read by `tformer prepare` from local files (data.train / valid / test) when they are set, else
    from the Hugging Face hub (data.hub), tokenized, and written to data.dir.
    """

    kind: Literal["pattern", "text", "parallel"] = "parallel"
    pattern: PatternConfig = field(default_factory=PatternConfig)
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
    character_coverage: float = 1.0
    input_sentence_size: int = 2_000_000  # sentences sampled from a large corpus to train on
    # SentencePiece training threads. The model it learns depends on this number (measured: 1, 2, 4 and
    # 8 threads give four different models on the same text), so it is a setting of the recipe, not
    # the machine's core count: the same recipe gives the same tokenizer everywhere.
    threads: int = 1


@dataclass(frozen=True)
class ModelConfig:
    """model: the architecture (see tformer_cli/model/build.py for what each key does)."""

    kind: Literal["classifier", "lm", "seq2seq", "lstm"] = "seq2seq"  # lstm: recurrent LM baseline
    d_model: int = 512
    n_heads: int = 8
    n_kv_heads: int | None = None  # None: as many as n_heads; fewer: grouped-query attention
    n_layers: int = 6
    n_decoder_layers: int | None = None  # seq2seq: None means n_layers
    d_ff: int = 2048
    dropout: float = 0.1
    attn_dropout: float = 0.0  # on the attention weights
    activation_dropout: float = 0.0  # inside the FFN, after the activation (not in the paper)
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_placement: Literal["pre", "post"] = "post"
    ffn: Literal["relu", "gelu", "swiglu"] = "relu"
    pos: Literal["sinusoidal", "learned", "rope", "alibi", "none"] = "sinusoidal"
    max_len: int = 1024
    bias: bool = True
    pooling: Literal["mean", "first"] = "mean"
    tie_embeddings: bool = True
    share_all_embeddings: bool = False


@dataclass(frozen=True)
class TrainConfig:
    """train: optimisation, schedule, precision, validation and checkpointing."""

    optimizer: Literal["adam", "adamw"] = "adamw"
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
    max_minutes: float = 0.0  # stop after this much training time (resumes included); 0 = no limit.
    # The learning-rate schedule still runs over updates: set max_updates to what fits in the budget.
    batch_size: int = 64  # examples per batch (classifier), blocks per batch (lm)
    max_tokens: int = 4096  # seq2seq: tokens per batch including padding (fairseq's --max-tokens)
    update_freq: int = 1  # micro-batches accumulated per update (effective batch x update_freq x processes)
    clip_norm: float = 1.0  # 0 disables clipping
    label_smoothing: float = 0.0
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    log_every: int = 25  # updates between progress/metrics lines
    valid_every: int = 0  # updates between validations; 0 = at the end of every epoch
    best_metric: Literal["accuracy", "loss", "bleu"] = "accuracy"  # validation metric that picks best.pt
    valid_bleu_lines: int = 0  # seq2seq: greedy BLEU on this many validation pairs at each validation
    compile: bool = False  # torch.compile the model (falls back to eager with a warning)
    keep_last: int = 5  # step checkpoints kept (the paper averages the last 5)
    keep_best: int = 1  # best step checkpoints kept besides those
    patience: int = 0  # stop after this many validations without improvement; 0 = never
    max_nonfinite: int = 5  # stop after this many non-finite updates in a row (each is skipped)


@dataclass(frozen=True)
class DecodeConfig:
    """decode: how `translate` and `generate` search (overridable at inference: decode.beam=1)."""

    beam: int = 4  # 1 = greedy
    len_penalty: float = 0.6  # GNMT alpha: rank by logprob / ((5 + len) / 6) ** alpha
    max_len_a: float = 1.0  # output length limit a * source_length + b (the paper: +50)
    max_len_b: int = 50
    nbest: int = 1
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"  # weights' dtype at inference (fp16: CUDA only)
    max_tokens: int = 4096  # source tokens per translation batch (including padding)
    max_new_tokens: int = 200  # generate: tokens to add to the prompt
    temperature: float = 0.0  # generate: 0 = greedy
    top_k: int = 0  # generate: 0 = no top-k filter
    top_p: float = 1.0  # generate: nucleus threshold
    seed: int = 0  # generate: sampling seed


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
        """Every cross-field problem at once (an empty list when the recipe is consistent)."""
        m, t, d = self.model, self.train, self.data
        out: list[str] = []

        def need(ok: bool, message: str) -> None:
            if not ok:
                out.append(message)

        need(
            m.d_model > 0 and m.n_heads > 0 and m.d_model % m.n_heads == 0,
            f"model.d_model ({m.d_model}) must be a positive multiple of model.n_heads ({m.n_heads})",
        )
        if m.n_kv_heads is not None:
            need(
                m.n_kv_heads > 0 and m.n_heads % m.n_kv_heads == 0,
                f"model.n_heads ({m.n_heads}) must be a multiple of model.n_kv_heads ({m.n_kv_heads})",
            )
        if m.pos == "rope" and m.n_heads > 0:
            need((m.d_model // m.n_heads) % 2 == 0, "model.pos=rope needs an even head width d_model / n_heads")
        need(
            m.n_layers > 0 and m.d_ff > 0 and m.max_len > 0, "model.n_layers, model.d_ff and model.max_len must be > 0"
        )
        need(
            all(0.0 <= p < 1.0 for p in (m.dropout, m.attn_dropout, m.activation_dropout)),
            "model.dropout, attn_dropout and activation_dropout must be in [0, 1)",
        )
        need(t.lr > 0, f"train.lr must be > 0, got {t.lr}")
        need(t.warmup_steps >= 0 and t.epochs > 0, "train.warmup_steps must be >= 0 and train.epochs > 0")
        need(
            t.batch_size > 0 and t.max_tokens > 0 and t.update_freq > 0,
            "train.batch_size, max_tokens, update_freq must be > 0",
        )
        need(
            t.keep_last >= 1 and t.keep_best >= 0 and t.patience >= 0 and t.max_nonfinite >= 1,
            "train.keep_last >= 1, keep_best >= 0, patience >= 0, max_nonfinite >= 1",
        )
        need(0.0 <= t.label_smoothing < 1.0, "train.label_smoothing must be in [0, 1)")
        need(t.max_minutes >= 0, f"train.max_minutes must be >= 0 (0 = no limit), got {t.max_minutes}")
        dc = self.decode
        need(dc.beam >= 1 and 1 <= dc.nbest <= dc.beam, "decode.beam must be >= 1 and 1 <= decode.nbest <= decode.beam")
        need(
            dc.max_len_a >= 0 and dc.max_len_b >= 1 and dc.max_tokens > 0,
            "decode.max_len_b and decode.max_tokens must be > 0",
        )
        need(
            dc.temperature >= 0 and dc.top_k >= 0 and 0 < dc.top_p <= 1,
            "decode.temperature >= 0, top_k >= 0, 0 < top_p <= 1",
        )
        need(
            t.best_metric != "bleu" or (m.kind == "seq2seq" and t.valid_bleu_lines > 0),
            "train.best_metric=bleu needs model.kind=seq2seq and train.valid_bleu_lines > 0",
        )
        expected = {"pattern": ("classifier",), "text": ("lm", "lstm"), "parallel": ("seq2seq",)}[d.kind]
        need(m.kind in expected, f"data.kind={d.kind} trains model.kind={' or '.join(expected)}, not {m.kind}")
        if d.kind == "pattern":
            p = d.pattern
            need(0 < p.n_train < p.n_examples, "data.pattern.n_train must be between 0 and data.pattern.n_examples")
            need(0 < p.pattern_len <= p.seq_len, "data.pattern.pattern_len must be in 1..data.pattern.seq_len")
            need(p.vocab_size > 2 and p.n_classes > 1, "data.pattern.vocab_size must be > 2, n_classes > 1")
            need(m.max_len >= p.seq_len or m.pos != "learned", "model.max_len must cover data.pattern.seq_len")
        else:
            need(
                d.max_len > 0 and d.max_len_ratio >= 1.0 and d.block_size > 0,
                "data.max_len and data.block_size must be > 0, data.max_len_ratio >= 1",
            )
            need(self.tokenizer.vocab_size > 4, "tokenizer.vocab_size must be > 4 (pad, unk, bos, eos)")
            if d.kind == "parallel":
                need(d.src_lang != d.tgt_lang, "data.src_lang and data.tgt_lang must differ")
        return out
