"""The CPU bf16 training case sits beside the fused path: multi-head attention takes it for bf16 queries on a CPU
with gradients on, and only then."""

import torch

from tformer_cli.model import attention
from tformer_cli.model.attention import MultiHeadAttention


def test_bf16_training_on_the_cpu_takes_the_fp32_path_and_decoding_does_not(monkeypatch):
    calls = []
    real = attention.attention_fp32_for_bf16

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, "attention_fp32_for_bf16", spy)
    mha = MultiHeadAttention(16, n_heads=2).to(torch.bfloat16)
    x = torch.randn(2, 5, 16, dtype=torch.bfloat16)
    out = mha(x, is_causal=True)
    assert calls == [1] and out.dtype == torch.bfloat16
    out.float().sum().backward()
    with torch.no_grad():
        mha(x, is_causal=True)
    mha.float()(x.float(), is_causal=True)
    assert calls == [1]
