"""Stored goldens: what decoding produces and what training computes, from seeded tiny models and data made here,
compared with the outputs stored in tests/goldens/.

- decoding.json, per case (a search, a decoding path or engine, its settings): the token ids decoded by a seeded
  random model, compared exactly, and the hypotheses' scores, within a relative 1e-3 (fp32 only).
- training.json, per model kind: the losses of its first 20 updates (metrics.jsonl, one record per update) and its
  last validation loss, within a relative 1e-4: float sums differ between CPUs (AVX2 or AVX-512 kernels) and
  thread counts, not more. And a resumed run gives the straight run's losses and weights, bit for bit.

A change that alters what decoding or training computes fails here. A change meant to alter it writes the files
again, and the diff of tests/goldens/ shows what changed (review it with the change):

    python tests/unit/test_goldens.py --regenerate              # both files
    python tests/unit/test_goldens.py --regenerate training     # one of them

The decoding models have large random weights and a scaled EOS row (hypotheses end at different lengths), chosen so
that every greedy choice wins by a clear margin (the `test_margins_*` tests): the same ids come out on every CPU,
with 1 or 2 threads. The CTranslate2 cases are skipped where the `ctranslate2` package is not installed.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import random
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import GERMAN, WORDS

from tformer_cli.config import load_config
from tformer_cli.data.prepare import prepare
from tformer_cli.decoding import api, search, translate
from tformer_cli.decoding import ctranslate2 as ct2
from tformer_cli.decoding.ctranslate2 import CT2Translator
from tformer_cli.decoding.ensemble import Ensemble
from tformer_cli.decoding.packed import pack_linears
from tformer_cli.decoding.rules import Hypothesis
from tformer_cli.decoding.settings import SearchSettings
from tformer_cli.export.ctranslate2 import build_spec, position_limit, write_model
from tformer_cli.model import build_model
from tformer_cli.run import cast_weights
from tformer_cli.run.checkpoints import load_checkpoint
from tformer_cli.schema import DecodeConfig, ModelConfig, TokenizerConfig
from tformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, train_sentencepiece
from tformer_cli.train import loop
from tformer_cli.train.store import CheckpointStore

GOLDENS = Path(__file__).resolve().parents[1] / "goldens"
REL = 1e-4  # training losses: what different CPUs and thread counts change
# a hypothesis' score, a sum of up to 13 log-probabilities from logits in the tens: 4e-4 apart between PyTorch's
# vectorised kernels and its scalar ones
SCORE_REL = 1e-3

Output = dict[str, Any]  # {"tokens": nested lists of ids, "scores": the same nesting of floats (searches only)}

# ---------------------------------------------------------------------------------------------------- decoding

VOCAB = 24
WIDTH = dict(d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, max_len=64)
# name: (the model's options, the std of its random matrices, the scale of EOS's output row, the seed), chosen so
# that hypotheses end at different lengths and each greedy choice wins by a clear margin (`test_margins_*`)
SEQ2SEQ = {
    "pre_rope_gqa": (dict(norm_placement="pre", pos="rope", n_kv_heads=2, norm="rmsnorm", ffn="swiglu"), 2.0, 3.0, 18),
    "post_ln": ({}, 1.0, 2.0, 7),  # the paper's: post-LN, sinusoidal positions, ReLU, LayerNorm
    "alibi": (dict(pos="alibi"), 1.5, 2.0, 5),
    "learned_shared": (dict(pos="learned", share_all_embeddings=True, norm_placement="pre"), 1.0, 3.0, 0),
}
LM = {
    "pre_rope": (dict(norm_placement="pre", pos="rope"), 1.0, 1.0, 5),
    "post_sinusoidal": ({}, 1.0, 1.5, 3),
    "alibi_gqa": (dict(norm_placement="pre", pos="alibi", n_kv_heads=1), 1.0, 1.5, 0),
    "learned_swiglu": (dict(norm_placement="pre", pos="learned", ffn="swiglu", norm="rmsnorm"), 0.5, 1.5, 2),
    "lstm": (dict(n_layers=2), 1.0, 3.0, 3),  # the recurrent baseline
}
# the least logit difference between a greedy choice and the runner-up: fp32 differs between CPUs by rounding; bf16
# weights and activations by up to 0.1 in a logit (oneDNN's AVX-512 kernels or PyTorch's AVX2 ones)
MARGIN = {torch.float32: 0.05, torch.bfloat16: 0.5}
GREEDY = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=5, static="never")
BEAM = replace(GREEDY, beam=4, nbest=2, len_penalty=0.6)
GENERATE = DecodeConfig(max_new_tokens=12, static="never")
SAMPLE = replace(GENERATE, temperature=0.9, top_k=12, top_p=0.9, seed=3)


def _randomised(model: torch.nn.Module, std: float, eos_scale: float) -> torch.nn.Module:
    """Every matrix drawn again with std `std` (large logits: clear margins), EOS's output row scaled."""
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0, std)
        model.lm_head.weight[EOS_ID] *= eos_scale
    return model


@functools.cache
def translator(shape: str = "pre_rope_gqa", seed: int = 0, dtype: torch.dtype = torch.float32, packed: bool = True):
    """A seeded random encoder-decoder (`seed` added to the shape's), prepared as `load_for_decoding` prepares one
    on a CPU (linears packed for MKL or oneDNN)."""
    options, std, eos_scale, shape_seed = SEQ2SEQ[shape]
    torch.manual_seed(shape_seed + seed)
    model = build_model("seq2seq", vocab_size=VOCAB, **{**WIDTH, **options}).eval()
    _randomised(model, std, eos_scale)
    cast_weights(model, dtype)
    if packed:
        pack_linears(model)
    return model


@functools.cache
def language_model(shape: str = "pre_rope", dtype: torch.dtype = torch.float32, packed: bool = True):
    """A seeded random decoder-only language model, or the LSTM baseline, prepared as `load_for_decoding` does."""
    options, std, eos_scale, seed = LM[shape]
    torch.manual_seed(seed)
    if shape == "lstm":
        model = build_model("lstm", vocab_size=VOCAB, d_model=32, dropout=0.0, **options).eval()
    else:
        model = build_model("lm", vocab_size=VOCAB, **{**WIDTH, **options}).eval()
    _randomised(model, std, eos_scale)
    cast_weights(model, dtype)
    if packed:
        pack_linears(model)
    return model


def sources() -> torch.Tensor:
    """(6, 8) source ids, rows 1, 3 and 4 ending in padding: sentences of different lengths."""
    src = torch.randint(4, VOCAB, (6, 8), generator=torch.Generator().manual_seed(1))
    src[1, 6:], src[3, 3:], src[4, 5:] = 0, 0, 0
    return src


def prompts() -> torch.Tensor:
    return torch.randint(4, VOCAB, (3, 5), generator=torch.Generator().manual_seed(2))


def hypotheses(nbest: list[list[Hypothesis]], scores: bool = True) -> Output:
    """Each sentence's hypotheses: their tokens, and (`scores`) their scores."""
    out: Output = {"tokens": [[h.tokens for h in hyps] for hyps in nbest]}
    if scores:
        out["scores"] = [[h.score for h in hyps] for hyps in nbest]
    return out


def translated(
    settings: DecodeConfig, model: Callable[[], Any] = translator, max_len: int | None = None, scores: bool = True
) -> Callable[[], Output]:
    """decoding/api.py's `translate_batch` of the sources with `settings` (decode.static picks the path) by
    `model()`; `scores` False: the tokens only (bf16 scores differ between CPUs by more than rounding)."""
    return lambda: hypotheses(
        api.translate_batch(model(), sources(), SearchSettings.from_decode(settings, max_len)), scores
    )


def reference(shape: str, beam: bool) -> Callable[[], Output]:
    """The searches without a cache, recomputing every prefix, on the unpacked model."""
    s = BEAM if beam else GREEDY
    kw = dict(max_len_a=s.max_len_a, max_len_b=s.max_len_b, use_cache=False)
    if beam:
        settings = SearchSettings(beam=s.beam, alpha=s.len_penalty, nbest=s.nbest, **kw)
        return lambda: hypotheses(search.beam_search(translator(shape, packed=False), sources(), settings))
    return lambda: hypotheses(
        [[h] for h in search.greedy(translator(shape, packed=False), sources(), SearchSettings(**kw))]
    )


def generated(settings: DecodeConfig, shape: str = "pre_rope", dtype: torch.dtype = torch.float32):
    """decoding/api.py's `generate` from the prompts with `settings` (decode.static picks the path)."""
    return lambda: {
        "tokens": api.generate(language_model(shape, dtype), prompts(), SearchSettings.from_decode(settings)).tolist()
    }


def generated_reference(settings: DecodeConfig, shape: str) -> Callable[[], Output]:
    """search.generate without a cache, each step recomputing the whole prefix."""

    def decode() -> Output:
        out = search.generate(
            language_model(shape, packed=False),
            prompts(),
            SearchSettings(
                max_new_tokens=settings.max_new_tokens,
                temperature=settings.temperature,
                top_k=settings.top_k,
                top_p=settings.top_p,
                seed=settings.seed,
                eos_id=EOS_ID,
                use_cache=False,
            ),
        )
        return {"tokens": out.tolist()}

    return decode


LINES = ["the cat is red", "we and they", "", "a small dog on the house", "you"]


@functools.cache
def tokenizer() -> Tokenizer:
    """A SentencePiece model of VOCAB pieces (the characters of the lines) trained on made-up lines."""
    lines = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(6)) for i in range(200)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spm.model"
        train_sentencepiece(lines, TokenizerConfig(vocab_size=VOCAB), path)
        return Tokenizer(path)  # read into memory


@functools.cache
def ctranslate2_engine() -> CT2Translator:
    """The CTranslate2 engine of `translator()`'s weights, as `load_engine` makes it from a run's export."""
    import ctranslate2

    options = SEQ2SEQ["pre_rope_gqa"][0]
    cfg = ModelConfig(kind="seq2seq", **{**WIDTH, **options})
    pieces = tokenizer().pieces(list(range(VOCAB)))
    with tempfile.TemporaryDirectory() as tmp:
        write_model(build_spec(translator(packed=False), cfg, pieces), Path(tmp), None)
        engine = ctranslate2.Translator(tmp, device="cpu", intra_threads=torch.get_num_threads())  # read into memory
    return CT2Translator(engine, pieces, position_limit(cfg))


def translated_lines(settings: DecodeConfig, engine: str) -> Callable[[], Output]:
    """The lines translated by decoding/translate.py (`native`) or decoding/ctranslate2.py (`ctranslate2`)."""
    if engine == "native":
        return lambda: hypotheses(translate.translate_lines(translator(), tokenizer(), LINES, settings))
    return lambda: hypotheses(ct2.translate_lines(ctranslate2_engine(), tokenizer(), LINES, settings))


def _translation_cases() -> dict[str, Callable[[], Output]]:
    cases: dict[str, Callable[[], Output]] = {}
    for shape in SEQ2SEQ:
        for name, settings in (("greedy", GREEDY), ("beam", BEAM)):
            cases[f"translate {shape} {name} dynamic"] = translated(settings, functools.partial(translator, shape))
            cases[f"translate {shape} {name} static"] = translated(
                replace(settings, static="always"), functools.partial(translator, shape)
            )
            cases[f"translate {shape} {name} reference"] = reference(shape, name == "beam")
    for name, settings in (("greedy", GREEDY), ("beam", BEAM)):
        for path in ("never", "always"):
            at = f"{name} {'dynamic' if path == 'never' else 'static'}"
            for control in ("min_len=7", "no_repeat_ngram=2", "repetition_penalty=2.0"):
                key, value = control.split("=")
                changed = replace(settings, static=path, **{key: type(getattr(settings, key))(value)})
                cases[f"translate {at} {control}"] = translated(changed)
        cases[f"translate {name} max_len_a=0.5 max_len_b=2"] = translated(replace(settings, max_len_a=0.5, max_len_b=2))
        cases[f"translate {name} model.max_len=6"] = translated(settings, max_len=6)
        cases[f"translate {name} ensemble"] = translated(settings, lambda: Ensemble([translator(), translator(seed=1)]))
    for alpha in (0.0, 1.5):
        cases[f"translate beam len_penalty={alpha}"] = translated(replace(BEAM, len_penalty=alpha))
        cases[f"translate beam static len_penalty={alpha}"] = translated(
            replace(BEAM, len_penalty=alpha, static="always")
        )
    cases["translate beam=2 nbest=2"] = translated(replace(BEAM, beam=2))
    # bf16 weights: greedy only, each choice by a margin that bf16's rounding on any CPU keeps (`test_margins_*`);
    # beam search's candidates are not that far apart
    bf16 = functools.partial(translator, dtype=torch.bfloat16)
    cases["translate greedy bf16"] = translated(GREEDY, bf16, scores=False)
    controls = replace(GREEDY, min_len=3, no_repeat_ngram=3, repetition_penalty=1.5)
    for engine in ("native", "ctranslate2"):
        for name, settings in (("greedy", GREEDY), ("beam", BEAM), ("greedy controls", controls)):
            cases[f"{engine} lines {name}"] = translated_lines(settings, engine)
    return cases


def _generation_cases() -> dict[str, Callable[[], Output]]:
    cases: dict[str, Callable[[], Output]] = {}
    for shape in LM:
        for name, settings in (("greedy", GENERATE), ("sampled", SAMPLE)):
            cases[f"generate {shape} {name} dynamic"] = generated(settings, shape)
            if shape != "lstm":  # a recurrent model has no fixed-shape path
                cases[f"generate {shape} {name} static"] = generated(replace(settings, static="always"), shape)
            cases[f"generate {shape} {name} reference"] = generated_reference(settings, shape)
    for name, settings in (("greedy", GENERATE), ("sampled", SAMPLE)):
        for path in ("never", "always"):
            at = f"{name} {'dynamic' if path == 'never' else 'static'}"
            for control in ("min_len=10", "no_repeat_ngram=2", "repetition_penalty=2.0", "samples=2"):
                key, value = control.split("=")
                changed = replace(settings, static=path, **{key: type(getattr(settings, key))(value)})
                cases[f"generate {at} {control}"] = generated(changed)
    cases["generate greedy bf16"] = generated(GENERATE, dtype=torch.bfloat16)
    cases["generate sampled temperature=0.5"] = generated(replace(SAMPLE, temperature=0.5, top_k=0, top_p=1.0))
    return cases


DECODING = {**_translation_cases(), **_generation_cases()}


def _same(got: Output, want: Output) -> None:
    assert got["tokens"] == want["tokens"]
    assert ("scores" in got) == ("scores" in want)
    if "scores" in want:
        assert _flat(got["scores"]) == pytest.approx(_flat(want["scores"]), rel=SCORE_REL, abs=SCORE_REL)


def _flat(nested: Any) -> list[float]:
    return [x for item in nested for x in _flat(item)] if isinstance(nested, list) else [nested]


def _stored(name: str) -> dict[str, Output]:
    return json.loads((GOLDENS / f"{name}.json").read_text(encoding="utf-8"))


NO_CTRANSLATE2 = pytest.mark.skipif(importlib.util.find_spec("ctranslate2") is None, reason="ctranslate2 not installed")


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=[NO_CTRANSLATE2] if c.startswith("ctranslate2") else []) for c in DECODING]
)
def test_decoding_gives_its_golden(case):
    _same(DECODING[case](), _stored("decoding")[case])


def test_every_decoding_case_has_a_golden_and_every_golden_a_case():
    assert list(_stored("decoding")) == list(DECODING)


def _gaps(logits: torch.Tensor) -> torch.Tensor:
    """(T, V) logits -> (T,) how far each step's best token is ahead of the next best (PAD and BOS never chosen)."""
    logits = logits.float().clone()
    logits[:, [PAD_ID, BOS_ID]] = float("-inf")
    top = logits.topk(2, dim=-1).values
    return top[:, 0] - top[:, 1]


def line_sources() -> torch.Tensor:
    """The non-empty lines as `translate_lines` encodes them (with EOS), padded: (4, S)."""
    encoded = [ids + [EOS_ID] for ids in tokenizer().encode([line for line in LINES if line])]
    return torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(ids) for ids in encoded], batch_first=True, padding_value=PAD_ID
    )


@pytest.mark.parametrize(
    "shape, batch, dtype",
    [
        *((shape, sources, torch.float32) for shape in SEQ2SEQ),
        ("pre_rope_gqa", sources, torch.bfloat16),
        ("pre_rope_gqa", line_sources, torch.float32),
    ],
)
def test_margins_of_translation(shape, batch, dtype):
    """Each greedy choice of each translator wins clearly (but the EOS forced at a length limit): the goldens'
    ids do not flip with the rounding of another CPU."""
    model, src = translator(shape, dtype=dtype), batch()
    limits = search.max_lengths(src, GREEDY.max_len_a, GREEDY.max_len_b).tolist()
    for i, (hyp,) in enumerate(api.translate_batch(model, src, SearchSettings.from_decode(GREEDY))):
        with torch.inference_mode():
            memory, memory_mask = model.encode(src[i : i + 1])
            gaps = _gaps(model.decode(torch.tensor([[BOS_ID, *hyp.tokens[:-1]]]), memory, memory_mask)[0])
        chosen = gaps[: limits[i] - 1] if len(hyp.tokens) == limits[i] else gaps
        assert float(chosen.min()) >= MARGIN[dtype], (i, chosen.tolist())


@pytest.mark.parametrize("shape, dtype", [*((shape, torch.float32) for shape in LM), ("pre_rope", torch.bfloat16)])
def test_margins_of_generation(shape, dtype):
    """Each greedy choice of each language model wins clearly, up to its row's EOS."""
    model, prompt = language_model(shape, dtype), prompts()
    out = api.generate(model, prompt, SearchSettings.from_decode(GENERATE))
    with torch.inference_mode():
        logits = model(out[:, :-1])[:, prompt.size(1) - 1 :]  # (B, new, V): the logits each new token was chosen from
    for row, new in zip(logits, out[:, prompt.size(1) :].tolist(), strict=True):
        chosen = new.index(EOS_ID) + 1 if EOS_ID in new else len(new)
        assert float(_gaps(row[:chosen]).min()) >= MARGIN[dtype], new


# ---------------------------------------------------------------------------------------------------- training

UPDATES = 20
TRAIN = [
    "run.device=cpu", "run.threads=1", "run.seed=1", "train.precision=fp32", "train.compile=false",
    f"train.max_updates={UPDATES}", "train.log_every=1", "train.keep_last=1", "train.optimizer=adamw", "train.lr=3e-3",
    "train.betas=[0.9,0.98]", "train.weight_decay=0.01", "train.schedule=cosine", "train.warmup_steps=5",
    "train.clip_norm=1.0", "train.label_smoothing=0.1", "model.dropout=0.1", "model.n_layers=1",
]  # fmt: skip
SMALL_MODEL = ["model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.norm_placement=pre"]


def _kind(kind: str, data: Path) -> list[str]:
    """The overrides of a tiny run of `kind` (its data made or prepared under `data`): about 16 updates an epoch,
    so that the 20 cross an epoch's end."""
    match kind:
        case "classifier":
            pattern = ["data.pattern.n_examples=300", "data.pattern.n_train=250", "data.pattern.seq_len=12"]
            pattern += ["data.pattern.vocab_size=20", "data.pattern.n_classes=3", "data.pattern.pattern_len=3"]
            return ["data.kind=pattern", *pattern, "model.kind=classifier", "model.max_len=16", "train.batch_size=16"]
        case "seq2seq":
            return [
                "data.kind=parallel", "model.kind=seq2seq", f"data.train={data}/pairs/train", "data.workers=1",
                f"data.valid={data}/pairs/valid", f"data.dir={data}/prepared_pairs", "tokenizer.vocab_size=60",
                "train.max_tokens=250",
                "train.best_metric=loss", "train.schedule=inverse_sqrt", "train.lr_scale=0.03",  # the paper's schedule
            ]  # fmt: skip
        case "lm" | "lstm":
            text = [f"data.train={data}/text/train.txt", f"data.valid={data}/text/valid.txt", "data.workers=1"]
            text += [f"data.dir={data}/prepared_text", "tokenizer.kind=unigram", "tokenizer.vocab_size=40"]
            return ["data.kind=text", f"model.kind={kind}", *text, "data.block_size=16", "train.batch_size=8",
                    "train.best_metric=loss"]  # fmt: skip
        case "sessions":
            sessions = ["data.sessions.n_sessions=160", "data.sessions.n_valid=20", "data.sessions.n_test=10"]
            sessions += ["data.sessions.n_items=30", "data.sessions.session_len=8", "data.sessions.min_len=4"]
            return ["data.kind=sessions", *sessions, "model.kind=lm", "model.max_len=16", "train.batch_size=8",
                    "train.best_metric=mrr"]  # fmt: skip
    raise ValueError(kind)


KINDS = ["classifier", "seq2seq", "lm", "lstm", "sessions"]


def _corpora(data: Path) -> None:
    """Made-up translation pairs (a word-for-word "German") and text under `data`, prepared by `tformer prepare`'s
    function for the seq2seq and the language models."""
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7))) for _ in range(260)]
    (data / "pairs").mkdir(parents=True)
    for split, part in (("train", lines[:230]), ("valid", lines[230:])):
        (data / "pairs" / f"{split}.en").write_text("\n".join(part) + "\n")
        (data / "pairs" / f"{split}.de").write_text(
            "\n".join(" ".join(GERMAN[w] for w in s.split()) for s in part) + "\n"
        )
    (data / "text").mkdir()
    (data / "text" / "train.txt").write_text("\n".join(lines[:200]) + "\n")
    (data / "text" / "valid.txt").write_text("\n".join(lines[200:]) + "\n")
    for kind in ("seq2seq", "lm"):
        config = load_config(None, [*TRAIN, *_kind(kind, data)])
        prepare(config.data, config.tokenizer, log=lambda _: None)


def trained(kind: str, data: Path, run_dir: Path, *more: str) -> Output:
    """Train a tiny run of `kind` into `run_dir` (train/loop.py, as `tformer train`); its training losses, one
    per update, and its last validation loss."""
    loop.train(load_config(None, [*TRAIN, *SMALL_MODEL, *_kind(kind, data), *more]), run_dir)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["split"] == "train"]
    return {"train": losses, "valid": [r["loss"] for r in records if r["split"] == "valid"][-1]}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("goldens_data")
    _corpora(folder)
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def straight_runs(data, runs) -> dict[str, Output]:
    """Each kind's run (in runs/<kind>), made once for the tests that read it."""
    return {kind: trained(kind, data, runs / kind) for kind in KINDS}


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir / "checkpoints" / CheckpointStore(run_dir).index["latest"])["model"]


@pytest.mark.parametrize("kind", KINDS)
def test_training_gives_its_golden(kind, straight_runs):
    got, want = straight_runs[kind], _stored("training")[kind]
    assert len(got["train"]) == UPDATES
    assert got["train"] == pytest.approx(want["train"], rel=REL)
    assert got["valid"] == pytest.approx(want["valid"], rel=REL)


def test_every_kind_has_a_golden():
    assert list(_stored("training")) == KINDS


def test_a_resumed_run_gives_the_straight_runs_losses(data, runs, straight_runs, tmp_path):
    """Half the updates, then the same command again with all of them: the same 20 losses as the straight run,
    bit for bit, and the same weights."""
    trained("seq2seq", data, tmp_path, f"train.max_updates={UPDATES // 2}")
    resumed = trained("seq2seq", data, tmp_path)
    assert f"resuming {tmp_path} at update {UPDATES // 2} (epoch 1, batch" in (tmp_path / "train.log").read_text()
    assert resumed == straight_runs["seq2seq"]
    straight = _weights(runs / "seq2seq")
    assert all(torch.equal(value, straight[key]) for key, value in _weights(tmp_path).items())


# ---------------------------------------------------------------------------------------------------- writing


def _write(name: str, outputs: dict[str, Output]) -> None:
    """One case a line, keys in the cases' order: a regenerated file's diff shows the cases that changed."""
    lines = [f"  {json.dumps(key)}: {json.dumps(value, separators=(',', ':'))}" for key, value in outputs.items()]
    path = GOLDENS / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")
    tmp.replace(path)


def _regenerate(names: list[str]) -> None:
    torch.set_num_threads(1)
    GOLDENS.mkdir(exist_ok=True)
    for name in names:
        match name:
            case "decoding":
                outputs = {case: decode() for case, decode in DECODING.items()}
            case "training":
                with tempfile.TemporaryDirectory() as tmp:
                    _corpora(Path(tmp) / "data")
                    outputs = {kind: trained(kind, Path(tmp) / "data", Path(tmp) / kind) for kind in KINDS}
            case _:
                raise SystemExit(f"--regenerate: unknown golden {name!r} (decoding or training)")
        _write(name, outputs)
        print(f"wrote {GOLDENS / name}.json ({len(outputs)} cases)")


if __name__ == "__main__":
    if sys.argv[1:2] != ["--regenerate"]:
        raise SystemExit("usage: python tests/unit/test_goldens.py --regenerate [decoding] [training]")
    _regenerate(sys.argv[2:] or ["decoding", "training"])
