"""prepare -> train -> translate / generate / eval, in-process, on tiny corpora made here."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.decoding.load import load_for_decoding

runner = CliRunner()


def _invoke(args):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output + str(result.exception)
    return result


def test_translate_keeps_line_count_and_order(translation_run):
    tmp = translation_run
    (tmp / "in.txt").write_text("the cat\n\nwe are the dog\n   \nsmall house\n")
    _invoke(["translate", str(tmp / "runs/mt"), "-i", str(tmp / "in.txt"), "-o", str(tmp / "out.txt")])
    out = (tmp / "out.txt").read_text().split("\n")
    assert len(out) == 6 and out[-1] == "" and out[1] == "" and out[3] == ""
    greedy = runner.invoke(app, ["translate", str(tmp / "runs/mt"), "decode.beam=1", "-i", str(tmp / "in.txt")])
    assert greedy.exit_code == 0 and len(greedy.stdout.split("\n")) == 6


def test_translate_nbest_and_stdin(translation_run):
    tmp = translation_run
    result = runner.invoke(app, ["translate", str(tmp / "runs/mt"), "decode.nbest=3"], input="the red cat\n")
    assert result.exit_code == 0, result.output
    rows = [line.split("\t") for line in result.stdout.strip().split("\n")]
    assert len(rows) == 3 and all(r[0] == "1" for r in rows)
    scores = [float(r[1]) for r in rows]
    assert scores == sorted(scores, reverse=True)
    result = runner.invoke(app, ["translate", str(tmp / "runs/mt"), "decode.nbest=3"], input="the cat\n\nthe dog\n")
    rows = [line.split("\t") for line in result.stdout.split("\n")[:-1]]
    assert [r[0] for r in rows] == ["1"] * 3 + ["2"] * 3 + ["3"] * 3  # an empty line keeps its block of three
    assert rows[3:6] == [["2", "0.0000", ""]] * 3


def test_translate_refuses_model_overrides(translation_run):
    result = runner.invoke(app, ["translate", str(translation_run / "runs/mt"), "model.d_model=64"])
    assert result.exit_code == 1 and "only decode.*, run.threads, run.device can change here" in result.stderr


def test_eval_bleu_matches_sacrebleu_and_prints_signature(translation_run):
    tmp = translation_run
    result = _invoke(
        [
            "eval",
            str(tmp / "runs/mt"),
            "--src",
            str(tmp / "valid.en"),
            "--ref",
            str(tmp / "valid.de"),
            "--test-set",
            "tiny-valid",
        ]
    )
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp" in result.stdout
    hyp = tmp / "runs/mt/eval_tiny-valid_best_beam4.hyp"
    cli = subprocess.run(
        [sys.executable, "-m", "sacrebleu", str(tmp / "valid.de"), "-i", str(hyp), "-m", "bleu", "-w", "2"],
        capture_output=True,
        text=True,
        check=True,
    )
    reference = json.loads(cli.stdout)
    saved = json.loads((tmp / "runs/mt/eval_tiny-valid_best_beam4.json").read_text())
    assert saved["bleu"] == reference["score"]
    assert saved["bleu_signature"] == reference["signature"]
    assert f"BLEU {reference['score']:.2f}" in result.stdout
    args = ["eval", str(tmp / "runs/mt"), "--src", str(tmp / "valid.en"), "--ref", str(tmp / "valid.de")]
    _invoke([*args, "--test-set", "tiny-valid", "decode.beam=1"])  # a second setting: its own files
    greedy = json.loads((tmp / "runs/mt/eval_tiny-valid_best_greedy.json").read_text())
    assert greedy["decode"]["beam"] == 1
    assert saved["decode"] == {
        "beam": 4,
        "len_penalty": 0.6,
        "average_last": 0,
        "ensemble": [],
        "precision": "fp32",
        "min_len": 0,
        "no_repeat_ngram": 0,
        "repetition_penalty": 1.0,
    }
    assert json.loads((tmp / "runs/mt/eval_tiny-valid_best_beam4.json").read_text()) == saved


def test_bf16_decoding_casts_the_weights_and_writes_its_own_eval_files(translation_run):
    tmp = translation_run
    model = load_for_decoding(tmp / "runs/mt", ["decode.precision=bf16"]).model
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.lm_head.weight is model.decoder.embedding.weight  # still tied
    assert all(b.dtype == torch.float32 for b in model.buffers())  # the sinusoidal table is not rounded
    args = ["eval", str(tmp / "runs/mt"), "--src", str(tmp / "valid.en"), "--ref", str(tmp / "valid.de")]
    _invoke([*args, "--test-set", "tiny-bf16", "decode.beam=1"])
    _invoke([*args, "--test-set", "tiny-bf16", "decode.beam=1", "decode.precision=bf16"])
    fp32 = json.loads((tmp / "runs/mt/eval_tiny-bf16_best_greedy.json").read_text())
    bf16 = json.loads((tmp / "runs/mt/eval_tiny-bf16_best_greedy_bf16.json").read_text())
    assert fp32["decode"]["precision"] == "fp32" and bf16["decode"]["precision"] == "bf16"
    fp32_hyps = (tmp / "runs/mt/eval_tiny-bf16_best_greedy.hyp").read_text().split("\n")
    bf16_hyps = (tmp / "runs/mt/eval_tiny-bf16_best_greedy_bf16.hyp").read_text().split("\n")
    assert len(bf16_hyps) == len(fp32_hyps)
    assert sum(a == b for a, b in zip(fp32_hyps, bf16_hyps, strict=True)) >= 0.9 * len(fp32_hyps)  # rounding only
    fp16 = runner.invoke(
        app, ["translate", str(tmp / "runs/mt"), "run.device=cpu", "decode.precision=fp16"], input="the cat\n"
    )
    assert fp16.exit_code == 1 and "decode.precision=fp16 needs CUDA" in fp16.stderr


@pytest.mark.cuda
def test_fp16_decoding_on_cuda_translates_as_fp32_does_up_to_rounding(translation_run):
    tmp = translation_run
    args = ["eval", str(tmp / "runs/mt"), "--src", str(tmp / "valid.en"), "--ref", str(tmp / "valid.de")]
    _invoke([*args, "--test-set", "tiny-fp16", "run.device=cuda", "decode.beam=4"])
    _invoke([*args, "--test-set", "tiny-fp16", "run.device=cuda", "decode.beam=4", "decode.precision=fp16"])
    fp32_hyps = (tmp / "runs/mt/eval_tiny-fp16_best_beam4.hyp").read_text().split("\n")
    fp16_hyps = (tmp / "runs/mt/eval_tiny-fp16_best_beam4_fp16.hyp").read_text().split("\n")
    assert len(fp16_hyps) == len(fp32_hyps)
    assert sum(a == b for a, b in zip(fp32_hyps, fp16_hyps, strict=True)) >= 0.9 * len(fp32_hyps)  # rounding only


def test_a_result_of_other_files_is_replaced_with_a_warning_that_names_them(translation_run, tmp_path):
    run, first, second = translation_run / "runs/mt", tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        folder.mkdir()
        (folder / "src").write_text("the cat\n")
        (folder / "ref").write_text("die katze\n")
    args = ["eval", str(run), "run.device=cpu", "--test-set", "twice"]
    runs = [
        runner.invoke(app, [*args, "--src", str(f / "src"), "--ref", str(f / "ref")]) for f in (first, first, second)
    ]
    assert [r.exit_code for r in runs] == [0, 0, 0]
    assert "warning: replacing" not in runs[1].stderr  # the same files again
    said = [line for line in runs[2].stderr.splitlines() if line.startswith("warning: replacing")]
    assert said == [
        f"warning: replacing {run}/eval_twice_best_beam4.json, the result of other files ({first}/src, {first}/ref)"
    ]
    saved = json.loads((run / "eval_twice_best_beam4.json").read_text())
    assert saved["scored"] == [str(second / "src"), str(second / "ref")]


def _unnamed_results(run: Path) -> dict[Path, int]:
    """`eval`'s results without --test-set in `run`, with their modification times."""
    return {path: path.stat().st_mtime_ns for path in run.glob("eval_unnamed_*")}


def test_a_line_count_mismatch_names_both_files_before_anything_is_translated(translation_run, tmp_path):
    h, r = tmp_path / "h", tmp_path / "r"
    h.write_text("a\nb\n")
    r.write_text("a\n")
    result = runner.invoke(app, ["bleu", str(h), "--ref", str(r)])
    assert result.exit_code == 1 and result.stderr.splitlines() == [
        f"error: {h} has 2 lines and {r} 1: each hypothesis needs its reference on the same line"
    ]
    run = translation_run / "runs/mt"
    before = _unnamed_results(run)  # the shared run may hold other tests' results: none of them may change
    result = runner.invoke(app, ["eval", str(run), "--src", str(h), "--ref", str(r), "run.device=cpu"])
    assert result.exit_code == 1 and result.stderr.splitlines() == [  # one line: no translation progress before it
        f"error: {h} has 2 lines and {r} 1: each source line needs its reference on the same line"
    ]
    assert _unnamed_results(run) == before


def test_generate_is_reproducible_with_a_seed(lm_run):
    args = [
        "generate",
        str(lm_run / "runs/lm"),
        "--prompt",
        "the cat",
        "decode.max_new_tokens=12",
        "decode.temperature=1.0",
        "decode.top_p=0.9",
        "decode.seed=3",
    ]
    first, second = _invoke(args), _invoke(args)
    assert first.stdout == second.stdout and first.stdout.startswith("the cat")
    assert not first.stdout.startswith("the cat") or first.stdout[7:8] in (" ", "\n", "")  # no "catthe"
    assert _invoke([*args, "decode.precision=bf16"]).stdout.startswith("the cat")


def test_eval_lm_blocks_and_sliding_window(lm_run):
    blocks = _invoke(["perplexity", str(lm_run / "runs/lm"), str(lm_run / "valid.txt")])
    assert "perplexity per token" in blocks.stdout and "per word" in blocks.stdout
    sliding = _invoke(["perplexity", str(lm_run / "runs/lm"), str(lm_run / "valid.txt"), "--stride", "32"])
    block_json = json.loads((lm_run / "runs/lm/eval_valid.txt_best_blocks.json").read_text())
    stride_json = json.loads((lm_run / "runs/lm/eval_valid.txt_best_stride32.json").read_text())
    assert stride_json["nll"] == pytest.approx(block_json["nll"], rel=1e-5)
    assert "sliding window 32, stride 32" in sliding.stdout
    bf16 = _invoke(["perplexity", str(lm_run / "runs/lm"), str(lm_run / "valid.txt"), "decode.precision=bf16"])
    assert "blocks of 32, bf16 weights" in bf16.stdout
    bf16_json = json.loads((lm_run / "runs/lm/eval_valid.txt_best_blocks_bf16.json").read_text())
    assert bf16_json["precision"] == "bf16" and block_json["precision"] == "fp32"
    assert bf16_json["ppl_token"] == pytest.approx(block_json["ppl_token"], rel=0.01)  # rounding, not a new model


def test_eval_lm_at_a_window_longer_than_the_training_blocks(lm_run):
    """--window scores beyond data.block_size (32 here): the extrapolation the positions' chapter is about."""
    run, valid = str(lm_run / "runs/lm"), str(lm_run / "valid.txt")
    out = _invoke(["perplexity", run, valid, "--window", "64", "--stride", "16"])
    assert "sliding window 64, stride 16" in out.stdout
    wide = json.loads((lm_run / "runs/lm/eval_valid.txt_best_w64_stride16.json").read_text())
    _invoke(["perplexity", run, valid, "--window", "64"])
    blocks = json.loads((lm_run / "runs/lm/eval_valid.txt_best_w64_blocks.json").read_text())
    trained = _invoke(["perplexity", run, valid, "--window", "32"])  # the training length: today's names
    assert "blocks of 32" in trained.stdout and (lm_run / "runs/lm/eval_valid.txt_best_blocks.json").is_file()
    assert wide["window"] == blocks["window"] == 64 and wide["tokens"] == blocks["tokens"]
    assert wide["nll"] != blocks["nll"]  # every token but the first window's sees 48 earlier tokens, not 0-63
    bad = runner.invoke(app, ["perplexity", run, valid, "--window", "64", "--stride", "65"])
    assert bad.exit_code == 1 and "--stride 65: must be in 1..64" in bad.output


def test_attention_heatmaps_for_translation(translation_run):
    tmp = translation_run
    result = _invoke(["attention", str(tmp / "runs/mt"), "--text", "the red cat", "-o", str(tmp / "att.png")])
    assert "3 attention layers" in result.stdout  # encoder self, decoder self, cross (1 layer each)
    assert (tmp / "att.png").stat().st_size > 1000


def test_validation_reports_bleu_and_translate_can_average(translation_run):
    tmp = translation_run
    records = [json.loads(line) for line in (tmp / "runs/mt/metrics.jsonl").read_text().splitlines()]
    valid = [r for r in records if r["split"] == "valid"]
    assert valid and all(0.0 <= r["bleu"] <= 100.0 for r in valid)
    (tmp / "avg_in.txt").write_text("the cat\nsmall house\n")
    result = _invoke(["translate", str(tmp / "runs/mt"), "--average", "2", "-i", str(tmp / "avg_in.txt")])
    assert len(result.stdout.split("\n")) == 3
    too_many = runner.invoke(app, ["translate", str(tmp / "runs/mt"), "--average", "9", "-i", str(tmp / "avg_in.txt")])
    assert too_many.exit_code == 1 and "only" in too_many.stderr


def test_export_translation_checkpoint_needs_no_training_data(translation_run, tmp_path):
    tmp = translation_run
    moved = tmp / "data_moved"
    (tmp / "data").rename(moved)
    try:
        result = _invoke(["export", str(tmp / "runs/mt"), "-o", str(tmp_path / "mt.safetensors")])
    finally:
        moved.rename(tmp / "data")
    assert "mt.safetensors" in result.stdout and (tmp_path / "mt.safetensors").stat().st_size > 1000
