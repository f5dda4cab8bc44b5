"""What each kind of data and model can do: one table, read by every place that asks.

A recipe's `data.kind` decides the model kinds it trains, the training task (train/tasks.py), what it reads
(its recipe keys; generated from its own section, or `tformer prepare`'s arrays read with a tokenizer), the
splits `tformer eval` scores, and which commands serve a run of it. Each command that reads text asks
`refusal` here instead of matching kinds itself (through `run.check_served`); the builders keep one explicit
choice of their class each: the model's (model/build.py), and a kind's data (data/splits.py), validation set
(validation.py) and training task (train/tasks.py).

This module imports nothing of tformer's (and no torch): the recipe's checks (schema.py) read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Command = Literal[
    "eval --src", "perplexity", "translate", "score", "generate", "attention --text", "attention --example"
]

READS_NO_TEXT = "it reads no text (`tformer eval` scores it, `tformer attention --example N` shows its attention)"
_SCORES_PAIRS = "scoring pairs needs a translation model (`tformer perplexity` scores text)"
_USE_GENERATE = "use `tformer generate`"
_SHOW_TEXT = "give the sentence to show with --text"
_ITEM_IDS = "it reads item ids, not text (`tformer eval` scores it)"
_SHOW_SESSION = "it reads item ids, not text: show a validation session with --example N"


@dataclass(frozen=True)
class DataKind:
    """One row of the table: what a `data.kind` trains, reads and is served by.

    Attributes:
        models: the model kinds it trains (schema.py refuses others).
        task: the training task's class in train/tasks.py.
        generated: made from its recipe section when training starts (token ids, no tokenizer, nothing to
            prepare); else `tformer prepare` encodes it into data.dir with a SentencePiece tokenizer.
        keys: the `data.` keys it reads (those of local files or the hub come on top for prepared data).
        sides: the token arrays of each prepared split (none for generated data); ("src", "tgt"): `paired`.
        vocabulary: what sets the model's vocabulary (and classes), as messages name it (schema.py's `vocabulary`
            computes it).
        splits: what `tformer eval --split` scores.
        metrics: what validation scores (train.best_metric picks one).
        batch: the setting that sizes a training batch.
        serves: the commands beyond train and eval that serve a run of it.
        refusals: the reason a text-reading command gives a run of it instead (`refusal`).
    """

    models: tuple[str, ...]
    task: str
    generated: bool
    keys: tuple[str, ...]
    sides: tuple[str, ...]
    vocabulary: str
    splits: tuple[str, ...]
    metrics: tuple[str, ...]
    batch: str
    serves: tuple[Command, ...]
    refusals: dict[Command, str]

    @property
    def paired(self) -> bool:
        """Its examples are (source, target) pairs: two files or two fields each, the training pairs filtered by
        data.max_len and data.max_len_ratio; else one text each."""
        return self.sides == ("src", "tgt")


_PREPARED = ("kind", "dir", "workers")  # what text and parallel data both read

DATA_KINDS: dict[str, DataKind] = {
    "pattern": DataKind(
        models=("classifier",),
        task="ClassifierTask",
        generated=True,
        keys=("kind", "pattern"),
        sides=(),
        vocabulary="data.pattern.vocab_size and n_classes",
        splits=("valid",),
        metrics=("loss", "accuracy"),
        batch="train.batch_size",
        serves=("attention --example",),
        refusals={
            "eval --src": READS_NO_TEXT,
            "perplexity": READS_NO_TEXT,
            "translate": READS_NO_TEXT,
            "score": READS_NO_TEXT,
            "generate": READS_NO_TEXT,
            "attention --text": READS_NO_TEXT,
        },
    ),
    "sessions": DataKind(
        models=("lm", "lstm"),
        task="SessionTask",
        generated=True,
        keys=("kind", "sessions"),
        sides=(),
        vocabulary="data.sessions.n_items",
        splits=("valid", "test"),
        metrics=("loss", "ppl", "accuracy", "hit10", "mrr"),
        batch="train.batch_size",
        serves=("attention --example",),
        refusals={
            "eval --src": _ITEM_IDS,
            "perplexity": _ITEM_IDS,
            "translate": _ITEM_IDS,
            "score": _ITEM_IDS,
            "generate": _ITEM_IDS,
            "attention --text": _SHOW_SESSION,
        },
    ),
    "text": DataKind(
        models=("lm", "lstm"),
        task="LMTask",
        generated=False,
        keys=(*_PREPARED, "text_field", "block_size"),
        sides=("text",),
        vocabulary="the tokenizer",
        splits=("valid",),
        metrics=("loss", "ppl", "accuracy"),
        batch="train.batch_size",
        serves=("perplexity", "generate", "attention --text"),
        refusals={
            "eval --src": "--src/--ref need seq2seq",
            "translate": _USE_GENERATE,
            "score": _SCORES_PAIRS,
            "attention --example": _SHOW_TEXT,
        },
    ),
    "parallel": DataKind(
        models=("seq2seq",),
        task="Seq2SeqTask",
        generated=False,
        keys=(*_PREPARED, "src_lang", "tgt_lang", "src_field", "tgt_field", "max_len", "max_len_ratio"),
        sides=("src", "tgt"),
        vocabulary="the tokenizer",
        splits=("valid",),
        metrics=("loss", "ppl", "accuracy", "bleu"),
        batch="train.max_tokens",
        serves=("eval --src", "translate", "score", "attention --text"),
        refusals={
            "perplexity": "perplexity needs a language model",
            "generate": "use `tformer translate`",
            "attention --example": _SHOW_TEXT,
        },
    ),
}


@dataclass(frozen=True)
class ModelKind:
    """What a `model.kind` is, as messages name it and as the checks and counts ask.

    Attributes:
        name: how a refusal names a run of it ("a classifier").
        predicts_tokens: its output is a distribution over the vocabulary (all but the classifier).
        attention: it has attention layers (and positions that a table may limit): all but the LSTM.
        stacks: its Transformer stacks, by name ("encoder ", "decoder "; none for the LSTM); both: `has_source`.
    """

    name: str
    predicts_tokens: bool
    attention: bool
    stacks: tuple[str, ...]

    @property
    def has_source(self) -> bool:
        """It translates: an encoder reads a source sentence that its decoder attends to (cross-attention), trained
        on source and target tokens; its source and target embeddings may be one (share_all_embeddings)."""
        return self.stacks == ("encoder ", "decoder ")


MODEL_KINDS: dict[str, ModelKind] = {
    "classifier": ModelKind("a classifier", False, True, ("encoder ",)),
    "lm": ModelKind("a lm model", True, True, ("decoder ",)),
    "lstm": ModelKind("an LSTM language model", True, False, ()),
    "seq2seq": ModelKind("a seq2seq model", True, True, ("encoder ", "decoder ")),
}


def describe(data_kind: str, model_kind: str) -> str:
    """How a refusal names a run: "a classifier", "a session model (data.kind=sessions, model.kind=lm)"."""
    if data_kind == "sessions":
        return f"a session model (data.kind=sessions, model.kind={model_kind})"
    return MODEL_KINDS[model_kind].name


def refusal(data_kind: str, model_kind: str, command: Command) -> str | None:
    """Why `command` does not serve a run of these kinds (the text after "RUN is a ...: "); None when it does."""
    if command.startswith("attention") and not MODEL_KINDS[model_kind].attention:
        return "it has no attention to show"
    kind = DATA_KINDS[data_kind]
    return None if command in kind.serves else kind.refusals[command]
