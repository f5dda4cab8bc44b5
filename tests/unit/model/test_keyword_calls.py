"""MultiHeadAttention, Block and Stack take keyword-only arguments past the first: calls read as sentences."""

import pytest
import torch

from tformer_cli.model.attention import MultiHeadAttention
from tformer_cli.model.layers import Block, TokenEmbedding
from tformer_cli.model.spec import ModelConfig
from tformer_cli.model.stack import Stack

SPEC = ModelConfig(kind="lm", d_model=16, n_heads=2, n_layers=1, d_ff=32)


def test_positional_arguments_past_the_first_are_refused():
    with pytest.raises(TypeError):
        MultiHeadAttention(16, 2)
    with pytest.raises(TypeError):
        Block(SPEC, True)
    with pytest.raises(TypeError):
        Stack(SPEC, TokenEmbedding(10, 16, 0), 1, causal=True, cross=False, pad_id=0)


def test_forward_takes_keywords_past_the_input():
    mha = MultiHeadAttention(16, n_heads=2, cross=True)
    x = torch.randn(1, 3, 16)
    with pytest.raises(TypeError):
        mha(x, x)
    assert mha(x, memory=x).shape == (1, 3, 16)
    block = Block(SPEC)
    with pytest.raises(TypeError):
        block(x, None)
    assert block(x, is_causal=True).shape == (1, 3, 16)
