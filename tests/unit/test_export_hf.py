"""`tformer export --format hf`: Hugging Face models that compute what tformer's compute, and its tokenizer's ids.

Every model here has all its weights perturbed (norm gains and biases included), so a weight put in the
wrong place, transposed, unpermuted or unscaled changes the logits.
"""

import random
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

from tformer_cli.config import config_from_dict
from tformer_cli.errors import TformerError
from tformer_cli.export.folder import MARKER
from tformer_cli.export.hf_tokenizer import build_tokenizer, control_names_that_differ
from tformer_cli.export.hugging_face import export_hugging_face, hf_architecture
from tformer_cli.run import Run
from tformer_cli.run.load import build_model_from_config
from tformer_cli.schema import TokenizerConfig
from tformer_cli.tokenizer import EOS_ID, PAD_ID, Tokenizer, train_sentencepiece

transformers = pytest.importorskip("transformers")  # the dev extra installs it; CI runs these

WORDS = (
    "the a house cat dog runs sleeps green small big over under and or not Haus Katze grün über ß é a<b b>c x/y".split()
)  # "<", ">", "/": see test_a_vocabulary_without_...
SMALL = {"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 48, "dropout": 0.0, "max_len": 64}


def _sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    syllables = ["ka", "ri", "mo", "sen", "tu", "la", "ber", "ün", "ço"]
    made_up = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(200)]
    return [" ".join(rng.choice(WORDS + made_up) for _ in range(rng.randint(1, 12))) for _ in range(n)]


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def spm_model(request, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp(request.param) / "spm.model"
    train_sentencepiece(
        _sentences(2000, 0), TokenizerConfig(kind=request.param, vocab_size=120, input_sentence_size=0), path
    )
    return path


def _run(tmp_path: Path, spm_path: Path, model: dict) -> Run:
    """A Run of a freshly built, perturbed model of recipe `model`, with `spm_path` as its tokenizer."""
    tree = {
        "run": {"name": "tiny", "out_dir": str(tmp_path / "runs")},
        "data": {"kind": "text", "block_size": 64} if model["kind"] == "lm" else {"kind": "parallel"},
    }
    tree["model"] = {**SMALL, **model}
    config = config_from_dict(tree, "test")
    tokenizer = Tokenizer(spm_path)
    torch.manual_seed(0)
    net = build_model_from_config(config, tokenizer.vocab_size).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    run_dir = tmp_path / "runs" / "tiny"
    (run_dir / "checkpoints").mkdir(parents=True)
    return Run(net, config, tokenizer, run_dir / "checkpoints" / "best.pt", run_dir, 0, tree, tokenizer.fingerprint)


def _padded(rows: list[list[int]]) -> torch.Tensor:
    width = max(map(len, rows))
    return torch.tensor([r + [PAD_ID] * (width - len(r)) for r in rows])


SEQ2SEQ = {
    "marian, the paper's (post-LN, all shared)": {
        "kind": "seq2seq",
        "norm_placement": "post",
        "share_all_embeddings": True,
    },
    "marian, post-LN, own embeddings, untied output, gelu, no biases": {
        "kind": "seq2seq",
        "norm_placement": "post",
        "tie_embeddings": False,
        "ffn": "gelu",
        "bias": False,
        "n_decoder_layers": 3,
    },
    "pegasus (pre-LN, shared)": {"kind": "seq2seq", "norm_placement": "pre", "share_all_embeddings": True},
}


@pytest.mark.parametrize("recipe", SEQ2SEQ.values(), ids=SEQ2SEQ.keys())
def test_seq2seq_export_gives_tformers_logits_on_a_padded_batch_and_its_greedy_tokens(tmp_path, spm_model, recipe):
    run = _run(tmp_path, spm_model, recipe)
    export_hugging_face(run, tmp_path / "hf")
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf").eval()
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")

    sources = ["the cat runs over the green house", "Katze", "a dog and a small cat not under the big house"]
    batch = tok(sources, return_tensors="pt", padding=True)
    ours = [ids + [EOS_ID] for ids in run.tokenizer.encode(sources)]
    assert batch["input_ids"].tolist() == _padded(ours).tolist()

    tgt_in = _padded([[2, 5, 9, 11, 7], [2, 8], [2, 30, 31]])
    with torch.no_grad():
        expected = run.model(batch["input_ids"], tgt_in)
        got = hf(**batch, decoder_input_ids=tgt_in, decoder_attention_mask=tgt_in != PAD_ID).logits
    real = tgt_in != PAD_ID
    assert (got[real] - expected[real]).abs().max().item() < 1e-4

    from tformer_cli.decoding.search import greedy
    from tformer_cli.decoding.settings import SearchSettings

    with torch.no_grad():
        want = greedy(run.model, batch["input_ids"], SearchSettings(max_len_a=0.0, max_len_b=12))
        out = hf.generate(**batch, max_new_tokens=12, do_sample=False, num_beams=1)  # EOS forced at 12, as tformer
    for hyp, row in zip(want, out.tolist(), strict=True):
        tokens = row[1:]  # after the decoder start (BOS)
        tokens = tokens[: tokens.index(EOS_ID) + 1] if EOS_ID in tokens else tokens
        assert tokens == hyp.tokens


LMS = {
    "llama (RMSNorm, SwiGLU, RoPE, grouped-query, no biases)": (
        {
            "kind": "lm",
            "norm_placement": "pre",
            "norm": "rmsnorm",
            "ffn": "swiglu",
            "pos": "rope",
            "n_kv_heads": 2,
            "bias": False,
        },
        "LlamaForCausalLM",
    ),
    "llama with biases": (
        {"kind": "lm", "norm_placement": "pre", "norm": "rmsnorm", "ffn": "swiglu", "pos": "rope"},
        "LlamaForCausalLM",
    ),
    "gpt-neox (LayerNorm, gelu, RoPE: recipes/wikitext2_lm.yaml)": (
        {"kind": "lm", "norm_placement": "pre", "ffn": "gelu", "pos": "rope"},
        "GPTNeoXForCausalLM",
    ),
    "gpt-2 (learned positions, relu, untied)": (
        {"kind": "lm", "norm_placement": "pre", "ffn": "relu", "pos": "learned", "tie_embeddings": False},
        "GPT2LMHeadModel",
    ),
    "gpt-2 (sinusoidal positions as its table)": (
        {"kind": "lm", "norm_placement": "pre", "ffn": "gelu", "pos": "sinusoidal"},
        "GPT2LMHeadModel",
    ),
}


@pytest.mark.parametrize("recipe, cls", LMS.values(), ids=LMS.keys())
def test_lm_export_gives_tformers_logits_on_a_padded_batch_and_its_greedy_tokens(tmp_path, spm_model, recipe, cls):
    run = _run(tmp_path, spm_model, recipe)
    export_hugging_face(run, tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == cls
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")

    texts = ["the cat runs over the green house and the dog sleeps", "Katze über", "a big dog"]
    tok.padding_side = "right"
    batch = tok(texts, return_tensors="pt", padding=True)
    assert batch["input_ids"].tolist() == _padded([[EOS_ID] + ids for ids in run.tokenizer.encode(texts)]).tolist()
    with torch.no_grad():
        expected = run.model(batch["input_ids"])
        got = hf(**batch).logits
    real = batch["attention_mask"].bool()
    assert (got[real] - expected[real]).abs().max().item() < 1e-4

    prompt = tok(["the cat"], return_tensors="pt")
    with torch.no_grad():
        out = hf.generate(**prompt, max_new_tokens=10, do_sample=False, eos_token_id=None)
        tokens = prompt["input_ids"]
        for _ in range(10):  # tformer's greedy continuation, written out
            tokens = torch.cat([tokens, run.model(tokens)[:, -1:].argmax(-1)], dim=1)
    assert out.tolist() == tokens.tolist()


def test_the_tokenizer_gives_sentencepieces_ids_for_real_and_adversarial_text(spm_model):
    """Normalisation (NFKC, spaces), unknown characters, and control pieces written as text."""
    sp = spm.SentencePieceProcessor(model_file=str(spm_model))
    tok = build_tokenizer(spm_model, "seq2seq")
    assert control_names_that_differ(spm_model, tok) == []
    rng = random.Random(1)
    alphabet = WORDS + [
        "",
        " ",
        "  ",
        "\t",
        "\n",
        "ﬁ",
        "①",
        "Ａ",
        "Å",
        "\u00a0",
        "\u3000",
        "🙂",
        "中文",
        "<s>",
        "</s>",
        "<pad>",
        "<unk>",
        "▁",
        "...",
    ]
    texts = _sentences(300, 2) + ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 15))) for _ in range(1500)]
    for text in texts:
        assert tok.encode(text).ids == sp.encode(text) + [EOS_ID], repr(text)


def test_a_vocabulary_without_the_characters_of_special_names_is_named_in_the_card(tmp_path):
    """Without "<" in the vocabulary, `tokenizers` prefers the piece "<pad>" to an unknown "<" (hf_tokenizer.py)."""
    spm_path = tmp_path / "spm.model"
    plain = [s.replace("<", "").replace(">", "").replace("/", "") for s in _sentences(500, 3)]
    train_sentencepiece(plain, TokenizerConfig(kind="unigram", vocab_size=60, input_sentence_size=0), spm_path)
    assert set(control_names_that_differ(spm_path, build_tokenizer(spm_path, "lm"))) == {
        "<pad>",
        "<unk>",
        "<s>",
        "</s>",
    }
    run = _run(tmp_path, spm_path, {"kind": "lm", "norm_placement": "pre", "pos": "learned"})
    export_hugging_face(run, tmp_path / "hf")
    assert "`<pad>`" in (tmp_path / "hf" / "README.md").read_text()


def test_autotokenizer_gives_tformers_ids_for_special_looking_text_and_decodes_back(tmp_path, spm_model):
    run = _run(tmp_path, spm_model, {"kind": "lm", "norm_placement": "pre", "pos": "learned"})
    export_hugging_face(run, tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    for text in ["a </s> b <s> <pad>", "  the  cat ", "über Haus"]:
        assert tok(text)["input_ids"] == [EOS_ID] + run.tokenizer.encode([text])[0], text
    ids = run.tokenizer.encode(["the green cat"])[0]
    assert tok.decode(ids) == run.tokenizer.decode(ids)


@pytest.mark.parametrize(
    "recipe, key",
    [
        ({"kind": "seq2seq", "pos": "learned"}, "model.pos=learned"),
        ({"kind": "seq2seq", "norm": "rmsnorm"}, "model.norm=rmsnorm"),
        ({"kind": "seq2seq", "n_kv_heads": 2}, "model.n_kv_heads=2"),
        (
            {"kind": "seq2seq", "norm_placement": "pre", "share_all_embeddings": False},
            "model.share_all_embeddings=False",
        ),
        ({"kind": "lm", "norm_placement": "pre", "pos": "alibi"}, "model.pos=alibi"),
        ({"kind": "lm", "norm_placement": "post", "pos": "rope"}, "model.norm_placement=post"),
        ({"kind": "lm", "norm_placement": "pre", "norm": "rmsnorm", "ffn": "gelu", "pos": "rope"}, "model.ffn=gelu"),
        ({"kind": "lm", "norm_placement": "pre", "ffn": "swiglu", "pos": "rope"}, "model.ffn=swiglu"),
        ({"kind": "lstm"}, "model.kind=lstm"),
    ],
)
def test_an_option_without_an_exact_equivalent_is_refused_in_one_line_naming_it(recipe, key):
    config = config_from_dict(
        {"data": {"kind": "parallel" if recipe["kind"] == "seq2seq" else "text"}, "model": recipe}, "test"
    )
    with pytest.raises(TformerError) as error:
        hf_architecture(config.model)
    assert key in str(error.value) and "\n" not in str(error.value)


def test_a_rotary_translation_model_is_pointed_to_the_ctranslate2_export():
    """recipes/multi30k_en_de.yaml trains rotary positions, which Marian and Pegasus lack: the refusal says what
    does take them."""
    config = config_from_dict({"data": {"kind": "parallel"}, "model": {"kind": "seq2seq", "pos": "rope"}}, "test")
    with pytest.raises(TformerError) as error:
        hf_architecture(config.model)
    assert "model.pos=rope" in str(error.value) and "--format ctranslate2" in str(error.value)


def test_the_export_writes_a_card_and_replaces_only_its_own_earlier_export(tmp_path, spm_model):
    run = _run(tmp_path, spm_model, {"kind": "seq2seq", "norm_placement": "post", "share_all_embeddings": True})
    (run.run_dir / "eval_newstest_best_beam4.json").write_text('{"bleu": 12.5, "chrf": 40.1}')
    out = tmp_path / "hf"
    export_hugging_face(run, out)
    card = (out / "README.md").read_text()
    assert "MarianMTModel" in card and "bleu: 12.5" in card and "d_model: 32" in card
    assert (out / MARKER).is_file()
    export_hugging_face(run, out)  # an earlier export is replaced
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(TformerError, match="not a tformer export"):
        export_hugging_face(run, other)
    assert (other / "notes.txt").read_text() == "keep me"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
