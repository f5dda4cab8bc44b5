"""Tiny seeded models shared by the model tests and the decoding tests, and a tiny sessions recipe (not a test
module)."""

import torch

from tformer_cli.model import build_model
from tformer_cli.tokenizer import EOS_ID

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
