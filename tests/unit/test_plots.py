"""curves.png (plots.training_curves): the validation panel shows what the run is judged by, its best starred."""

import json

import pytest

from tformer_cli import plots


@pytest.mark.parametrize(
    "valid,shown",
    [
        ({"loss": 2.0, "ppl": 7.4, "accuracy": 0.3, "bleu": 12.0}, ("bleu",)),  # translation with validation BLEU
        ({"loss": 2.0, "ppl": 7.4, "accuracy": 0.3}, ("ppl",)),  # a language model (or translation without BLEU)
        ({"loss": 0.5, "accuracy": 0.8}, ("accuracy",)),  # a classifier
        ({"loss": 2.0, "ppl": 7.4, "accuracy": 0.3, "hit10": 0.5, "mrr": 0.2}, ("mrr", "hit10")),  # sessions
    ],
)
def test_the_headline_metric_is_the_runs_own(valid, shown):
    assert plots.headline_metrics([{"split": "valid", "step": 10, **valid}]) == shown


def _figure_of(tmp_path, monkeypatch, records):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, out, dpi: drawn.append(fig))
    plots.training_curves(metrics, tmp_path / "curves.png")
    return drawn[0]


def test_a_translation_run_shows_bleu_with_its_best_marked(tmp_path, monkeypatch):
    train = [{"split": "train", "step": s, "loss": 3.0 / s, "lr": 1e-3, "accuracy": 0.1} for s in (5, 10, 15)]
    valid = [
        {"split": "valid", "step": 5, "loss": 2.0, "ppl": 7.4, "accuracy": 0.3, "bleu": 10.0},
        {"split": "valid", "step": 10, "loss": 1.5, "ppl": 4.5, "accuracy": 0.4, "bleu": 21.5},
        {"split": "valid", "step": 15, "loss": 1.6, "ppl": 5.0, "accuracy": 0.45, "bleu": 20.0},
    ]
    panel = _figure_of(tmp_path, monkeypatch, train + valid).axes[2]
    assert panel.get_title() == "validation BLEU (best 21.5 at update 10)"
    line, star = panel.get_lines()
    assert list(line.get_ydata()) == [10.0, 21.5, 20.0] and list(star.get_ydata()) == [21.5]


def test_a_language_models_perplexity_is_best_when_lowest_and_drawn_on_a_log_scale(tmp_path, monkeypatch):
    valid = [
        {"split": "valid", "step": 5, "loss": 6.0, "ppl": 403.0, "accuracy": 0.1},
        {"split": "valid", "step": 10, "loss": 4.0, "ppl": 54.6, "accuracy": 0.2},
    ]
    panel = _figure_of(tmp_path, monkeypatch, valid).axes[2]  # no training record yet: validation came first
    assert panel.get_title() == "validation perplexity per token (best 54.6 at update 10)"  # not the per-word one
    assert panel.get_yscale() == "log"


def test_next_item_ranking_shows_mrr_and_hit10(tmp_path, monkeypatch):
    valid = [{"split": "valid", "step": 5, "loss": 2.0, "ppl": 7.4, "accuracy": 0.3, "hit10": 0.5, "mrr": 0.25}]
    panel = _figure_of(tmp_path, monkeypatch, valid).axes[2]
    assert panel.get_title() == "validation MRR (best 0.25 at update 5)\nHit@10 (best 0.5 at update 5)"


def test_the_picture_is_written(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"split": "valid", "step": 1, "loss": 1.0, "accuracy": 0.5}) + "\n")
    plots.training_curves(metrics, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes().startswith(b"\x89PNG")


def test_the_loss_is_drawn_on_a_log_scale_so_a_loss_near_zero_keeps_its_course(tmp_path, monkeypatch):
    train = [{"split": "train", "step": s, "loss": 10.0**-s, "lr": 1e-3} for s in (1, 2, 3, 4)]
    panel = _figure_of(tmp_path, monkeypatch, train).axes[0]
    assert panel.get_yscale() == "log"


def test_a_loss_of_zero_keeps_the_linear_scale(tmp_path, monkeypatch):
    train = [{"split": "train", "step": s, "loss": 1.0 - s / 2, "lr": 1e-3} for s in (1, 2)]
    panel = _figure_of(tmp_path, monkeypatch, train).axes[0]
    assert panel.get_yscale() == "linear"


def test_resumes_and_recipe_changes_are_marked_on_every_panel(tmp_path, monkeypatch):
    from tformer_cli.train.report import curve_marks

    marks = curve_marks([4, 8], [{"update": 9, "key": "train.lr", "from": 1e-3, "to": 5e-4}])
    assert marks == [(4, "resumed"), (8, "resumed, train.lr=0.0005")]  # a change applies from the update after
    train = [{"split": "train", "step": s, "loss": 1.0 / s, "lr": 1e-3} for s in range(1, 12)]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in train))
    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, out, dpi: drawn.append(fig))
    plots.training_curves(metrics, tmp_path / "curves.png", marks)
    for ax in drawn[0].axes:
        vertical = [list(line.get_xdata()) for line in ax.get_lines() if line.get_linestyle() == ":"]
        assert vertical == [[4, 4], [8, 8]]
    assert [text.get_text() for text in drawn[0].axes[0].texts] == ["resumed", "resumed, train.lr=0.0005"]
