"""Attention score functions (model/scores.py): each against its formula written out element by element,
through the reference path's masking, inside multi-head attention, and in built models."""

import itertools
import math

import pytest
import torch
from tiny_models import SMALL
from tiny_models import tiny_lm as _lm

from tformer_cli.model import build_model, count_parameters
from tformer_cli.model.attention import MultiHeadAttention, attention_reference
from tformer_cli.model.build import init_weights
from tformer_cli.model.scores import AttentionScore

SCORES = ["scaled_dot", "dot", "general", "additive"]
B, H, T_Q, T_K, D = 2, 3, 4, 5, 6


def _random_score(kind: str) -> AttentionScore:
    """A float64 score module with random parameters (not its initialisation: W is neither symmetric nor I)."""
    torch.manual_seed(1)
    score = AttentionScore(kind, H, D).double()
    with torch.no_grad():
        for p in score.parameters():
            p.normal_()
    return score


def _qkv(t_k: int = T_K):
    torch.manual_seed(0)
    return (torch.randn(B, H, T_Q, D, dtype=torch.float64), *torch.randn(2, B, H, t_k, D, dtype=torch.float64))


def _by_formula(kind: str, score: AttentionScore, q, k):
    """score(q_i, k_j) for each batch row, head, query and key, one dot product at a time."""
    out = torch.empty(q.size(0), q.size(1), q.size(2), k.size(2), dtype=q.dtype)
    for b, h, i, j in itertools.product(*(range(n) for n in out.shape)):
        qi, kj = q[b, h, i], k[b, h, j]
        match kind:
            case "scaled_dot":
                s = sum(qi[n] * kj[n] for n in range(D)) / math.sqrt(D)
            case "dot":
                s = sum(qi[n] * kj[n] for n in range(D))
            case "general":  # q W k^T = sum over m, n of q_m W_mn k_n
                s = sum(qi[m] * score.w[h, m, n] * kj[n] for m in range(D) for n in range(D))
            case "additive":  # v . tanh(q W_q + k W_k), unit n of the hidden layer at a time
                hidden = [
                    torch.tanh(sum(qi[m] * score.w_q[h, m, n] + kj[m] * score.w_k[h, m, n] for m in range(D)))
                    for n in range(D)
                ]
                s = sum(score.v[h, n] * hidden[n] for n in range(D))
        out[b, h, i, j] = s
    return out


@pytest.mark.parametrize("kind", SCORES)
def test_each_score_is_its_formula(kind):
    score = _random_score(kind)
    q, k, _ = _qkv()
    with torch.no_grad():
        assert torch.allclose(score(q, k), _by_formula(kind, score, q, k), atol=1e-10)


def test_dot_is_scaled_dot_times_sqrt_dk_in_the_logits():
    q, k, _ = _qkv()
    dot, scaled = AttentionScore("dot", H, D), AttentionScore("scaled_dot", H, D)
    assert torch.allclose(dot(q, k), scaled(q, k) * math.sqrt(D), atol=1e-12)
    assert not torch.allclose(dot(q, k), scaled(q, k), atol=1e-3)


def test_general_with_w_identity_over_sqrt_dk_is_scaled_dot():
    q, k, _ = _qkv()
    general = AttentionScore("general", H, D).double()
    with torch.no_grad():
        general.w.copy_(torch.eye(D, dtype=torch.float64).expand(H, D, D) / math.sqrt(D))
    assert torch.allclose(general(q, k), AttentionScore("scaled_dot", H, D)(q, k), atol=1e-12)


def _attend_by_hand(scores, v, mask, bias):
    """softmax over the allowed keys of each row, then the weighted sum of values; nothing allowed: 0."""
    out = torch.zeros(*scores.shape[:3], v.size(-1), dtype=v.dtype)
    for b, h, i in itertools.product(*(range(n) for n in scores.shape[:3])):
        allowed = [j for j in range(scores.size(-1)) if mask[b, 0, i, j]]
        logits = torch.stack([scores[b, h, i, j] + bias[0, h, i, j] for j in allowed]) if allowed else None
        if logits is not None:
            weights = torch.exp(logits - logits.max()) / torch.exp(logits - logits.max()).sum()
            out[b, h, i] = sum(w * v[b, h, j] for w, j in zip(weights, allowed, strict=True))
    return out


@pytest.mark.parametrize("kind", SCORES)
def test_reference_path_masks_biases_and_zeroes_empty_rows_for_each_score(kind):
    score = _random_score(kind)
    q, k, v = _qkv()
    torch.manual_seed(2)
    mask = torch.rand(B, 1, T_Q, T_K) > 0.4
    mask[0, 0, 1] = False  # a query row with nothing to attend to
    mask[1, 0, 2] = True
    bias = torch.randn(1, H, T_Q, T_K, dtype=torch.float64)  # as ALiBi's, added to the scores
    with torch.no_grad():
        out, weights = attention_reference(q, k, v, mask, bias, score=score)
        expected = _attend_by_hand(score(q, k), v, mask, bias)
    assert torch.allclose(out, expected, atol=1e-10)
    assert torch.all(out[0, :, 1] == 0) and torch.all(weights[0, :, 1] == 0)
    assert torch.all(weights[~mask.expand_as(weights)] == 0)
    assert not torch.isnan(out).any()


@pytest.mark.parametrize("kind", SCORES)
def test_causal_attention_sees_no_future_key_for_each_score(kind):
    torch.manual_seed(0)
    mha = MultiHeadAttention(12, n_heads=3, score=kind).double().eval()
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    changed = x.clone()
    changed[:, 4:] = torch.randn(2, 2, 12, dtype=torch.float64)
    with torch.no_grad():
        out, out_changed = mha(x, is_causal=True), mha(changed, is_causal=True)
    assert torch.allclose(out[:, :4], out_changed[:, :4], atol=1e-12)
    assert not torch.allclose(out[:, 4:], out_changed[:, 4:], atol=1e-6)


def _pair(kind: str, cross: bool, n_kv_heads=None):
    """Multi-head attention with score `kind` (random score parameters), and a scaled_dot twin with the
    same projection weights."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, n_heads=4, n_kv_heads=n_kv_heads, cross=cross, score=kind).double().eval()
    with torch.no_grad():
        for p in mha.score.parameters():
            p.normal_(std=0.3)
        for p in mha.parameters():  # non-zero biases, so that folding them is checked too
            if p.dim() == 1:
                p.normal_()
    twin = MultiHeadAttention(16, n_heads=4, n_kv_heads=n_kv_heads, cross=cross).double().eval()
    twin.load_state_dict({name: p for name, p in mha.state_dict().items() if not name.startswith("score.")})
    return mha, twin


def _query_weight(mha: MultiHeadAttention):
    """The rows of the (fused) projection that make the queries, (n_heads * d_head, D), and their bias."""
    proj = mha.q_proj if mha.cross else mha.qkv_proj
    rows = mha.n_heads * mha.d_head
    return proj.weight[:rows], proj.bias[:rows]


def _inputs(cross: bool):
    torch.manual_seed(3)
    x, memory = torch.randn(2, 5, 16, dtype=torch.float64), torch.randn(2, 7, 16, dtype=torch.float64)
    mask = torch.ones(2, 1, 1, 7 if cross else 5, dtype=torch.bool)
    mask[1, ..., 3:] = False  # padding in one row
    return x, (memory if cross else None), mask


@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_multi_head_dot_is_scaled_dot_with_queries_times_sqrt_dk(cross, n_kv_heads):
    """Unscaled scores = the scaled dot product of queries sqrt(d_k) times larger (the fused path, here)."""
    mha, twin = _pair("dot", cross, n_kv_heads)
    weight, bias = _query_weight(twin)
    with torch.no_grad():
        weight.mul_(math.sqrt(mha.d_head))
        bias.mul_(math.sqrt(mha.d_head))
        x, memory, mask = _inputs(cross)
        assert torch.allclose(mha(x, memory=memory, mask=mask), twin(x, memory=memory, mask=mask), atol=1e-10)


@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_multi_head_general_folds_into_the_query_projection(cross, n_kv_heads):
    """q W k^T = (q W sqrt(d_k)) . k / sqrt(d_k): head h's query rows W^Q_h become sqrt(d_k) W_h^T W^Q_h."""
    mha, twin = _pair("general", cross, n_kv_heads)
    weight, bias = _query_weight(twin)
    d = mha.d_head
    with torch.no_grad():
        for h in range(mha.n_heads):
            rows = slice(h * d, (h + 1) * d)
            w_t = mha.score.w[h].T * math.sqrt(d)
            weight[rows] = w_t @ weight[rows]
            bias[rows] = w_t @ bias[rows]
        x, memory, mask = _inputs(cross)
        assert torch.allclose(mha(x, memory=memory, mask=mask), twin(x, memory=memory, mask=mask), atol=1e-10)


def test_a_score_other_than_scaled_dot_never_takes_the_fused_path(monkeypatch):
    import tformer_cli.model.attention as attention

    def fused(*args, **kwargs):
        raise AssertionError("the fused kernels compute only the scaled dot product")

    monkeypatch.setattr(attention, "attention_fast", fused)
    for kind in ("dot", "general", "additive"):
        model = _lm("alibi", attention_score=kind)
        model(torch.randint(1, 50, (2, 6)))
    with pytest.raises(AssertionError, match="fused kernels"):
        _lm("alibi")(torch.randint(1, 50, (2, 6)))


def test_general_starts_as_the_scaled_dot_product_model():
    """W = I / sqrt(d_k) at initialisation, drawing nothing from the generator: same seed, same model."""
    tokens = torch.randint(1, 50, (2, 9))
    torch.manual_seed(0)
    general = build_model("seq2seq", vocab_size=50, attention_score="general", **SMALL).eval()
    torch.manual_seed(0)
    scaled = build_model("seq2seq", vocab_size=50, **SMALL).eval()
    with torch.no_grad():
        assert torch.allclose(general(tokens, tokens), scaled(tokens, tokens), atol=1e-5)
    w = general.decoder.blocks[0].cross_attn.score.w
    assert torch.equal(w, torch.eye(8).expand(4, 8, 8) / math.sqrt(8))


def test_init_weights_initialises_the_score_parameters():
    torch.manual_seed(0)
    model = build_model("lm", vocab_size=50, attention_score="additive", **SMALL)
    score = model.decoder.blocks[1].self_attn.score
    with torch.no_grad():
        for p in score.parameters():
            p.fill_(7.0)
    init_weights(model, SMALL["d_model"])
    d = 8
    for w in (score.w_q, score.w_k):  # Xavier-uniform per (d_k x d_k) head
        assert 0.9 * math.sqrt(3 / d) < w.abs().max() <= math.sqrt(3 / d)
    assert 0.8 * math.sqrt(6 / (d + 1)) < score.v.abs().max() <= math.sqrt(6 / (d + 1))
    general = build_model("lm", vocab_size=50, attention_score="general", **SMALL)
    general.decoder.blocks[0].self_attn.score.w.data.fill_(7.0)
    init_weights(general, SMALL["d_model"])
    assert torch.equal(general.decoder.blocks[0].self_attn.score.w, torch.eye(d).expand(4, d, d) / math.sqrt(d))


@pytest.mark.parametrize("kind", SCORES)
def test_initial_logits_have_about_unit_scale_except_unscaled_dot(kind):
    torch.manual_seed(0)
    d = 64
    q, k = torch.randn(8, 4, 32, d), torch.randn(8, 4, 32, d)
    with torch.no_grad():
        std = float(AttentionScore(kind, 4, d)(q, k).std())
    if kind == "dot":
        assert std == pytest.approx(math.sqrt(d), rel=0.1)  # the saturating softmax of section 3.2.1
    else:
        assert 0.7 < std < 1.3


def test_parameter_counts_put_the_score_parameters_in_their_attention():
    d, h, ff = 32, 4, 64
    d_k = d // h
    counts = {
        kind: count_parameters(
            build_model("seq2seq", vocab_size=50, d_model=d, n_heads=h, n_layers=1, d_ff=ff, attention_score=kind)
        )
        for kind in SCORES
    }
    extra = {"scaled_dot": 0, "dot": 0, "general": h * d_k * d_k, "additive": 2 * h * d_k * d_k + h * d_k}
    for kind in SCORES:
        for component in ("encoder self-attention", "decoder self-attention", "decoder cross-attention"):
            assert counts[kind][component] == 4 * d * d + 4 * d + extra[kind], (kind, component)
        assert counts[kind]["total"] == counts["scaled_dot"]["total"] + 3 * extra[kind]
        assert counts[kind]["encoder feed-forward"] == counts["scaled_dot"]["encoder feed-forward"]


@pytest.mark.parametrize("kind", SCORES)
@pytest.mark.parametrize("model_kind", ["classifier", "lm", "seq2seq"])
def test_every_parameter_gets_a_gradient_with_each_score(kind, model_kind):
    torch.manual_seed(0)
    pos = "alibi" if model_kind == "lm" else "sinusoidal"
    model = build_model(model_kind, vocab_size=30, n_classes=3, pos=pos, attention_score=kind, **SMALL)
    src, tgt = torch.randint(1, 30, (2, 7)), torch.randint(1, 30, (2, 5))
    src[1, 5:] = 0  # padding: masked keys
    out = model(src) if model_kind != "seq2seq" else model(src, tgt)
    out.float().pow(2).mean().backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []
    per_layer = {"scaled_dot": 0, "dot": 0, "general": 1, "additive": 3}[kind]  # W; W_q, W_k, v
    n_attention = sum(1 for m in model.modules() if isinstance(m, MultiHeadAttention))
    assert sum(".score." in name for name, _ in model.named_parameters()) == per_layer * n_attention
