"""What `eval` and `translate -i FILE` say while they work (log.LineProgress): off a terminal a plain line at
most every `every` seconds and one at the end, with the time left from the command's own average rate."""

import re

from tformer_cli import log
from tformer_cli.log import LineProgress


def test_plain_lines_count_the_lines_and_estimate_the_time_left(capsys, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(log.time, "monotonic", lambda: now[0])
    with LineProgress("translated", 3003, every=30.0) as progress:
        now[0] += 10.0
        progress.advance(1000)  # 10 s: less than `every`, nothing said
        now[0] += 20.0
        progress.advance(1000)  # 30 s: 2,000 lines at 66.7 lines/s, 1,003 left: 15 s
        now[0] += 5.0
        progress.advance(1003)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "translated 2,000/3,003 lines elapsed 0:00:30 eta 0:00:15",
        "translated 3,003/3,003 lines elapsed 0:00:35 eta 0:00:00",
    ]


def test_a_short_command_says_nothing_and_no_lines_is_no_progress(capsys):
    with LineProgress("translated", 10) as progress:
        progress.advance(10)
    with LineProgress("scored", 0, unit="tokens") as progress:
        progress.advance(0)
    assert capsys.readouterr().err == ""


def test_the_count_never_passes_the_total(capsys, monkeypatch):
    now = [0.0]
    monkeypatch.setattr(log.time, "monotonic", lambda: now[0])
    with LineProgress("scored", 100, unit="tokens", every=1.0) as progress:
        now[0] += 2.0
        progress.advance(60)
        now[0] += 2.0
        progress.advance(60)
    said = capsys.readouterr().err.splitlines()
    assert said[0] == "scored 60/100 tokens elapsed 0:00:02 eta 0:00:01"
    assert re.fullmatch(r"scored 100/100 tokens elapsed 0:00:04 eta 0:00:00", said[-1])
