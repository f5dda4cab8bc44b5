"""Mixed precision contexts of an update (train/step.py)."""

import pytest
import torch

from tformer_cli.model import build_model
from tformer_cli.train import step


def test_an_lstm_trains_under_cpu_bf16_autocast_on_any_cpu():
    """oneDNN's bf16 LSTM needs AVX-512; without it autocast_for must keep the LSTM off oneDNN."""
    model = build_model("lstm", vocab_size=30, d_model=16, n_layers=2, dropout=0.0)
    tokens = torch.randint(0, 30, (2, 7))
    with step.autocast_for("bf16", torch.device("cpu")):
        logits = model(tokens)
    torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens.flatten()).backward()
    assert model.embedding.weight.grad is not None


@pytest.mark.parametrize("supported", [True, False])
def test_onednn_is_off_inside_bf16_autocast_only_where_the_cpu_lacks_bf16(monkeypatch, supported):
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: supported)
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", True)  # on at the start, whatever an earlier test left
    with step.autocast_for("bf16", torch.device("cpu")):
        assert torch.is_autocast_enabled("cpu")
        assert torch.backends.mkldnn.enabled == supported
    assert torch.backends.mkldnn.enabled  # restored
