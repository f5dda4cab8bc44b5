"""The three architectures: equivariance, causality, padding, KV cache, parameter counts, gradients."""

import pytest
import torch
from tiny_models import POSITIONS, SMALL
from tiny_models import tiny_lm as _lm
from tiny_models import tiny_seq2seq as _seq2seq

from tformer_cli.model import build_model, count_parameters


def _encoder(pos: str):
    torch.manual_seed(0)
    return build_model("classifier", vocab_size=50, n_classes=3, pos=pos, **SMALL).eval().encoder


def test_encoder_without_positions_is_permutation_equivariant():
    encoder = _encoder("none")
    tokens = torch.randint(1, 50, (2, 9))
    perm = torch.randperm(9)
    assert torch.allclose(encoder(tokens)[:, perm], encoder(tokens[:, perm]), atol=1e-5)


@pytest.mark.parametrize("pos", POSITIONS)
def test_each_position_scheme_breaks_equivariance(pos):
    encoder = _encoder(pos)
    tokens = torch.randint(1, 50, (2, 9))
    perm = torch.tensor([1, 0, 2, 3, 4, 5, 6, 7, 8])
    assert not torch.allclose(encoder(tokens)[:, perm], encoder(tokens[:, perm]), atol=1e-4)


@pytest.mark.parametrize("pos", POSITIONS)
def test_lm_is_causal(pos, device):
    model = _lm(pos).to(device)
    tokens = torch.randint(1, 50, (2, 12), device=device)
    changed = tokens.clone()
    changed[:, 7:] = torch.randint(1, 50, (2, 5), device=device)
    assert torch.allclose(model(tokens)[:, :7], model(changed)[:, :7], atol=1e-5)
    assert not torch.allclose(model(tokens)[:, 7:], model(changed)[:, 7:], atol=1e-5)


def test_seq2seq_decoder_is_causal():
    model = _seq2seq()
    src, tgt = torch.randint(1, 50, (2, 8)), torch.randint(1, 50, (2, 10))
    changed = tgt.clone()
    changed[:, 6:] = torch.randint(1, 50, (2, 4))
    assert torch.allclose(model(src, tgt)[:, :6], model(src, changed)[:, :6], atol=1e-5)


@pytest.mark.parametrize("pos", POSITIONS)
def test_appending_padding_changes_nothing_real(pos, device):
    pad = torch.zeros(2, 4, dtype=torch.long, device=device)
    src, tgt = torch.randint(1, 50, (2, 8), device=device), torch.randint(1, 50, (2, 6), device=device)
    encoder = _encoder(pos).to(device)
    assert torch.allclose(encoder(src), encoder(torch.cat([src, pad], 1))[:, :8], atol=1e-5)
    lm = _lm(pos).to(device)
    assert torch.allclose(lm(tgt), lm(torch.cat([tgt, pad], 1))[:, :6], atol=1e-5)
    s2s = _seq2seq(pos).to(device)  # padded source (cross-attention) and padded target (decoder)
    reference = s2s(src, tgt)
    assert torch.allclose(reference, s2s(torch.cat([src, pad], 1), tgt), atol=1e-5)
    assert torch.allclose(reference, s2s(src, torch.cat([tgt, pad], 1))[:, :6], atol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "first"])
def test_classifier_pooled_output_ignores_padding(pooling):
    torch.manual_seed(0)
    model = build_model("classifier", vocab_size=50, n_classes=3, pooling=pooling, **SMALL).eval()
    tokens = torch.randint(1, 50, (3, 10))
    padded = torch.cat([tokens, torch.zeros(3, 5, dtype=torch.long)], 1)
    assert torch.allclose(model.pool(tokens), model.pool(padded), atol=1e-5)


@pytest.mark.parametrize("pos", POSITIONS)
@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_lm_kv_cache_matches_full_recompute(pos, n_kv_heads, device):
    model = _lm(pos, n_kv_heads=n_kv_heads).to(device)
    tokens = torch.randint(1, 50, (2, 14), device=device)
    full = model(tokens)
    cache = model.new_cache()
    first = model(tokens[:, :5], cache=cache)  # a prompt, then one token at a time
    assert torch.allclose(first, full[:, :5], atol=1e-5)
    for t in range(5, 14):
        step = model(tokens[:, t : t + 1], cache=cache)
        assert torch.allclose(step[:, 0], full[:, t], atol=1e-5), f"step {t}"


@pytest.mark.parametrize("pos", POSITIONS)
def test_seq2seq_kv_cache_matches_full_recompute(pos, device):
    model = _seq2seq(pos, norm_placement="pre").to(device)
    src = torch.cat([torch.randint(1, 50, (2, 7)), torch.zeros(2, 2, dtype=torch.long)], 1).to(device)
    tgt = torch.randint(1, 50, (2, 9), device=device)
    memory, memory_mask = model.encode(src)
    full = model.decode(tgt, memory, memory_mask)
    cache = model.new_cache()
    for t in range(9):
        step = model.decode(tgt[:, t : t + 1], memory, memory_mask, cache)
        assert torch.allclose(step[:, 0], full[:, t], atol=1e-5), f"step {t}"
    assert cache.layers[0].cross_kv.memory is not None  # the encoder's keys and values were computed once


def test_cache_reorder_selects_rows(device):
    model = _lm("rope").to(device)
    tokens = torch.randint(1, 50, (3, 6), device=device)
    cache = model.new_cache()
    model(tokens[:, :5], cache=cache)
    cache.reorder(torch.tensor([2, 2, 0], device=device))
    step = model(tokens[[2, 2, 0], 5:6], cache=cache)
    assert torch.allclose(step[:, 0], model(tokens[[2, 2, 0]])[:, 5], atol=1e-5)


def test_parameter_count_per_layer_formula():
    d, ff = 64, 256
    model = build_model(
        "classifier", vocab_size=10, n_classes=2, d_model=d, n_heads=4, n_layers=1, d_ff=ff, norm_placement="post"
    )
    counts = count_parameters(model)
    assert counts["encoder self-attention"] == 4 * d * d + 4 * d
    assert counts["encoder feed-forward"] == 2 * d * ff + ff + d
    no_bias = build_model(
        "classifier", vocab_size=10, n_classes=2, d_model=d, n_heads=4, n_layers=1, d_ff=ff, bias=False
    )
    assert count_parameters(no_bias)["encoder self-attention"] == 4 * d * d


def test_wmt14_base_parameter_count_is_analytic():
    d, ff, n, vocab = 512, 2048, 6, 37_000
    model = build_model(
        "seq2seq",
        vocab_size=vocab,
        d_model=d,
        n_heads=8,
        n_layers=n,
        d_ff=ff,
        share_all_embeddings=True,
        norm_placement="post",
    )
    attention, ffn, norm = 4 * d * d + 4 * d, 2 * d * ff + ff + d, 2 * d
    encoder = n * (attention + ffn + 2 * norm)
    decoder = n * (2 * attention + ffn + 3 * norm)
    assert count_parameters(model)["total"] == vocab * d + encoder + decoder == 63_082_496


@pytest.mark.parametrize("kind", ["classifier", "lm", "seq2seq"])
@pytest.mark.parametrize(
    "variant",
    [
        dict(),
        dict(ffn="swiglu", norm="rmsnorm", norm_placement="pre", pos="rope"),
        dict(pos="learned", n_kv_heads=1, share_all_embeddings=True),
    ],
)
def test_every_parameter_gets_a_gradient(kind, variant):
    torch.manual_seed(0)
    model = build_model(kind, vocab_size=30, n_classes=3, **{**SMALL, **variant})
    src, tgt = torch.randint(1, 30, (2, 7)), torch.randint(1, 30, (2, 5))
    out = model(src) if kind != "seq2seq" else model(src, tgt)
    out.float().pow(2).mean().backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    # the padding row of each embedding legitimately gets no gradient; everything else must
    assert missing == []


def test_initialisation_scales():
    torch.manual_seed(0)
    model = build_model(
        "seq2seq", vocab_size=1000, d_model=128, n_heads=4, n_layers=1, d_ff=512, share_all_embeddings=True
    )
    emb = model.encoder.embedding.weight
    assert torch.all(emb[0] == 0)  # padding row
    assert emb[1:].std().item() == pytest.approx(128**-0.5, rel=0.05)
    qkv = model.encoder.blocks[0].self_attn.qkv_proj.weight  # each of Q, K, V as its own Xavier matrix
    bound = (6 / (128 + 128)) ** 0.5
    assert qkv.abs().max() <= bound and qkv.abs().max() > 0.95 * bound
    w1 = model.encoder.blocks[0].ffn.w1.weight
    assert w1.abs().max() <= (6 / (128 + 512)) ** 0.5
    assert model.lm_head.weight is emb  # three-way tying


def test_lstm_baseline_is_causal_and_its_state_matches_a_full_pass(device):
    torch.manual_seed(0)
    model = build_model("lstm", vocab_size=50, d_model=32, n_layers=2, dropout=0.0).eval().to(device)
    tokens = torch.randint(1, 50, (2, 10), device=device)
    full = model(tokens)
    changed = tokens.clone()
    changed[:, 6:] = torch.randint(1, 50, (2, 4), device=device)
    assert torch.allclose(model(changed)[:, :6], full[:, :6], atol=1e-6)
    state = model.new_cache()
    steps = torch.cat([model(tokens[:, t : t + 1], cache=state) for t in range(10)], dim=1)
    assert torch.allclose(steps, full, atol=1e-5)
    assert model.lm_head.weight is model.embedding.weight


def test_lstm_recipe_kind_validates():
    from tformer_cli.config import load_config

    cfg = load_config(None, ["data.kind=text", "model.kind=lstm"])
    assert cfg.model.kind == "lstm"
