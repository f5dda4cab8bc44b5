"""Scoring held-out sessions (validation.SessionValidation): what training validates with and `tformer eval` prints."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tformer_cli.config import load_config
from tformer_cli.data import sessions
from tformer_cli.schema import SessionsConfig
from tformer_cli.validation import SessionValidation, validation_from, validation_set

CFG = SessionsConfig(n_sessions=160, n_valid=60, n_test=40, n_items=50, session_len=12, min_len=4)


class SuccessorOracle(nn.Module):
    """Scores item + 1 at 10 and every other item (padding too) at 0: the local rule and nothing else."""

    def __init__(self, n_items: int) -> None:
        super().__init__()
        self.n_items = n_items
        self.unused = nn.Parameter(torch.zeros(1))  # a device for `next(parameters())`

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return 10.0 * F.one_hot(tokens % self.n_items + 1, self.n_items + 1).float()  # (B, T, 1 + n_items)


def test_ranks_count_only_real_targets_and_padding_is_masked(device):
    data = sessions.split(CFG, "valid")
    assert bool((data.items == sessions.PAD_ID).any())  # min_len 4: there is padding to mask
    metrics = SessionValidation(data, CFG).evaluate(SuccessorOracle(CFG.n_items).to(device), device)
    real = data.rules != sessions.NO_TARGET
    hit = data.targets[real] == sessions.successor(data.inputs[real], CFG.n_items)  # rank 1, else rank n_items
    rules = data.rules[real]
    assert metrics["accuracy"] == pytest.approx(float(hit.double().mean()))
    assert metrics["mrr"] == pytest.approx(float(torch.where(hit, 1.0, 1 / CFG.n_items).mean()))
    assert metrics["accuracy_local"] == 1.0 and metrics["hit10_local"] == 1.0
    long = rules == sessions.LONG
    assert metrics["accuracy_long"] == pytest.approx(float(hit[long].double().mean()))
    assert metrics["hit10_random"] == pytest.approx(float(hit[rules == sessions.RANDOM].double().mean()))
    # the loss: cross-entropy over the real targets only (a padding target would add log(51) each)
    logits = SuccessorOracle(CFG.n_items)(data.inputs)[real]
    assert metrics["loss"] == pytest.approx(float(F.cross_entropy(logits, data.targets[real])), rel=1e-5)
    assert metrics["ppl"] == pytest.approx(math.exp(metrics["loss"]), rel=1e-6)


def test_the_bayes_optimal_numbers_are_the_generator_s_on_these_sessions():
    data = sessions.split(CFG, "valid")
    best = SessionValidation(data, CFG).best
    assert best["bayes_accuracy_local"] == pytest.approx(1.0)  # p_local 0.4 beats any long-range item's share
    assert 0.0 < best["bayes_accuracy_long"] < 0.2 and best["bayes_hit10_long"] > 0.8
    assert best["bayes_hit10_random"] == pytest.approx(10 / 50, abs=0.05)  # top 10 of 50, nearly uniform
    assert best["bayes_accuracy"] > 0.4 and best["bayes_mrr"] >= best["bayes_accuracy"]
    other = SessionValidation(data, dataclasses.replace(CFG, p_long=0.0)).best  # no long-range rule at all
    assert other["bayes_hit10_long"] != other["bayes_hit10_long"]  # NaN: no target is long-range then


def test_counts_and_the_splits_a_recipe_scores():
    config = load_config(None, ["data.kind=sessions", "model.kind=lm", *_cfg_overrides(CFG)])
    valid, test = validation_set(config), validation_set(config, "test")
    assert isinstance(valid, SessionValidation) and len(valid.data) == 60 and len(test.data) == 40
    counts = valid.counts()
    assert counts["sessions"] == 60 and counts["n"] == int((valid.data.rules != sessions.NO_TARGET).sum())
    assert counts["n_local"] + counts["n_long"] + counts["n_random"] == counts["n"]
    assert not torch.equal(valid.data.items[:40], test.data.items)


@pytest.mark.parametrize(("kind", "model"), [("pattern", "classifier"), ("text", "lm"), ("parallel", "seq2seq")])
def test_a_split_the_kind_has_not_is_refused_not_replaced_by_valid(kind, model):
    """Only generated sessions have a test split; another kind asked for it must not hand back its valid split."""
    config = load_config(None, [f"data.kind={kind}", f"model.kind={model}"])
    with pytest.raises(ValueError, match=f"data.kind={kind} has no 'test' split"):
        validation_from(config, None, "test")


def _cfg_overrides(cfg: SessionsConfig) -> list[str]:
    return [f"data.sessions.{f.name}={getattr(cfg, f.name)}" for f in dataclasses.fields(cfg)]


def test_the_bayes_optimal_loss_is_the_entropy_of_the_next_item_by_hand():
    cfg = SessionsConfig(n_sessions=3, n_valid=1, n_test=1, n_items=4, session_len=3, p_local=0.5, p_long=0.5)
    data = sessions.Sessions(torch.tensor([[1, 3, 2]]), torch.tensor([[sessions.RANDOM, sessions.RANDOM]]))
    # long_after 3: no long-range rule here; after each item: its successor 0.5 + 0.125, the others 0.125
    entropy = -(0.625 * math.log(0.625) + 3 * 0.125 * math.log(0.125))
    assert SessionValidation(data, cfg).best["bayes_loss"] == pytest.approx(entropy)
