"""Positions are one tensor through the stack: the cache gives them, the stack makes the tables cover them."""

import pytest
import torch

from tformer_cli.errors import TformerError
from tformer_cli.model import build_model
from tformer_cli.model.cache import DecodeCache
from tformer_cli.model.positions import SinusoidalPositions, sinusoidal_table


def test_the_plain_cache_records_steps_and_gives_their_positions():
    cache = DecodeCache.plain(1)
    positions, _, _ = cache.record(torch.ones(2, 3, dtype=torch.bool), causal=True)
    assert torch.equal(positions, torch.arange(3)) and cache.n_keys == 3
    positions, mask, is_causal = cache.record(torch.ones(2, 1, dtype=torch.bool), causal=True)
    assert torch.equal(positions, torch.tensor([3])) and cache.n_keys == 4
    assert mask is None and not is_causal  # one new step sees every cached key


def test_sinusoidal_table_extends_by_the_formula_and_keeps_its_rows():
    pe = SinusoidalPositions(8, max_len=4)
    first = pe.table.clone()
    pe.prepare(10)
    assert pe.table.size(0) == 10 and torch.equal(pe.table[:4], first)
    assert torch.allclose(pe.table, sinusoidal_table(10, 8), atol=1e-6)
    x = torch.zeros(1, 2, 8)
    assert torch.equal(pe(x, torch.tensor([8, 9])), pe.table[8:10].unsqueeze(0))


@pytest.mark.parametrize("pos", ["sinusoidal", "rope", "alibi"])
def test_a_stack_past_its_table_decodes_as_the_full_sequence(pos):
    torch.manual_seed(0)
    model = build_model("lm", vocab_size=30, d_model=16, n_heads=2, n_layers=2, d_ff=32, pos=pos, max_len=4).eval()
    tokens = torch.randint(1, 30, (2, 9))
    with torch.no_grad():  # step by step first: the full sequence would extend the tables for the steps
        cache = model.new_cache()
        steps = [model(tokens[:, :5], cache=cache)] + [model(tokens[:, t : t + 1], cache=cache) for t in range(5, 9)]
        full = model(tokens)
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


def test_learned_positions_refuse_a_longer_sequence_through_the_stack_with_and_without_a_cache():
    model = build_model("lm", vocab_size=30, d_model=16, n_heads=2, n_layers=1, d_ff=32, pos="learned", max_len=8)
    model.eval()
    with pytest.raises(TformerError, match="sequence of length 9 is longer than the learned positions' maximum 8"):
        model(torch.ones(1, 9, dtype=torch.long))
    cache = model.new_cache()
    model(torch.ones(1, 8, dtype=torch.long), cache=cache)
    with pytest.raises(TformerError, match="sequence of length 9 is longer"):
        model(torch.ones(1, 1, dtype=torch.long), cache=cache)
