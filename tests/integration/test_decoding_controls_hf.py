"""The decoding controls (decode.min_len, decode.no_repeat_ngram, decode.repetition_penalty) give what Hugging Face's
`generate` gives on the exported model with the export's generation_config, greedy and beam 4, and what CTranslate2
gives (greedy; beam search refused); decode.samples through `tformer generate`.

The translation run is trained here to repeat: every target is the source's German words twice ("the cat" ->
"das katze das katze"), so that its outputs hold repeated n-grams and tokens, and each control changes them.
"""

import random
import re

import pytest
from tiny_models import CPU, GERMAN, ON_CPU, WORDS, tiny_mt_training, word_for_word, write_pairs
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.decoding.stream import SAMPLE_SEPARATOR
from tformer_cli.run import load_run

transformers = pytest.importorskip("transformers")
runner = CliRunner()
CONTROLS = {
    "no_repeat_ngram 2": ["decode.no_repeat_ngram=2"],
    "repetition_penalty 1.5": ["decode.repetition_penalty=1.5"],
    "min_len 14": ["decode.min_len=14"],  # longer than most outputs: EOS held back
    "all three": ["decode.no_repeat_ngram=3", "decode.repetition_penalty=1.2", "decode.min_len=10"],
}
SEARCHES = {"greedy": ["decode.beam=1"], "beam 4": ["decode.beam=4", "decode.len_penalty=0"]}


def _ok(args) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output + str(result.exception)
    return result.stdout


@pytest.fixture(scope="module")
def repeater(tmp_path_factory):
    """A translation run trained to write each source's translation twice, and 16 held-out lines."""
    tmp = tmp_path_factory.mktemp("repeater")
    rng = random.Random(0)
    english = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 4))) for _ in range(600)]
    german = word_for_word(GERMAN)
    write_pairs(tmp, {"train": english[:560], "valid": english[560:600]}, lambda line: f"{german(line)} {german(line)}")
    common = [f"data.train={tmp}/train", f"data.valid={tmp}/valid", f"data.dir={tmp}/data", "tokenizer.vocab_size=60"]
    _ok(["prepare", "recipes/wmt14_base.yaml", *common])
    _ok(
        [
            "train",
            "recipes/wmt14_base.yaml",
            *common,
            f"run.out_dir={tmp}/runs",
            "run.name=mt",
            *tiny_mt_training(64, 600, 300),
            *CPU,
        ]
    )
    (tmp / "in.en").write_text("\n".join(english[584:600]) + "\n")
    return tmp


def _translate(repeater, settings: list[str], *extra) -> list[str]:
    args = ["translate", repeater / "runs" / "mt", "-i", repeater / "in.en", *ON_CPU, *settings, *extra]
    return _ok(args).splitlines()


def _hf_export(repeater, folder, settings: list[str]):
    from tformer_cli.export.hugging_face import export_hugging_face

    run = load_run(repeater / "runs" / "mt", settings, device="cpu", cast=False)
    export_hugging_face(run, folder)
    return transformers.AutoTokenizer.from_pretrained(folder)


def test_the_run_repeats(repeater):
    """What the controls act on: greedy and beam outputs hold the translation twice."""
    for search in SEARCHES.values():
        lines = _translate(repeater, search)
        assert sum(len(line.split()) >= 4 and line.split()[:2] == line.split()[2:4] for line in lines) >= 4, lines


@pytest.mark.parametrize("search", SEARCHES.values(), ids=SEARCHES.keys())
@pytest.mark.parametrize("controls", CONTROLS.values(), ids=CONTROLS.keys())
def test_hf_generate_with_the_exports_generation_config_is_tformer_translate(repeater, tmp_path, search, controls):
    """Stock `generate(**ids)`, the whole batch padded; the same lines as `tformer translate`, and not those of
    the same search without the control."""
    settings = [*search, *controls]
    tok = _hf_export(repeater, tmp_path / "hf", settings)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf")
    lines = (repeater / "in.en").read_text().splitlines()
    theirs = tok.batch_decode(model.generate(**tok(lines, return_tensors="pt", padding=True)), skip_special_tokens=True)
    ours = _translate(repeater, settings)
    assert theirs == ours
    assert ours != _translate(repeater, search)  # the control changed the outputs


@pytest.mark.parametrize("search", SEARCHES.values(), ids=SEARCHES.keys())
def test_hf_custom_generate_is_tformer_translate_with_the_controls(repeater, tmp_path, monkeypatch, search):
    """trust_remote_code: tformer's GNMT ranking and per-sentence limits, which the limit wins over min_len."""
    monkeypatch.setattr(transformers.dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    settings = [search[0], *CONTROLS["all three"], "decode.max_len_a=1.5", "decode.max_len_b=3"]  # some lines end
    tok = _hf_export(repeater, tmp_path / "hf", settings)  # at their limit, before min_len
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    lines = (repeater / "in.en").read_text().splitlines()
    ids = tok(lines, return_tensors="pt", padding=True)
    theirs = tok.batch_decode(model.generate(**ids), skip_special_tokens=True)
    assert theirs == _translate(repeater, settings)


def _one_error_line(result, *parts):
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and result.stdout == "", (result.exit_code, result.output)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for part in parts:
        assert part in lines[0], (part, lines[0])


@pytest.mark.parametrize("controls", CONTROLS.values(), ids=CONTROLS.keys())
def test_ctranslate2_greedy_with_the_controls_is_native(repeater, controls):
    pytest.importorskip("ctranslate2")
    settings = ["decode.beam=1", *controls]
    assert _translate(repeater, settings, "--engine", "ctranslate2") == _translate(repeater, settings)


def test_ctranslate2_beam_search_with_a_control_is_refused_in_one_line(repeater):
    pytest.importorskip("ctranslate2")
    result = runner.invoke(
        app,
        ["translate", str(repeater / "runs" / "mt"), "-i", str(repeater / "in.en"), *ON_CPU, "--engine", "ctranslate2"]
        + ["decode.beam=4", "decode.no_repeat_ngram=2"],
    )
    _one_error_line(result, "decode.no_repeat_ngram 2", "--engine native")


def test_the_ctranslate2_readme_call_carries_the_controls(repeater, tmp_path):
    pytest.importorskip("ctranslate2")
    from tformer_cli.export.ctranslate2 import export_ctranslate2

    settings = ["decode.beam=1", *CONTROLS["all three"]]  # as a recipe's decode section would set them
    export_ctranslate2(load_run(repeater / "runs" / "mt", settings, device="cpu", cast=False), tmp_path / "ct2", None)
    code = re.search(r"```python\n(.*?)```", (tmp_path / "ct2" / "README.md").read_text(), re.S).group(1)
    assert "no_repeat_ngram_size=3," in code and "repetition_penalty=1.2," in code
    scope = {"DIR": str(tmp_path / "ct2")}
    exec(code, scope)  # the README's own code
    lines = (repeater / "in.en").read_text().splitlines()
    assert scope["translate"](lines) == _translate(repeater, settings)


# Language models: `tformer generate`


LM_CONTROLS = {  # the controls, and the settings whose output they change
    "no_repeat_ngram 2": (["decode.no_repeat_ngram=2"], []),  # the line ends after 2 tokens
    # min_len longer than the line no_repeat_ngram 2 alone ends (the tiny model's: 2 tokens with torch 2.13, ~10
    # with torch 2.11), so that it changes the output on either
    "no_repeat_ngram 2, min_len 20": (["decode.no_repeat_ngram=2", "decode.min_len=20"], ["decode.no_repeat_ngram=2"]),
    "repetition_penalty 2": (["decode.repetition_penalty=2.0"], []),  # "the cat cat cat ..." without it
}


@pytest.mark.parametrize("controls, without", LM_CONTROLS.values(), ids=LM_CONTROLS.keys())
def test_tformer_generate_with_the_controls_is_hf_generate(lm_run, tmp_path, controls, without):
    """Greedy, prompt "the cat": HF's `generate(**tok([prompt]))` with the export's config (the tokenizer puts
    `</s>` first, as tformer does: the controls see the same tokens)."""
    from tformer_cli.export.hugging_face import export_hugging_face

    settings = ["decode.max_new_tokens=24", *controls]
    run = load_run(lm_run / "runs" / "lm", settings, device="cpu", cast=False)
    export_hugging_face(run, tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    out = model.generate(**tok(["the cat"], return_tensors="pt"))  # greedy, 24 new tokens, from the config
    theirs = tok.decode(out[0], skip_special_tokens=True)
    ours = _ok(["generate", lm_run / "runs" / "lm", "--prompt", "the cat", *ON_CPU, *settings]).strip()
    assert ours == theirs.strip()
    other = ["generate", lm_run / "runs" / "lm", "--prompt", "the cat", *ON_CPU, "decode.max_new_tokens=24", *without]
    assert ours != _ok(other).strip()


def test_tformer_generate_writes_n_samples(lm_run):
    args = ["generate", lm_run / "runs" / "lm", "--prompt", "the cat", *ON_CPU, "decode.temperature=1.0"]
    out = _ok([*args, "decode.samples=3", "decode.seed=4", "decode.max_new_tokens=12"])
    samples = out.rstrip("\n").split(SAMPLE_SEPARATOR)
    assert len(samples) == 3 and len(set(samples)) == 3 and all(s.startswith("the cat") for s in samples)
    assert _ok([*args, "decode.samples=3", "decode.seed=4", "decode.max_new_tokens=12"]) == out


def test_tformer_generate_refuses_samples_without_sampling_in_one_line(lm_run):
    result = runner.invoke(
        app, ["generate", str(lm_run / "runs" / "lm"), "--prompt", "the cat", *ON_CPU, "decode.samples=2"]
    )
    _one_error_line(result, "decode.samples 2", "decode.temperature")
