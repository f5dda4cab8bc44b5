"""bench/gpu_decode.py in smoke mode (tiny shapes on the CPU): every row of its table is measured for each
system, and a trained run translates the same through the static and the dynamic path. The GPU numbers need a GPU."""

import re
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import gpu_decode  # noqa: E402


def test_smoke_run_fills_the_table_and_compares_the_paths_on_a_trained_run(translation_run, tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    src = translation_run / "valid.en"
    report = gpu_decode.main(["--smoke", "--run", str(translation_run / "runs/mt"), "--src", str(src)])
    assert (tmp_path / "gpu_decode.md").read_text() == report
    rows = [line for line in report.split("\n") if re.match(r"\| fp(16|32) \|", line)]
    assert len(rows) == len(gpu_decode.ROWS)
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[3].replace(",", "")) > 0 and float(cells[4].replace(",", "")) > 0  # tformer's two paths
    n = len(src.read_text().strip().split("\n"))
    assert f"identical hypotheses (the tokens of each n-best entry): {n:,} of {n:,} lines" in report
