"""The sessions task (train/tasks.py): a language model over item ids, padding left out of loss and counts."""

import torch
import torch.nn.functional as F

from tformer_cli.config import load_config
from tformer_cli.data import sessions
from tformer_cli.model.lm import LanguageModel
from tformer_cli.train.tasks import SessionTask, make_task

OVERRIDES = [
    "data.kind=sessions",
    "model.kind=lm",
    "data.sessions.n_sessions=100",
    "data.sessions.n_valid=10",
    "data.sessions.n_test=10",
    "data.sessions.n_items=30",
    "data.sessions.session_len=9",
    "data.sessions.min_len=3",
    "model.d_model=16",
    "model.n_heads=2",
    "model.n_layers=1",
    "model.d_ff=32",
    "model.dropout=0.0",
    "train.batch_size=16",
]


def test_a_sessions_recipe_trains_a_language_model_over_its_items():
    task = make_task(load_config(None, OVERRIDES))
    assert isinstance(task, SessionTask) and task.tokenizer_fingerprint is None
    model = task.build_model()
    assert isinstance(model, LanguageModel) and model.lm_head.out_features == 31  # items 1..30 and padding
    assert len(task.train) == 80 and len(task.valid.data) == 10


def test_batches_depend_on_seed_and_epoch_only():
    task = make_task(load_config(None, OVERRIDES))
    again = make_task(load_config(None, OVERRIDES))
    assert [b.tolist() for b in task.batches(3)] == [b.tolist() for b in again.batches(3)]
    assert [b.tolist() for b in task.batches(3)] != [b.tolist() for b in task.batches(4)]
    assert sorted(i for b in task.batches(0) for i in b.tolist()) == list(range(80))


def test_loss_and_count_take_the_real_targets_only():
    task = make_task(load_config(None, OVERRIDES))
    torch.manual_seed(0)
    model = task.build_model()
    batch = task.batches(0)[0]
    rows = task.train.rows(torch.from_numpy(batch))
    real = rows.targets != sessions.PAD_ID
    assert bool((~real).any())  # min_len 3: some targets are padding
    assert task.count(batch) == int(real.sum())
    loss, stats = task.loss_on(model, *task.inputs(batch, torch.device("cpu")))
    expected = F.cross_entropy(model(rows.inputs)[real], rows.targets[real])
    torch.testing.assert_close(loss, expected)
    assert stats.count == int(real.sum())
