"""Shared by the tests (not a test module): tiny seeded models for the model and decoding tests, a tiny sessions
recipe, and tiny made-up translation corpora (word for word "German") with the overrides and recipes that train
a translation run on them in seconds."""

import torch

from tformer_cli.model import build_model
from tformer_cli.tokenizer import EOS_ID

# What a test compared with a CPU reference (Hugging Face, CTranslate2, numbers seen on a CPU) adds to its
# training overrides and its decoding commands, so that it runs on the CPU on every machine: run.device auto
# would take a GPU where there is one (TF32, CUDA graphs, other kernels).
CPU = ["run.device=cpu"]
ON_CPU = CPU  # a trained run's commands take run.device among their overrides too

POSITIONS = ["sinusoidal", "learned", "rope", "alibi"]
# Words of the tiny made-up corpora (translation pairs, tokenizers) that tests write.
WORDS = "the house cat dog is red blue green small big a on in with and of to we you they".split()
SMALL = dict(d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, max_len=64)
# A tiny generated-sessions recipe (key=value overrides; add model.kind): 40 sessions to train in batches of 8,
# some padded, a one-layer model of width 16.
SESSIONS = [
    "data.kind=sessions",
    "data.sessions.n_sessions=60",
    "data.sessions.n_valid=10",
    "data.sessions.n_test=10",
    "data.sessions.n_items=40",
    "data.sessions.session_len=9",
    "data.sessions.min_len=3",  # some targets are padding
    "model.d_model=16",
    "model.n_heads=2",
    "model.n_layers=1",
    "model.d_ff=32",
    "train.batch_size=8",
]


def tiny_lm(pos: str, **kw):
    """A pre-LN decoder-only LM over 50 tokens, seed 0, in eval mode."""
    torch.manual_seed(0)
    return build_model("lm", vocab_size=50, pos=pos, norm_placement="pre", **{**SMALL, **kw}).eval()


def tiny_seq2seq(pos: str = "sinusoidal", **kw):
    """An encoder-decoder over 50 tokens, seed 0, in eval mode."""
    torch.manual_seed(0)
    return build_model("seq2seq", vocab_size=50, pos=pos, **{**SMALL, **kw}).eval()


def tiny_translator(device: torch.device | str = "cpu", **kw):
    """An encoder-decoder over 24 tokens, seed 0, in eval mode, on `device`, whose EOS is likely enough
    that a search's hypotheses end at different lengths (the decoding tests' model)."""
    torch.manual_seed(0)
    m = build_model("seq2seq", vocab_size=24, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, **kw).eval()
    with torch.no_grad():
        m.lm_head.weight[EOS_ID] *= 3.0
    return m.to(device)


def padded_sources(device: torch.device | str = "cpu", seed: int = 1, n: int = 5, vocab_size: int = 24):
    """(n, 7) random source ids in 4..vocab_size-1 from `seed`, on `device`; rows 1 and 3 end in padding (after 5 and
    3 tokens): the decoding tests' batch, whose sentences have different lengths."""
    torch.manual_seed(seed)
    s = torch.randint(4, vocab_size, (n, 7))
    s[1, 5:] = 0  # padding
    s[3, 3:] = 0
    return s.to(device)


# ---------------------------------------------------------------- tiny translation corpora and runs, for the CLI tests

GERMAN_WORDS = "das haus katze hund ist rot blau gruen klein gross ein auf in mit und von zu wir ihr sie".split()
GERMAN = dict(zip(WORDS, GERMAN_WORDS, strict=True))  # a word-for-word "German"
REVERSED = {word: word[::-1] for word in WORDS}  # a made-up target language: each word reversed


def write_pairs(folder, splits: dict, target) -> None:
    """`folder/<split>.en` and `.de` for each split's English lines, the German side `target(line)`."""
    for split, lines in splits.items():
        (folder / f"{split}.en").write_text("\n".join(lines) + "\n")
        (folder / f"{split}.de").write_text("\n".join(target(line) for line in lines) + "\n")


def word_for_word(table: dict):
    """A target function that translates each word of a line with `table`."""
    return lambda line: " ".join(table[w] for w in line.split())


def tiny_mt_training(max_len: int, max_updates: int, valid_every: int) -> list[str]:
    """Overrides that make recipes/wmt14_base.yaml a model of 32 wide trained in seconds, fp32, one thread."""
    return (
        ["model.d_model=32", "model.n_heads=4", "model.n_layers=1", "model.d_ff=64", "model.dropout=0.0"]
        + [f"model.max_len={max_len}"]  # HF's beam search works on buffers of max_new_tokens (model.max_len): short
        + ["train.schedule=constant", "train.lr=3e-3", "train.warmup_steps=10", "train.max_tokens=300"]
        + [f"train.max_updates={max_updates}", "train.epochs=100", f"train.valid_every={valid_every}"]
        + ["train.update_freq=1", "train.precision=fp32", "train.best_metric=loss", "train.label_smoothing=0.0"]
        + ["run.threads=1"]
    )


TINY_MT_RECIPE = """\
data:
  kind: parallel
  train: {tmp}/train
  valid: {tmp}/valid
  dir: {tmp}/data
  workers: 1
tokenizer:
  vocab_size: 60
model:
  kind: seq2seq
  d_model: 16
  n_heads: 2
  n_layers: 1
  d_ff: 32
  dropout: 0.1{model}
run:
  out_dir: {tmp}/runs
  threads: 1
train:
  schedule: constant
  warmup_steps: 0
  lr: 3.0e-3
  max_tokens: 300
{train}  best_metric: loss
  log_every: 1
  precision: fp32
"""


def tiny_mt_recipe(tmp, model: str = "", train: str = "  epochs: 1\n"):
    """A 16-wide translation recipe and its corpus (200 training, 40 validation pairs of 2-6 words, the target
    each word reversed) in `tmp`; `model`, `train`: YAML lines added to those sections. Returns the recipe's path."""
    import random

    rng = random.Random(0)
    src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(240)]
    write_pairs(tmp, {"train": src[:200], "valid": src[200:]}, word_for_word(REVERSED))
    recipe = tmp / "recipe.yaml"
    recipe.write_text(TINY_MT_RECIPE.format(tmp=tmp, model=model, train=train))
    return recipe
