"""LM decoding: cached == uncached, seeded sampling is reproducible, top-k=1 is greedy, top-p keeps the head
(on each device; a sampling generator lives on the device of the logits it draws from)."""

import pytest
import torch

from tformer_cli.decoding.cache import pool_for
from tformer_cli.decoding.search import generate, sample_next
from tformer_cli.decoding.settings import SearchSettings
from tformer_cli.model import build_model


@pytest.fixture(scope="module")
def lm(device):
    torch.manual_seed(0)
    return (
        build_model(
            "lm",
            vocab_size=40,
            d_model=32,
            n_heads=4,
            n_layers=2,
            d_ff=64,
            dropout=0.0,
            norm_placement="pre",
            pos="rope",
        )
        .eval()
        .to(device)
    )


def test_cached_generation_equals_uncached(lm, device):
    prompt = torch.randint(1, 40, (2, 5), device=device)
    assert torch.equal(
        generate(lm, prompt, SearchSettings(max_new_tokens=12)),
        generate(lm, prompt, SearchSettings(max_new_tokens=12, use_cache=False)),
    )


def test_generation_reuses_released_buffers_without_leaking(lm, device):
    prompt = torch.randint(1, 40, (2, 5), device=device)
    expected = generate(lm, prompt, SearchSettings(max_new_tokens=12, use_cache=False))
    generate(lm, prompt, SearchSettings(max_new_tokens=12))
    free = pool_for(lm)._free
    assert len(free) == 2 * len(lm.decoder.blocks)  # every layer's keys and values came back
    with torch.inference_mode():
        for buf in free:
            buf.fill_(float("nan"))  # a stale read would show
    assert torch.equal(generate(lm, prompt, SearchSettings(max_new_tokens=12)), expected)


def test_seeded_sampling_is_reproducible(lm, device):
    prompt = torch.randint(1, 40, (1, 3), device=device)

    def sample(seed: int) -> torch.Tensor:
        return generate(lm, prompt, SearchSettings(max_new_tokens=15, temperature=1.0, top_p=0.9, seed=seed))

    assert torch.equal(sample(1), sample(1))
    assert not torch.equal(sample(1), sample(2))


def test_top_k_one_is_greedy(lm, device):
    prompt = torch.randint(1, 40, (2, 4), device=device)
    greedy = generate(lm, prompt, SearchSettings(max_new_tokens=10))
    sampled = generate(lm, prompt, SearchSettings(max_new_tokens=10, temperature=0.7, top_k=1, seed=0))
    assert torch.equal(greedy, sampled)


def test_top_p_keeps_only_the_nucleus(device):
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]], device=device))
    gen = torch.Generator(device=device).manual_seed(0)
    # 0.7, not 0.8: the first three tokens' mass (0.95) less the third's lands on 0.8 itself, on either side by rounding
    picks = {int(sample_next(logits, SearchSettings(temperature=1.0, top_p=0.7), gen)) for _ in range(200)}
    assert picks == {0, 1}


@pytest.mark.parametrize("top_p", [1e-3, 1e-300, 5e-324])  # the last two: 0 in float32
def test_the_most_likely_token_always_stays_however_small_top_p(device, top_p):
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]], device=device))
    gen = torch.Generator(device=device).manual_seed(0)
    picks = [sample_next(logits, SearchSettings(temperature=1.0, top_p=top_p), gen).tolist() for _ in range(20)]
    assert picks == [[1, 0]] * 20


def test_eos_stops_and_pads(lm, device):
    prompt = torch.randint(1, 40, (2, 3), device=device)
    first = int(generate(lm, prompt, SearchSettings(max_new_tokens=1))[0, -1])
    out = generate(lm, prompt, SearchSettings(max_new_tokens=10, eos_id=first))
    assert int(out[0, 3]) == first and torch.all(out[0, 3:] == first)


def test_lstm_generation_with_state_equals_recompute(device):
    torch.manual_seed(0)
    lstm = build_model("lstm", vocab_size=40, d_model=32, n_layers=2, dropout=0.0).eval().to(device)
    prompt = torch.randint(1, 40, (2, 4), device=device)
    assert torch.equal(
        generate(lstm, prompt, SearchSettings(max_new_tokens=10)),
        generate(lstm, prompt, SearchSettings(max_new_tokens=10, use_cache=False)),
    )


@pytest.mark.parametrize("kind", ["rope", "learned", "alibi", "lstm"])
def test_generation_runs_on_another_device_than_the_cpu(kind):
    """Every tensor generation makes is on the model's device: on the meta device, which refuses a CPU tensor mixed
    in as CUDA does, it takes the CPU's course (tests/unit/meta_device.py, `off_the_cpu`; the draws come from the
    default generator: the meta device has none of its own)."""
    from meta_device import off_the_cpu

    torch.manual_seed(0)
    if kind == "lstm":
        model = build_model("lstm", vocab_size=40, d_model=16, n_layers=2, dropout=0.0).eval()
    else:
        model = build_model("lm", vocab_size=40, d_model=16, n_heads=2, n_layers=1, d_ff=32, pos=kind).eval()
    prompt = torch.randint(1, 40, (3, 5))
    prompt[1, :2] = 0  # left padding
    for kw in ({}, {"temperature": 0.8, "top_k": 5, "top_p": 0.9, "eos_id": 7}):
        on_cpu, on_meta = off_the_cpu(
            lambda m, p, kw=kw: generate(m, p, SearchSettings(max_new_tokens=12, **kw)), model, prompt
        )
        assert on_meta.shape == on_cpu.shape
