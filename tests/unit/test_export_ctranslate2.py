"""The CTranslate2 export: tformer's weights laid into CTranslate2's specs compute tformer's log-probabilities.

Every parameter of the tiny models is perturbed first, so that a weight put in the wrong place (a norm's
gain for its bias, a key for a query) changes the outputs.
"""

import dataclasses
import hashlib
import json
import sys
from pathlib import Path

import ctranslate2
import pytest
import torch

from tformer_cli.decoding.search import generate
from tformer_cli.decoding.settings import SearchSettings
from tformer_cli.errors import TformerError
from tformer_cli.export.ctranslate2 import (
    build_spec,
    check_exportable,
    check_quantization,
    export_ctranslate2,
    run_export,
    write_model,
)
from tformer_cli.export.folder import MARKER
from tformer_cli.model import build_model
from tformer_cli.run import Run
from tformer_cli.schema import Config, ModelConfig
from tformer_cli.tokenizer import BOS_ID, EOS_ID, Tokenizer

VOCAB = 50
PIECES = ["<pad>", "<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(4, VOCAB)]
SMALL = dict(d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, max_len=64)


def perturbed(kind: str, vocab_size: int = VOCAB, **options) -> tuple[torch.nn.Module, ModelConfig]:
    """A tiny seeded model of `kind` whose every parameter (norms and biases included) is moved off its init."""
    cfg = ModelConfig(kind=kind, **{**SMALL, **options})
    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "kind"}
    torch.manual_seed(0)
    model = build_model(kind, vocab_size=vocab_size, pad_id=0, **fields).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.2)
    return model, cfg


def exported(model, cfg: ModelConfig, folder: Path, quantization: str | None = None) -> Path:
    folder.mkdir(exist_ok=True)
    write_model(build_spec(model, cfg, PIECES), folder, quantization)
    return folder


SEQ2SEQ = {
    "post-LN (the paper)": {},
    "pre-LN": dict(norm_placement="pre"),
    "learned positions": dict(pos="learned"),
    "RoPE": dict(pos="rope", norm_placement="pre"),
    "no positions": dict(pos="none"),
    "GELU, RMSNorm": dict(ffn="gelu", norm="rmsnorm", norm_placement="pre"),
    "SwiGLU, no biases, untied": dict(ffn="swiglu", bias=False, tie_embeddings=False),
    "GQA": dict(n_kv_heads=2),
    "MQA": dict(n_kv_heads=1),
    "shared embeddings, 1 decoder layer": dict(share_all_embeddings=True, n_decoder_layers=1),
}


@pytest.mark.parametrize("options", SEQ2SEQ.values(), ids=SEQ2SEQ.keys())
def test_seq2seq_export_scores_as_tformer(tmp_path, options):
    model, cfg = perturbed("seq2seq", **options)
    translator = ctranslate2.Translator(str(exported(model, cfg, tmp_path)))
    torch.manual_seed(1)
    sources = [torch.randint(4, VOCAB, (n,)).tolist() for n in (5, 11, 1)]
    targets = [torch.randint(4, VOCAB, (n,)).tolist() for n in (9, 2, 4)]
    scored = translator.score_batch(  # the export appends EOS to the source, and scores EOS after the target
        [[PIECES[i] for i in s] for s in sources], [[PIECES[i] for i in t] for t in targets]
    )
    for source, target, result in zip(sources, targets, scored, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([source + [EOS_ID]]), torch.tensor([[BOS_ID] + target]))[0]
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(target + [EOS_ID])[:, None]).squeeze(1)
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, atol=1e-4, rtol=0)


LM = {
    "post-LN": {},
    "pre-LN": dict(norm_placement="pre"),
    "RoPE, SwiGLU, RMSNorm, GQA, no biases": dict(
        pos="rope", norm_placement="pre", ffn="swiglu", norm="rmsnorm", n_kv_heads=2, bias=False
    ),
    "ALiBi, 4 heads": dict(pos="alibi", norm_placement="pre"),
    "ALiBi, 6 heads (not a power of two)": dict(pos="alibi", n_heads=6, d_model=48),
    "learned positions, untied": dict(pos="learned", tie_embeddings=False),
    "no positions": dict(pos="none"),
}


@pytest.mark.parametrize("options", LM.values(), ids=LM.keys())
def test_lm_export_scores_and_continues_as_tformer(tmp_path, options):
    model, cfg = perturbed("lm", **options)
    generator = ctranslate2.Generator(str(exported(model, cfg, tmp_path)))
    torch.manual_seed(1)
    texts = [[EOS_ID] + torch.randint(4, VOCAB, (n,)).tolist() for n in (20, 6)]
    for text, result in zip(texts, generator.score_batch([[PIECES[i] for i in t] for t in texts]), strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([text]))[0, :-1]
        expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(text[1:])[:, None]).squeeze(1)
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, atol=1e-4, rtol=0)
    prompt = texts[1]
    ours = generate(model, torch.tensor([prompt]), SearchSettings(max_new_tokens=24))[0, len(prompt) :].tolist()
    theirs = generator.generate_batch(
        [[PIECES[i] for i in prompt]], max_length=24, sampling_topk=1, include_prompt_in_result=False, end_token=[]
    )[0].sequences_ids[0]
    assert theirs == ours


def test_the_norm_epsilon_is_tformers(tmp_path):
    model, cfg = perturbed("seq2seq", norm="rmsnorm")  # CTranslate2's RMSNorm default is 1e-6, tformer's 1e-5
    config = json.loads((exported(model, cfg, tmp_path) / "config.json").read_text())
    assert config["layer_norm_epsilon"] == 1e-5
    assert (config["decoder_start_token"], config["add_source_eos"]) == ("<s>", True)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(kind="classifier"), "model.kind=classifier is not supported by the CTranslate2 export"),
        (dict(kind="lstm"), "model.kind=lstm is not supported by the CTranslate2 export"),
        (dict(kind="seq2seq", pos="alibi"), "model.pos=alibi is not supported by the CTranslate2 export"),
    ],
)
def test_what_ctranslate2_cannot_represent_is_refused_in_one_line(options, message):
    with pytest.raises(TformerError, match=message) as error:
        check_exportable(ModelConfig(**options))
    assert "\n" not in str(error.value)


def test_an_alibi_language_model_is_exported():
    check_exportable(ModelConfig(kind="lm", pos="alibi"))  # no error: only an encoder's ALiBi is refused


def test_an_unknown_quantization_is_refused_in_one_line():
    with pytest.raises(TformerError, match="--quantization int4: choose int8, int8_float16, float16"):
        check_quantization("int4")
    for ok in (None, "int8", "int8_float16", "float16"):
        check_quantization(ok)


def test_int8_export_is_smaller_and_close(tmp_path):
    model, cfg = perturbed("seq2seq", d_model=64, d_ff=256)
    fp32 = exported(model, cfg, tmp_path / "fp32")
    int8 = exported(model, cfg, tmp_path / "int8", "int8")
    assert (int8 / "model.bin").stat().st_size < 0.5 * (fp32 / "model.bin").stat().st_size
    source, target = [["t5", "t9", "t17"]], [["t8", "t4"]]
    exact = ctranslate2.Translator(str(fp32)).score_batch(source, target)[0].log_probs
    rounded = ctranslate2.Translator(str(int8)).score_batch(source, target)[0].log_probs
    assert rounded != exact and max(abs(a - b) for a, b in zip(exact, rounded, strict=True)) < 0.5


# ---------------------------------------------------------------- a run's export


@pytest.fixture
def run(tokenizer_dir, tmp_path) -> Run:
    """A seq2seq Run over the 40-piece test tokenizer, its checkpoint a file in a run's checkpoints/ folder."""
    tokenizer = Tokenizer(tokenizer_dir / "spm.model")
    model, cfg = perturbed("seq2seq", vocab_size=tokenizer.vocab_size)
    checkpoint = tmp_path / "run" / "checkpoints" / "best.pt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"the checkpoint's bytes")
    return Run(model, Config(model=cfg), tokenizer, checkpoint, tmp_path / "run", 0, {}, tokenizer.fingerprint)


def test_a_run_export_holds_model_tokenizer_and_marker(run, tmp_path):
    export_ctranslate2(run, tmp_path / "out", "int8")
    names = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"model.bin", "config.json", "shared_vocabulary.json", "spm.model", MARKER} <= names
    marker = json.loads((tmp_path / "out" / MARKER).read_text())
    sha = hashlib.sha256(b"the checkpoint's bytes").hexdigest()
    assert marker["checkpoints"] == [{"file": str(run.checkpoint.resolve()), "sha256": sha, "step": None}]
    assert (marker["quantization"], marker["ctranslate2"]) == ("int8", ctranslate2.__version__)
    vocabulary = json.loads((tmp_path / "out" / "shared_vocabulary.json").read_text())
    assert vocabulary == run.tokenizer.pieces(list(range(run.tokenizer.vocab_size)))


def test_an_export_replaces_an_earlier_export_but_no_other_folder(run, tmp_path):
    export_ctranslate2(run, tmp_path / "out", None)
    (tmp_path / "out" / "stale.txt").write_text("from the earlier export")
    export_ctranslate2(run, tmp_path / "out", None)
    assert not (tmp_path / "out" / "stale.txt").exists() and (tmp_path / "out" / "model.bin").is_file()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(TformerError, match="is a folder that is not a tformer export"):
        export_ctranslate2(run, tmp_path / "mine", None)
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


def test_the_run_export_is_reused_while_the_checkpoint_is_unchanged(run):
    built = []
    folder = run_export(run, None, built.append)
    assert folder == run.run_dir / "ctranslate2" / "best_float32" and len(built) == 1
    inode = (folder / "model.bin").stat().st_ino
    assert run_export(run, None, built.append) == folder and len(built) == 1  # reused, not rewritten
    assert (folder / "model.bin").stat().st_ino == inode
    run.checkpoint.write_bytes(b"a newer checkpoint")
    run_export(run, None, built.append)
    assert len(built) == 2 and (folder / "model.bin").stat().st_ino != inode
    assert run_export(run, "int8", built.append).name == "best_int8" and len(built) == 3


def test_a_missing_ctranslate2_names_the_extra(run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # `import ctranslate2` now raises ImportError
    with pytest.raises(TformerError) as error:
        export_ctranslate2(run, tmp_path / "out", None)
    assert str(error.value).startswith('this needs the `ctranslate2` package: pip install "tformer-cli[export]"')
    assert "\n" not in str(error.value) and not (tmp_path / "out").exists()
