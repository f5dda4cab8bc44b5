"""Multi-head attention keeps no state between calls: the reference path is chosen by a context that restores
it, and the weights reach forward hooks on `weights_tap` (model/attention.py)."""

import pytest
import torch

from tformer_cli.attention_maps import _capture
from tformer_cli.model import build_model
from tformer_cli.model.attention import MultiHeadAttention, attention_reference, reference_attention


def _plain_attributes(module: torch.nn.Module) -> dict:
    """The module's own attributes, less PyTorch's bookkeeping (parameters, buffers, submodules, hooks)."""
    return {k: v for k, v in vars(module).items() if not k.startswith("_") and k != "training"}


def _taps(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m.weights_tap for m in model.modules() if isinstance(m, MultiHeadAttention)]


def test_a_forward_leaves_the_module_as_it_was():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, n_heads=4).eval()
    before = _plain_attributes(mha)
    x = torch.randn(2, 5, 16)
    mha(x, is_causal=True)
    with reference_attention():
        mha(x, is_causal=True)
    assert _plain_attributes(mha) == before


def test_hooked_weights_are_the_reference_weights_and_only_on_the_reference_path():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, n_heads=2).double().eval()
    x = torch.randn(1, 4, 8, dtype=torch.float64)
    seen = []
    handle = mha.weights_tap.register_forward_hook(lambda module, args, out: seen.append(out))
    try:
        mha(x, is_causal=True)
        assert seen == []  # the fused path computes no weights
        with reference_attention():
            out = mha(x, is_causal=True)
    finally:
        handle.remove()
    q, k, v = mha._project(x, None, None)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    expected_out, expected = attention_reference(q, k, v, causal)
    assert len(seen) == 1 and torch.allclose(seen[0], expected)
    assert torch.allclose(out, mha.out_proj(expected_out.transpose(1, 2).reshape(1, 4, 8)))


def test_reference_attention_is_restored_when_the_block_raises():
    mha = MultiHeadAttention(8, n_heads=2).eval()
    seen = []
    mha.weights_tap.register_forward_hook(lambda module, args, out: seen.append(out))
    with pytest.raises(RuntimeError), reference_attention():
        raise RuntimeError("a failure inside")
    mha(torch.randn(1, 3, 8))
    assert seen == []  # the fused path again


def test_attention_maps_remove_their_hooks_and_restore_the_path_even_when_the_run_fails():
    torch.manual_seed(0)
    model = build_model("lm", vocab_size=20, d_model=16, n_heads=2, n_layers=2, d_ff=32).eval()
    tokens = torch.randint(1, 20, (1, 6))

    def failing() -> None:
        model(tokens)
        raise RuntimeError("drawing failed")

    with pytest.raises(RuntimeError, match="drawing failed"):
        _capture(model, failing)
    assert all(not tap._forward_hooks for tap in _taps(model))
    maps = _capture(model, lambda: model(tokens))
    assert [name for name, _ in maps] == ["dec L0.self", "dec L1.self"]
    assert maps[0][1].shape == (2, 6, 6)
    assert all(not tap._forward_hooks for tap in _taps(model))
    seen = []
    _taps(model)[0].register_forward_hook(lambda module, args, out: seen.append(out))
    model(tokens)
    assert seen == []  # outside `_capture`, the fused path
