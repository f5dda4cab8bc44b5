"""Scaled dot-product attention: the chapter's worked example, fast == reference, masks (on each device)."""

import random

import pytest
import torch
import torch.nn.functional as F

from tformer_cli.model.attention import (
    MultiHeadAttention,
    attention_fast,
    attention_fp32_for_bf16,
    attention_reference,
    reference_attention,
)


def test_chapter8_walkthrough_first_row():
    """The chapter's worked example gives a first attention row of about [0.230, 0.129, 0.410, 0.230].

    The book's own Q, K, V were not available to us; that row is softmax([1, 0, 2, 1] / sqrt(3)), so
    these 4x3 matrices have first-row scores q1 . k_j = 1, 0, 2, 1, as the book's must.
    """
    q = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    k = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [2.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    v = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    out, weights = attention_reference(q.view(1, 1, 4, 3), k.view(1, 1, 4, 3), v.view(1, 1, 4, 3))
    expected = torch.tensor([0.230, 0.129, 0.410, 0.230])
    assert torch.allclose(weights[0, 0, 0], expected, atol=1e-3)
    assert torch.allclose(out[0, 0, 0], weights[0, 0, 0] @ v)
    assert torch.allclose(weights.sum(-1), torch.ones(1, 1, 4))


def _random_case(seed: int, dtype, cross: bool, gqa: bool, masked: bool, device: torch.device):
    """Random shapes, tensors and mask, all drawn from `seed` (a failure names it and reproduces) on the
    CPU's generator, so that every device gets the same case, then moved to `device`."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    b, h, d = rng.randint(1, 3), rng.choice([1, 2, 4]), rng.choice([4, 8, 16])
    t_q = rng.randint(1, 9)
    t_k = rng.randint(1, 9) if cross else t_q
    q = torch.randn(b, h, t_q, d, dtype=dtype)
    k = torch.randn(b, h, t_k, d, dtype=dtype)
    v = torch.randn(b, h, t_k, d, dtype=dtype)
    mask = None
    if masked:
        mask = torch.rand(b, 1, t_q, t_k) > 0.3
        mask[..., 0] = True  # keep rows non-empty here; empty rows have their own test
        if not cross:
            mask &= torch.ones(t_q, t_k, dtype=torch.bool).tril()
            mask[..., 0] = True
        mask = mask.to(device)
    return q.to(device), k.to(device), v.to(device), mask


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_fast_equals_reference(dtype, tol, cross, masked, device):
    for seed in range(5):  # five random shapes, the same every run
        q, k, v, mask = _random_case(seed, dtype, cross, False, masked, device)
        ref, _ = attention_reference(q, k, v, mask)
        fast = attention_fast(q, k, v, mask)
        error = float((fast - ref).norm() / ref.norm().clamp_min(1e-30))
        assert error < tol, (
            f"seed {seed}: shapes q {tuple(q.shape)} k {tuple(k.shape)}, masked {masked}: relative error {error:.3g}"
        )


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_fast_equals_reference_with_bias_and_causal_flag(dtype, tol, device):
    q, k, v = (torch.randn(2, 4, 7, 8, dtype=dtype, device=device) for _ in range(3))
    bias = torch.randn(1, 4, 7, 7, dtype=dtype, device=device)
    causal = torch.ones(7, 7, dtype=torch.bool, device=device).tril()
    ref, _ = attention_reference(q, k, v, causal, bias)
    assert ((attention_fast(q, k, v, None, bias, is_causal=True) - ref).norm() / ref.norm()) < tol
    ref_plain, _ = attention_reference(q, k, v, causal)
    assert ((attention_fast(q, k, v, None, None, is_causal=True) - ref_plain).norm() / ref_plain.norm()) < tol


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("cross", [False, True])
def test_multihead_fast_equals_reference_with_gqa(n_kv_heads, cross, device):
    torch.manual_seed(n_kv_heads + 10 * cross)
    mha = MultiHeadAttention(16, n_heads=4, n_kv_heads=n_kv_heads, cross=cross).double().eval().to(device)
    x = torch.randn(2, 5, 16, dtype=torch.float64, device=device)
    memory = torch.randn(2, 6, 16, dtype=torch.float64, device=device) if cross else None
    t_k = 6 if cross else 5
    mask = torch.rand(2, 1, 5, t_k, device=device) > 0.3
    mask[..., 0] = True
    fast = mha(x, memory=memory, mask=mask)
    with reference_attention():
        ref = mha(x, memory=memory, mask=mask)
    assert ((fast - ref).norm() / ref.norm()) < 1e-10


def test_rows_sum_to_one_and_causal_upper_triangle_is_zero(device):
    q, k, v = (torch.randn(2, 3, 6, 8, device=device) for _ in range(3))
    causal = torch.ones(6, 6, dtype=torch.bool, device=device).tril()
    _, weights = attention_reference(q, k, v, causal)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 3, 6, device=device))
    assert torch.all(weights.triu(diagonal=1) == 0)


def test_fully_masked_row_is_zero_not_nan(device):
    q, k, v = (torch.randn(1, 2, 3, 4, device=device) for _ in range(3))
    mask = torch.tensor([[False, False, False], [True, False, False], [True, True, True]], device=device)
    bias = torch.randn(1, 2, 3, 3, device=device)
    ref, weights = attention_reference(q, k, v, mask, bias)
    for out in (ref, attention_fast(q, k, v, mask), attention_fast(q, k, v, mask, bias)):
        assert not torch.isnan(out).any()
        assert torch.all(out[:, :, 0] == 0)
    assert torch.all(weights[:, :, 0] == 0)
    assert torch.allclose(attention_fast(q, k, v, mask, bias), ref, atol=1e-6)


def test_bf16_inputs_on_cpu_give_bf16_outputs_close_to_fp32():
    q, k, v = (torch.randn(2, 4, 9, 16) for _ in range(3))
    reference = attention_fast(q, k, v, is_causal=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attention_fp32_for_bf16(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), reference, atol=3e-2)


def test_bf16_inference_runs_the_bf16_kernel_and_stays_close_to_fp32(device):
    q, k, v = (torch.randn(2, 4, 9, 16, device=device) for _ in range(3))
    reference = attention_fast(q, k, v, is_causal=True)
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    with torch.no_grad():  # decoding with bf16 weights: no upcast (training upcasts: attention_fp32_for_bf16)
        out = attention_fast(qb, kb, vb, is_causal=True)
        assert torch.equal(out, F.scaled_dot_product_attention(qb, kb, vb, is_causal=True))
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), reference, atol=3e-2)
