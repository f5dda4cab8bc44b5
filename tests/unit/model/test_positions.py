"""Position schemes: each property the chapters state."""

import pytest
import torch

from tformer_cli.errors import TformerError
from tformer_cli.model.positions import ALiBi, LearnedPositions, Rotary, alibi_slopes, sinusoidal_table


def test_rope_score_depends_on_relative_position_only():
    rotary = Rotary(16)
    q, k = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)

    def score(m: int, n: int) -> float:
        rotary.prepare(max(m, n) + 1, torch.device("cpu"))
        qm = rotary(q.float().view(1, 1, 1, 16), torch.tensor([m]))
        kn = rotary(k.float().view(1, 1, 1, 16), torch.tensor([n]))
        return float((qm * kn).sum())

    assert score(5, 12) == pytest.approx(score(10, 17), rel=1e-5)
    assert score(5, 12) != pytest.approx(score(5, 13), rel=1e-3)


def test_rope_offset_matches_full_sequence():
    rotary = Rotary(8)
    x = torch.randn(1, 2, 10, 8)
    full = rotary(x)
    assert torch.allclose(full[:, :, 7:], rotary(x[:, :, 7:], torch.arange(7, 10)), atol=1e-6)


def test_rope_frequencies_survive_casting_the_model_to_bf16():
    x = torch.randn(1, 2, 3, 64)
    cast, plain = Rotary(64).to(torch.bfloat16), Rotary(64)  # as `decode.precision=bf16` or model.to(bf16) would
    positions = torch.arange(2000, 2003)
    for rotary in (cast, plain):
        rotary.prepare(2003, x.device)
    assert torch.equal(cast(x, positions), plain(x, positions))  # angles from fp64 frequencies


def test_alibi_slopes_power_of_two_and_not():
    assert torch.allclose(alibi_slopes(8), torch.tensor([1 / 2 ** (i + 1) for i in range(8)]))
    six = alibi_slopes(6)  # 4 from the 4-head sequence, then every other one of the 8-head sequence
    assert torch.allclose(six, torch.tensor([2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]))
    assert len(alibi_slopes(12)) == 12 and torch.all(alibi_slopes(12) > 0)


def test_alibi_bias_is_minus_slope_times_distance():
    bias = ALiBi(8)(torch.arange(5), 5)
    slopes = alibi_slopes(8)
    for h in range(8):
        for i in range(5):
            for j in range(5):
                assert bias[0, h, i, j] == pytest.approx(-slopes[h] * abs(i - j))
    # with an offset (decoding with a cache), query 7 against key 2 is distance 5
    assert ALiBi(8)(torch.tensor([7]), 8)[0, 0, 0, 2] == pytest.approx(-0.5 * 5)


def test_sinusoidal_shift_is_a_fixed_rotation_per_frequency_pair():
    d, k = 16, 7
    table = sinusoidal_table(64, d).double()
    for i in range(d // 2):
        omega = 10000 ** (-2 * i / d)
        rot = torch.tensor(
            [
                [torch.cos(torch.tensor(omega * k)), torch.sin(torch.tensor(omega * k))],
                [-torch.sin(torch.tensor(omega * k)), torch.cos(torch.tensor(omega * k))],
            ],
            dtype=torch.float64,
        )
        pair = table[:, 2 * i : 2 * i + 2]  # (sin, cos) at every position
        # [sin(w(p+k)), cos(w(p+k))] = [sin wp, cos wp] @ [[cos wk, -sin wk], [sin wk, cos wk]]
        shifted = pair[: 64 - k] @ rot.T
        assert torch.allclose(shifted, pair[k:], atol=1e-5)


def test_learned_positions_refuse_longer_sequences():
    pos = LearnedPositions(8, max_len=10)
    pos.prepare(10)
    with pytest.raises(TformerError, match="longer than the learned positions' maximum 10"):
        pos.prepare(11)


def test_rope_table_made_during_evaluation_still_serves_training():
    rotary = Rotary(8)
    with torch.inference_mode():
        rotary(torch.randn(1, 1, 300, 8))  # first call: builds the table in inference mode
    x = torch.randn(1, 1, 300, 8, requires_grad=True)
    rotary(x).sum().backward()
    assert x.grad is not None
