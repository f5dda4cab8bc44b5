"""Tiny trained runs shared by the integration tests (made once per session, in-process, from corpora made here)."""

import random

import pytest
from tiny_models import CPU, GERMAN, WORDS, word_for_word, write_pairs
from typer.testing import CliRunner

from tformer_cli.cli import app

runner = CliRunner()


# What recipes/wmt14_base.yaml sets for a GPU run and the tiny test runs trained from it set back: one
# micro-batch per update, the epochs (not 100k updates) end the run, validation at each epoch's end, fp32
# (the CPU would run the recipe's bf16), the gradient clipped at 1.
SMALL_RUN_OF_WMT14_BASE = [
    "train.update_freq=1",
    "train.max_updates=null",
    "train.valid_every=0",
    "train.precision=fp32",
    "train.clip_norm=1.0",
]


def _invoke(args):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output + str(result.exception)
    return result


@pytest.fixture(scope="session")
def translation_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mt")
    rng = random.Random(0)
    src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(400)]
    write_pairs(tmp, {"train": src[:360], "valid": src[360:]}, word_for_word(GERMAN))
    common = [
        f"data.train={tmp}/train",
        f"data.valid={tmp}/valid",
        f"data.dir={tmp}/data",
        "tokenizer.vocab_size=60",
        f"run.out_dir={tmp}/runs",
        "run.name=mt",
    ]
    _invoke(["prepare", "recipes/wmt14_base.yaml", *common])
    _invoke(
        [
            "train",
            "recipes/wmt14_base.yaml",
            *CPU,  # compared with CPU references (tiny_models.CPU)
            *common,
            "model.d_model=32",
            "model.n_heads=4",
            "model.n_layers=1",
            "model.d_ff=64",
            "model.dropout=0.0",
            "train.schedule=constant",
            "train.lr=3e-3",
            "train.warmup_steps=10",
            "train.max_tokens=400",
            "train.epochs=3",
            "train.best_metric=bleu",
            "train.valid_bleu_lines=20",
            "train.keep_last=3",
            *SMALL_RUN_OF_WMT14_BASE,
        ]
    )
    return tmp


@pytest.fixture(scope="session")
def lm_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm")
    rng = random.Random(1)
    text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(500)) + "\n"
    (tmp / "train.txt").write_text(text)
    (tmp / "valid.txt").write_text(text[:3000].rsplit("\n", 1)[0] + "\n")
    common = [
        f"data.train={tmp}/train.txt",
        f"data.valid={tmp}/valid.txt",
        f"data.dir={tmp}/data",
        "tokenizer.vocab_size=40",
        f"run.out_dir={tmp}/runs",
        "data.block_size=32",
    ]
    _invoke(["prepare", "recipes/wikitext2_lm.yaml", *common])
    for name, kind, updates in (("lm", "lm", "null"), ("lstm", "lstm", "3")):  # the LSTM baseline, on the same data
        _train_lm(common, name, kind, updates)
    return tmp


def _train_lm(common, name, kind, max_updates):
    _invoke(
        [
            "train",
            "recipes/wikitext2_lm.yaml",
            *CPU,  # compared with CPU references (tiny_models.CPU)
            *common,
            f"run.name={name}",
            f"model.kind={kind}",
            *(["train.optimizer=adamw"] if kind == "lstm" else []),  # as wikitext2_lstm.yaml: Muon needs blocks
            f"train.max_updates={max_updates}",
            "model.d_model=32",
            "model.n_heads=4",
            "model.n_layers=1",
            "model.d_ff=64",
            "train.batch_size=8",
            "train.epochs=2",
            "train.valid_every=0",  # a validation and a step checkpoint at each epoch's end
            "train.compile=false",
            "train.warmup_steps=5",
            "train.best_metric=loss",
        ]
    )


@pytest.fixture(scope="session")
def classifier_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cls")
    _invoke(["train", "recipes/tiny_classifier.yaml", *CPU, f"run.out_dir={out}", "train.epochs=1"])
    return out / "tiny_classifier"


# The StreamRec recipes made tiny: a small generated data set with padded (shorter) sessions, one small layer.
SESSIONS_TINY = [
    "data.sessions.n_sessions=140",
    "data.sessions.n_valid=20",
    "data.sessions.n_test=20",
    "data.sessions.n_items=30",
    "data.sessions.session_len=8",
    "data.sessions.min_len=5",
    "model.d_model=16",
    "model.n_layers=1",
    "train.epochs=2",
    "train.max_updates=null",
    "train.valid_every=0",  # a validation and a step checkpoint at each epoch's end
    "train.batch_size=16",
    "train.warmup_steps=5",
]
SESSION_RECIPES = {"lm": "recipes/streamrec_transformer.yaml", "lstm": "recipes/streamrec_lstm.yaml"}


@pytest.fixture(scope="session")
def sessions_run(tmp_path_factory):
    """Each StreamRec recipe trained tiny through the CLI: runs/lm (the Transformer) and runs/lstm."""
    out = tmp_path_factory.mktemp("sessions")
    for kind, recipe in SESSION_RECIPES.items():
        heads = ["model.n_heads=2", "model.d_ff=32"] if kind == "lm" else []
        _invoke(["train", recipe, *CPU, *SESSIONS_TINY, *heads, f"run.out_dir={out}/runs", f"run.name={kind}"])
    return out
