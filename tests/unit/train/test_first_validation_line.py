"""The line said before the first validation of a long start names the start: a new run's, or a resumption's."""

from types import SimpleNamespace

import pytest

from tformer_cli.train import loop


@pytest.mark.parametrize("resumed, since", [(False, "the run started"), (True, "the run resumed")])
def test_the_first_validation_says_since_when(resumed, since):
    said: list[str] = []
    training = SimpleNamespace(
        valid_took=None,  # no validation yet since this start
        begun=0.0,  # long ago: past FIRST_VALIDATION_SAID_AFTER
        progress=loop.Progress(step=16),
        resumed=resumed,
        log=SimpleNamespace(say=said.append),
    )
    loop._Training.announce_validation(training)
    assert said == [f"validating at update 16 (the first validation since {since})"]
