"""Pre-packed CPU linear layers for inference: same results as nn.Linear, safe fallbacks."""

import pytest
import torch
from torch import nn

from tformer_cli.decoding import packed as packed_module
from tformer_cli.decoding.packed import MIN_ROWS, PackedLinear, mkl_packing_available, pack_linears, packing_available
from tformer_cli.model import build_model

pytestmark = pytest.mark.skipif(not packing_available(), reason="this PyTorch build has no oneDNN")


def _pair(bias: bool = True):
    torch.manual_seed(0)
    linear = nn.Linear(48, 80, bias=bias)
    return linear, PackedLinear(linear)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(MIN_ROWS, 48), (33, 48), (3, 11, 48)])
def test_packed_linear_equals_linear(bias, shape):
    linear, packed = _pair(bias)
    x = torch.randn(shape)
    with torch.inference_mode():
        out = packed(x)
    assert packed._packed is not None  # the packed path ran
    assert out.shape == linear(x).shape
    assert torch.allclose(out, linear(x), atol=1e-5)


@pytest.mark.skipif(not mkl_packing_available(), reason="this PyTorch build has no MKL packed GEMM")
def test_fp32_uses_mkl_packed_gemm_at_every_row_count():
    """One MKL-packed copy (packed for 128 rows) serves any row count: the layout does not depend on it."""
    torch.manual_seed(0)
    for d_in, d_out in [(48, 80), (512, 2048), (2048, 512)]:
        linear = nn.Linear(d_in, d_out)
        packed = PackedLinear(linear, rows_hint=128)
        with torch.inference_mode():
            for rows in (MIN_ROWS, 5, 31, 128, 129, 700):
                x = torch.randn(rows, d_in)
                out = packed(x)
                assert packed._mkl  # the MKL product ran, not oneDNN's
                assert torch.allclose(out, linear(x), rtol=1e-5, atol=1e-5), (d_in, d_out, rows)
            x = torch.randn(2, 9, d_in).transpose(0, 1)  # (9, 2, d_in), not contiguous
            assert torch.allclose(packed(x), linear(x), rtol=1e-5, atol=1e-5)


def test_fp32_falls_back_to_onednn_when_mkl_packing_fails(monkeypatch):
    def refuse(*args):
        raise RuntimeError("mkl_linear: weight should be an MKL-DNN tensor")

    monkeypatch.setattr(torch.ops.mkl, "_mkl_reorder_linear_weight", refuse)
    linear, packed = _pair()
    x = torch.randn(16, 48)
    with torch.inference_mode():
        out = packed(x)
    assert packed._packed is not None and not packed._mkl  # oneDNN's packed product ran
    assert torch.allclose(out, linear(x), atol=1e-5)


@pytest.mark.parametrize("cpu_has_bf16", [True, False])
def test_bf16_packed_linear_serves_even_one_row_where_the_cpu_can(cpu_has_bf16, monkeypatch):
    if cpu_has_bf16 and not packed_module.bf16_packing_available():
        pytest.skip("this CPU has no bf16 support in oneDNN (AVX-512 or AVX-NE-CONVERT)")
    monkeypatch.setattr(packed_module, "bf16_packing_available", lambda: cpu_has_bf16)
    linear, _ = _pair()
    linear.to(torch.bfloat16)
    packed = PackedLinear(linear)
    x = torch.randn(1, 48, dtype=torch.bfloat16)
    with torch.inference_mode():
        out = packed(x)
        # oneDNN (AMX) is faster than F.linear in bf16; without CPU support it cannot pack at all
        assert (packed._packed is not None and not packed._mkl) == cpu_has_bf16
        assert out.dtype == torch.bfloat16
        assert torch.allclose(out.float(), linear(x).float(), atol=3e-2)


def test_packed_linear_falls_back_for_training_and_few_rows():
    linear, packed = _pair()
    x = torch.randn(8, 48, requires_grad=True)
    packed(x).sum().backward()  # gradients on: plain F.linear, so autograd works
    assert packed._packed is None and linear.weight.grad is not None
    with torch.no_grad():
        packed(torch.randn(MIN_ROWS - 1, 48))
    assert packed._packed is None


def test_packed_linear_repacks_after_an_in_place_weight_change():
    linear, packed = _pair()
    x = torch.randn(16, 48)
    with torch.no_grad():
        packed(x)
        linear.weight.mul_(2.0)  # e.g. an optimizer step or load_state_dict
        assert torch.allclose(packed(x), linear(x), atol=1e-5)


def test_packed_linear_built_in_inference_mode():
    with torch.inference_mode():  # a model made here has inference tensors: no version counter to read
        linear, packed = _pair()
        x = torch.randn(16, 48)
        assert torch.allclose(packed(x), linear(x), atol=1e-5)
        assert packed._packed is not None


def test_pack_linears_keeps_parameters_state_dict_and_tying():
    torch.manual_seed(0)
    model = build_model("seq2seq", vocab_size=30, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0).eval()
    keys = list(model.state_dict())
    src, tgt = torch.randint(4, 30, (3, 7)), torch.randint(4, 30, (3, 6))
    with torch.no_grad():
        before = model(src, tgt)
    swapped = pack_linears(model)
    assert swapped == sum(1 for m in model.modules() if isinstance(m, PackedLinear)) > 0
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert list(model.state_dict()) == keys
    assert model.lm_head.weight is model.decoder.embedding.weight  # tied weights stay tied
    with torch.no_grad():
        assert torch.allclose(model(src, tgt), before, atol=1e-4)
