"""`tformer eval` reports TER beside BLEU and chrF with sacreBLEU's signature, on the terminal and in eval_*.json."""

import json

from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.metrics import ter

runner = CliRunner()

# TER by hand: 3 insertions (on the mat) and 1 substitution (big/small) over 6 + 3 reference words
HYP = ["the cat sat", "a big dog"]
REF = ["the cat sat on the mat", "a small dog"]


def test_ter_is_edits_per_reference_word_with_its_signature():
    scores = ter(HYP, REF)
    assert scores["ter"] == round(100 * 4 / 9, 2)
    assert scores["ter_signature"].startswith("nrefs:1|case:lc|tok:tercom|")
    assert ter(REF, REF)["ter"] == 0.0


def test_eval_of_files_prints_ter_and_its_signature(tmp_path):
    (tmp_path / "hyp").write_text("\n".join(HYP) + "\n")
    (tmp_path / "ref").write_text("\n".join(REF) + "\n")
    result = runner.invoke(app, ["bleu", str(tmp_path / "hyp"), "--ref", str(tmp_path / "ref")])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.stdout.splitlines() if line.startswith("TER "))
    assert line.startswith("TER 44.44  signature: nrefs:1|case:lc|tok:tercom|")


def test_eval_of_a_run_saves_ter_beside_bleu(translation_run):
    src, ref = translation_run / "valid.en", translation_run / "valid.de"
    run_dir = translation_run / "runs" / "mt"
    result = runner.invoke(
        app, ["eval", str(run_dir), "--src", str(src), "--ref", str(ref), "--test-set", "terset", "run.device=cpu"]
    )
    assert result.exit_code == 0, result.output
    saved = json.loads(next(run_dir.glob("eval_terset_*.json")).read_text())
    hypotheses = next(run_dir.glob("eval_terset_*.hyp")).read_text().splitlines()
    assert saved["ter"] == ter(hypotheses, ref.read_text().splitlines())["ter"]
    assert saved["ter_signature"].startswith("nrefs:1|")
    assert f"TER {saved['ter']:.2f}  signature: {saved['ter_signature']}" in result.stdout
