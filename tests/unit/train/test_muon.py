"""train.optimizer=muon: the Newton-Schulz orthogonalisation, each part's update against PyTorch's own, which
parameters take which rule, and the state a checkpoint keeps."""

import io

import pytest
import torch
from torch import nn

from tformer_cli.config import load_config
from tformer_cli.errors import ConfigError
from tformer_cli.run import build_model_from_config
from tformer_cli.train import muon as muon_module
from tformer_cli.train.muon import NEWTON_SCHULZ, MuonAdamW, orthogonalise
from tformer_cli.train.optim import build_optimizer

TINY = ["model.kind=lm", "data.kind=text", "model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.n_layers=2"]


def _quintic(s: torch.Tensor, steps: int) -> torch.Tensor:
    a, b, c = NEWTON_SCHULZ
    for _ in range(steps):
        s = a * s + b * s**3 + c * s**5
    return s


@pytest.mark.parametrize("shape", [(12, 40), (40, 12)])
def test_orthogonalise_is_the_quintic_on_the_singular_values(shape):
    """U f(S / ||X||) V^T, f the quintic applied 5 times: exact in float64, either orientation."""
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=torch.float64)
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    expected = u @ torch.diag(_quintic(s / x.norm(), 5)) @ vh
    got = orthogonalise(x, dtype=torch.float64)
    assert got.shape == x.shape
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    singular = torch.linalg.svdvals(orthogonalise(x).double())  # bf16, as it runs
    assert singular.min() > 0.5 and singular.max() < 1.3


def _model(*overrides: str) -> nn.Module:
    torch.manual_seed(0)
    return build_model_from_config(load_config(None, [*TINY, *overrides]), 50).double()


def _grads(model: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)


def test_each_part_steps_as_pytorch_does(monkeypatch):
    """Three updates with the same gradients: the blocks' matrices as torch.optim.Muon (match_rms_adamw) moves
    them, everything else as torch.optim.AdamW; float64 throughout (both iterations made float64)."""
    config = load_config(None, [*TINY, "train.optimizer=muon", "train.lr=3e-3", "train.weight_decay=0.1"])
    ours_model, torch_model = _model(), _model()
    ours = build_optimizer(ours_model, config.train)
    assert isinstance(ours, MuonAdamW)
    ours.ns_dtype = torch.float64
    is_muon = {id(p) for g in ours.param_groups if g["muon"] for p in g["params"]}
    index = {id(p): i for i, p in enumerate(ours_model.parameters())}
    theirs_params = list(torch_model.parameters())
    matrices = [theirs_params[index[id(p)]] for g in ours.param_groups if g["muon"] for p in g["params"]]
    rest = [q for q in theirs_params if all(q is not m for m in matrices)]
    assert len(matrices) == len(is_muon) and rest
    muon_ref = pytest.importorskip("torch.optim._muon", reason="torch.optim.Muon needs PyTorch 2.9")
    monkeypatch.setattr(
        muon_ref, "_zeropower_via_newtonschulz", lambda g, coefficients, steps, eps: orthogonalise(g, steps, g.dtype)
    )
    reference = [
        torch.optim.Muon(matrices, lr=3e-3, weight_decay=0.1, adjust_lr_fn="match_rms_adamw"),
        torch.optim.AdamW(rest, lr=3e-3, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.1, foreach=False),
    ]
    for step in range(3):
        _grads(ours_model, step), _grads(torch_model, step)
        ours.step()
        for optimizer in reference:
            optimizer.step()
    for p, q in zip(ours_model.parameters(), torch_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)
    assert muon_module.MOMENTUM == 0.95  # torch.optim.Muon's default, which the reference used


def test_the_blocks_linear_weights_take_muon_and_nothing_else():
    model = _model("model.tie_embeddings=false")
    optimizer = build_optimizer(model, load_config(None, [*TINY, "train.optimizer=muon"]).train)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = sorted(names[id(p)] for g in optimizer.param_groups if g["muon"] for p in g["params"])
    linear = sorted(f"{n}.weight" for n, m in model.named_modules() if isinstance(m, nn.Linear) and ".blocks." in n)
    assert muon == linear and len(muon) == 2 * 4  # attention's qkv and out, the feed-forward's two; 2 blocks
    others = [names[id(p)] for g in optimizer.param_groups if not g["muon"] for p in g["params"]]
    assert sorted(others + muon) == sorted(names.values())  # every parameter once
    assert "lm_head.weight" in others and any("embed" in n for n in others)


def test_weight_decay_groups_are_kept_for_the_adamw_part():
    model = _model()
    train = load_config(
        None, [*TINY, "train.optimizer=muon", "train.weight_decay=0.1", "train.decay_norms_biases_embeddings=false"]
    ).train
    optimizer = build_optimizer(model, train)
    no_decay = [g for g in optimizer.param_groups if g["weight_decay"] == 0.0]
    assert len(no_decay) == 1 and not no_decay[0]["muon"]
    assert all(p.ndim == 1 or p.shape[0] == 50 for p in no_decay[0]["params"])  # norms, biases, the embedding


def test_an_lstm_is_refused():
    with pytest.raises(ConfigError, match="train.optimizer=muon steps a Transformer's block matrices"):
        load_config(None, ["model.kind=lstm", "data.kind=text", "train.optimizer=muon"])


def test_its_state_goes_through_a_weights_only_checkpoint():
    """Saved after two updates and loaded (weights_only=True) into a fresh optimizer, the third update is the same."""
    train = load_config(None, [*TINY, "train.optimizer=muon"]).train
    model = _model()
    optimizer = build_optimizer(model, train)
    for step in range(2):
        _grads(model, step)
        optimizer.step()
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed = _model()
    resumed.load_state_dict(saved["model"])
    again = build_optimizer(resumed, train)
    again.load_state_dict(saved["optimizer"])
    for m, o in ((model, optimizer), (resumed, again)):
        _grads(m, 2)
        o.step()
    for p, q in zip(model.parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert all(torch.isfinite(p).all() for p in model.parameters())
