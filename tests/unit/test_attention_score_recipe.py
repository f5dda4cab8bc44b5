"""`model.attention_score` from the recipe to a trained step: validated, built, trained, mapped, exported."""

import math
from pathlib import Path

import pytest
import torch

from tformer_cli.attention_maps import _capture
from tformer_cli.config import config_from_dict, load_config
from tformer_cli.errors import ConfigError, TformerError
from tformer_cli.export.hugging_face import hf_architecture
from tformer_cli.model.attention import MultiHeadAttention
from tformer_cli.run.load import build_model_from_config
from tformer_cli.train import step
from tformer_cli.train.dist import World
from tformer_cli.train.tasks import make_task

TINY = Path(__file__).parents[2] / "recipes" / "tiny_classifier.yaml"
SCORES = ["scaled_dot", "dot", "general", "additive"]


def _refusal(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as error:
        load_config(None, overrides)
    message = str(error.value)
    assert "\n" not in message
    return message


def test_the_default_is_the_scaled_dot_product():
    assert load_config(None, []).model.attention_score == "scaled_dot"


def test_an_unknown_score_is_refused_in_one_line_naming_the_key():
    message = _refusal(["model.attention_score=bilinear"])
    assert "model.attention_score" in message and "scaled_dot | dot | general | additive" in message
    assert "'bilinear'" in message


@pytest.mark.parametrize("score", ["general", "additive"])
def test_rope_with_a_score_that_is_not_a_dot_product_is_refused(score):
    message = _refusal([f"model.attention_score={score}", "model.pos=rope"])
    assert f"model.attention_score={score}" in message and "model.pos=rope" in message


def test_an_lstm_has_no_attention_score_to_choose():
    message = _refusal(["data.kind=text", "model.kind=lstm", "model.attention_score=additive"])
    assert "model.attention_score=additive" in message and "lstm" in message


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.attention_score=dot", "model.pos=rope"],  # q.k: RoPE's relative positions hold
        ["model.attention_score=additive", "model.pos=alibi"],  # a bias added to any score
        ["model.attention_score=general", "model.pos=learned", "model.n_kv_heads=2"],
        ["data.kind=text", "model.kind=lm", "model.attention_score=general"],
    ],
)
def test_combinations_that_make_sense_load(overrides):
    load_config(None, overrides)


@pytest.mark.parametrize("score", SCORES)
def test_the_recipe_builds_every_attention_layer_with_its_score(score):
    config = load_config(None, ["data.kind=parallel", f"model.attention_score={score}", "model.n_layers=1"])
    model = build_model_from_config(config, vocab_size=40)
    kinds = {m.score.kind for m in model.modules() if isinstance(m, MultiHeadAttention)}
    assert kinds == {score}


def _engine(config, precision):
    task = make_task(config)
    torch.manual_seed(config.run.seed)
    model = task.build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)  # Adam: a zero gradient moves nothing
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    return (
        task,
        model,
        step.Engine(step.Objective(model, task), task, optimizer, scaler, torch.device("cpu"), World(), precision, 1.0),
    )


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("score", SCORES)
def test_a_training_step_runs_and_moves_the_score_parameters(score, precision):
    config = load_config(TINY, [f"model.attention_score={score}", "train.weight_decay=0"])
    task, model, engine = _engine(config, precision)
    before = {name: p.detach().clone() for name, p in model.named_parameters() if ".score." in name}
    losses = []
    for batch in task.batches(0)[:8]:
        stats, status = step.update(engine, step.Step([batch], True, 3e-3))
        assert status == "ok" and math.isfinite(stats.loss_sum)
        losses.append(stats.loss_sum / task.count(batch))
    assert len(before) == {"scaled_dot": 0, "dot": 0, "general": 2, "additive": 6}[score]  # 2 layers
    for name, p in model.named_parameters():
        if name in before:
            assert not torch.equal(p, before[name]), f"{name} got no gradient"
    assert sum(losses[-3:]) < sum(losses[:3])  # and it learns


@pytest.mark.parametrize("score", SCORES)
def test_attention_maps_come_from_every_score(score):
    config = load_config(TINY, [f"model.attention_score={score}"])
    torch.manual_seed(0)
    model = build_model_from_config(config).eval()
    tokens = torch.randint(1, 20, (1, 16))
    with torch.inference_mode():
        plain = model(tokens)
    maps = _capture(model, lambda: model(tokens))
    assert [name for name, _ in maps] == ["enc L0.self", "enc L1.self"]
    for _, weights in maps:
        assert weights.shape == (4, 16, 16)
        assert (weights >= 0).all() and abs(weights.sum(-1) - 1).max() < 1e-5
    with torch.inference_mode():
        assert torch.allclose(model(tokens), plain, atol=1e-5)  # and the model computes what it did


@pytest.mark.parametrize("kind", ["seq2seq", "lm"])
def test_hugging_face_export_refuses_another_score_in_one_line(kind):
    data = "parallel" if kind == "seq2seq" else "text"
    model = {"kind": kind, "norm_placement": "pre", "share_all_embeddings": True, "attention_score": "general"}
    config = config_from_dict({"data": {"kind": data}, "model": model}, "test")
    with pytest.raises(TformerError) as error:
        hf_architecture(config.model)
    message = str(error.value)
    assert message.startswith("model.attention_score=general cannot be exported") and "\n" not in message


@pytest.mark.parametrize("kind", ["seq2seq", "lm"])
def test_ctranslate2_export_refuses_another_score_in_one_line(kind):
    from tformer_cli.export.ctranslate2 import check_exportable

    data = "parallel" if kind == "seq2seq" else "text"
    config = config_from_dict({"data": {"kind": data}, "model": {"kind": kind, "attention_score": "additive"}}, "test")
    with pytest.raises(TformerError) as error:
        check_exportable(config.model)
    message = str(error.value)
    assert message.startswith("model.attention_score=additive is not supported by the CTranslate2")
    assert "\n" not in message
