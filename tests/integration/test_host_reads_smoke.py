"""bench/host_reads.py: `tformer train` on the meta device, its reads of device values per update by line."""

import sys
from pathlib import Path

import pytest
from tiny_models import SESSIONS

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
import host_reads  # noqa: E402

# 36 sessions to train: 9 batches of 4, 3 updates of 3 micro-batches an epoch
LM = [*SESSIONS, "model.kind=lm", "data.sessions.n_sessions=56", "train.batch_size=4"]


@pytest.mark.parametrize("update_freq", [1, 3])
def test_an_update_reads_the_device_once_besides_the_models_padding_check(update_freq):
    """The finiteness of the update's loss and gradient, once whatever the micro-batches; the eager model's
    "any padding?" (model/cache.py, for the kernels' no-mask path) once per micro-batch; no more."""
    per_update, at_end = host_reads.reads_per_update(None, [*LM, f"train.update_freq={update_freq}"], 2)
    by_function = {site.split()[-1]: count for site, count in per_update.items()}
    assert by_function == {"_optimizer_step": 1, "can_drop_mask": update_freq}
    assert any("host" in site for site in at_end)  # the log line's one read of the training statistics


def test_training_is_on_its_own_device_again_after():
    from tformer_cli.train import loop

    resolve_device = loop.resolve_device
    host_reads.reads_per_update(None, LM, 1)
    assert loop.resolve_device is resolve_device
