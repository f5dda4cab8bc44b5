"""Mixed precision contexts of an update (train/step.py), and one update in bf16 / fp16 on each device."""

from pathlib import Path

import pytest
import torch

from tformer_cli.config import load_config
from tformer_cli.metrics import Stats
from tformer_cli.model import build_model
from tformer_cli.train import step
from tformer_cli.train.dist import World
from tformer_cli.train.tasks import make_task


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


TINY = Path(__file__).parents[3] / "recipes" / "tiny_classifier.yaml"


def _one_update(
    device: torch.device, precision: str
) -> tuple[dict[str, torch.Tensor], Stats, str, torch.amp.GradScaler]:
    """One update of the tiny classifier (fresh, seeded) in `precision` on `device`, through what train() runs.

    Plain SGD with lr 1: each weight moves by its (clipped) gradient, so a rounding difference stays one.

    Returns:
        Each parameter's change (on the CPU), the update's stats and outcome, and the loss scaler.
    """
    task = make_task(load_config(TINY, []))
    torch.manual_seed(0)
    model = task.build_model().to(device)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    engine = step.Engine(
        step.Objective(model, task), task, optimizer, scaler, device, World(), precision, clip_norm=1.0
    )
    stats, outcome = step.update(engine, step.Step([task.batches(0)[0]], has_data=True, lr=1.0))
    stats = stats.host()  # the sums stay on the device until read
    for name, param in model.named_parameters():
        assert param.dtype == torch.float32, name  # the master weights stay fp32
    change = {name: (p.detach() - before[name]).cpu() for name, p in model.named_parameters()}
    return change, stats, outcome, scaler


def _assert_follows_fp32(change: dict, stats: Stats, reference: dict, ref_stats: Stats) -> None:
    """Low-precision compute: fp32's update up to rounding (a few %), not bit for bit."""
    assert stats.loss_sum != ref_stats.loss_sum  # autocast did compute in low precision
    assert stats.loss_sum == pytest.approx(ref_stats.loss_sum, rel=2e-2)
    for name, ref in reference.items():
        assert ref.norm() > 0, name
        assert (change[name] - ref).norm() / ref.norm() < 0.1, name


def test_a_bf16_autocast_update_follows_the_fp32_one(device):
    reference, ref_stats, _, _ = _one_update(device, "fp32")
    change, stats, outcome, _ = _one_update(device, "bf16")
    assert outcome == "ok"
    _assert_follows_fp32(change, stats, reference, ref_stats)


@pytest.mark.cuda
def test_an_fp16_update_with_the_loss_scaler_follows_the_fp32_one():
    cuda = torch.device("cuda")
    reference, ref_stats, _, _ = _one_update(cuda, "fp32")
    change, stats, outcome, scaler = _one_update(cuda, "fp16")
    assert outcome == "ok" and scaler.is_enabled() and scaler.get_scale() == 2.0**16  # no overflow: scale kept
    _assert_follows_fp32(change, stats, reference, ref_stats)
