"""Every shipped recipe validates; wmt14_base is the paper's."""

from pathlib import Path

import pytest
import yaml

from tformer_cli.config import load_config
from tformer_cli.train.optim import lr_at

RECIPES = sorted((Path(__file__).parents[2] / "recipes").glob("*.yaml"))


def test_there_are_recipes():
    assert len(RECIPES) >= 2


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_validates(path):
    load_config(path)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_a_recipe_names_no_folder_outside_the_repository(path):
    """Local data is named under the data root ($TFORMER_DATA), which each machine sets, never by a relative
    path that exists on one machine only."""
    text = path.read_text()
    assert "../" not in text
    data = yaml.safe_load(text).get("data", {})
    for split in ("train", "valid", "test"):
        spec = data.get(split)
        for local in () if spec is None else (spec,) if isinstance(spec, str) else spec:
            assert local.startswith("$TFORMER_DATA/"), (split, local)


def test_wmt14_base_is_the_papers_recipe():
    """Vaswani et al. (2017), sections 5.1-5.4 and 6.1, on one GPU (see the recipe's comments)."""
    config = load_config(Path(__file__).parents[2] / "recipes" / "wmt14_base.yaml")
    m, t, d = config.model, config.train, config.decode
    assert (m.d_model, m.n_heads, m.n_layers, m.d_ff, m.dropout, m.norm_placement) == (512, 8, 6, 2048, 0.1, "post")
    assert m.share_all_embeddings and config.tokenizer.vocab_size == 37_000
    # ~25k source + ~25k target tokens per update: the budget (one process) counts padding and each
    # pair's longer side, of which WMT14 EN-DE fills 87% with English and 93% with German
    budget = t.max_tokens * t.update_freq
    assert 24_000 < 0.87 * budget < 26_000 and 25_000 < 0.93 * budget < 27_500
    assert t.max_updates == 100_000 and t.epochs >= 100  # ~20 epochs of WMT14: the updates end the run
    assert (t.optimizer, t.betas, t.eps, t.weight_decay) == ("adam", (0.9, 0.98), 1e-9, 0.0)
    assert (t.schedule, t.warmup_steps) == ("inverse_sqrt", 4000)
    assert lr_at(4000, t, m.d_model, t.max_updates) == pytest.approx(512**-0.5 * 4000**-0.5)  # the peak, 7.0e-4
    assert (t.label_smoothing, t.clip_norm) == (0.1, 0.0)
    assert t.precision == "auto"  # bf16 autocast on a GPU with bf16 tensor cores (precision.py)
    assert 500 <= t.valid_every <= 2000 and t.keep_last >= 5  # the last 5 checkpoints to average
    assert (d.beam, d.len_penalty, d.max_len_a, d.max_len_b) == (4, 0.6, 1.0, 50)
