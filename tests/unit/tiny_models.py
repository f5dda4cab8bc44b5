"""Tiny seeded models shared by the model tests and the decoding tests (not a test module)."""

import torch

from tformer_cli.model import build_model

POSITIONS = ["sinusoidal", "learned", "rope", "alibi"]
SMALL = dict(d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, max_len=64)


def tiny_lm(pos: str, **kw):
    """A pre-LN decoder-only LM over 50 tokens, seed 0, in eval mode."""
    torch.manual_seed(0)
    return build_model("lm", vocab_size=50, pos=pos, norm_placement="pre", **{**SMALL, **kw}).eval()


def tiny_seq2seq(pos: str = "sinusoidal", **kw):
    """An encoder-decoder over 50 tokens, seed 0, in eval mode."""
    torch.manual_seed(0)
    return build_model("seq2seq", vocab_size=50, pos=pos, **{**SMALL, **kw}).eval()
