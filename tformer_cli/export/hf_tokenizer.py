"""A Hugging Face fast tokenizer (`tokenizer.json`) that gives the same ids as a run's SentencePiece model.

SentencePiece normalises text (its precompiled NFKC map, then: strip, collapse runs of spaces), marks
word starts with "▁" (a dummy prefix before the first word), and then segments with the unigram
lattice or BPE merges. The `tokenizers` library has each of these pieces; this module assembles them
from the model file's own settings. Two details matter for identical ids:
- SentencePiece never matches a control piece (`<s>`, `</s>`, `<pad>`) or `<unk>` inside text: a
  text "</s>" is the characters "<", "/", "s", ">". The unigram vocabulary here gives those pieces a
  score no segmentation can choose, and the special tokens are not matched in text
  (`split_special_tokens`).
  One case stays apart: when a character of those names ("<", ">", ...) is not in the vocabulary,
  `tokenizers` gives an unknown character a score below every piece's, so it then prefers the whole
  control piece where SentencePiece spells out the characters. `control_names_that_differ` finds
  that case and the model card names it (the default character_coverage 1.0 keeps every character
  of the training text, so it needs a corpus without "<" or ">").
- BPE merges are ordered as SentencePiece applies them: by the score of the merged piece.

`tests/unit/test_export_hf.py` checks the ids against SentencePiece on real and adversarial text.
"""

from __future__ import annotations

from pathlib import Path

from tformer_cli.errors import TformerError
from tformer_cli.export.folder import require
from tformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID

NEVER = -1e9  # the score of pieces SentencePiece never produces from text
_NORMAL, _USER_DEFINED, _UNUSED = 1, 4, 5  # SentencePiece piece types that can come out of text (and BYTE, 6)


def build_tokenizer(spm_path: Path, kind: str):
    """A `tokenizers.Tokenizer` equivalent to the SentencePiece model at `spm_path`.

    kind: "seq2seq" appends `</s>` to a text (tformer's source sentences); "lm" puts `</s>` before it
    (the end of the previous line in tformer's text stream).
    """
    tokenizers = require("tokenizers")
    proto = _model_proto(spm_path)
    trainer, spec = proto.trainer_spec, proto.normalizer_spec
    if trainer.byte_fallback:
        raise TformerError(f"{spm_path}: SentencePiece byte fallback has no exact Hugging Face tokenizer")
    if trainer.model_type == 1:  # unigram
        vocab = [(p.piece, p.score if p.type in (_NORMAL, _USER_DEFINED, 6) else NEVER) for p in proto.pieces]
        model = tokenizers.models.Unigram(vocab, unk_id=trainer.unk_id, byte_fallback=False)
    elif trainer.model_type == 2:  # bpe
        ranks = {p.piece: i for i, p in enumerate(proto.pieces)}
        model = tokenizers.models.BPE(ranks, _bpe_merges(proto), unk_token=trainer.unk_piece, fuse_unk=True)
    else:
        raise TformerError(f"{spm_path}: SentencePiece model type {trainer.model_type} is neither unigram nor bpe")
    tok = tokenizers.Tokenizer(model)
    steps = []
    if spec.precompiled_charsmap:
        steps.append(tokenizers.normalizers.Precompiled(spec.precompiled_charsmap))
    if spec.remove_extra_whitespaces:
        steps += [tokenizers.normalizers.Strip(), tokenizers.normalizers.Replace(tokenizers.Regex(" {2,}"), " ")]
    tok.normalizer = tokenizers.normalizers.Sequence(steps)
    prepend = "always" if spec.add_dummy_prefix else "never"
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend, split=True)
    tok.decoder = tokenizers.decoders.Metaspace(replacement="▁", prepend_scheme=prepend, split=True)
    eos = proto.pieces[EOS_ID].piece
    single = "$A </s>" if kind == "seq2seq" else "</s> $A"
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single=single.replace("</s>", eos), special_tokens=[(eos, EOS_ID)]
    )
    return tok


def control_names_that_differ(spm_path: Path, tok) -> list[str]:
    """The control and unknown pieces' names that, written as text, `tok` does not encode as SentencePiece does."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    names = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if sp.is_control(i) or sp.is_unknown(i)]
    return [name for name in names if tok.encode(name, add_special_tokens=False).ids != sp.encode(name)]


def save_tokenizer(spm_path: Path, folder: Path, kind: str, max_len: int) -> list[str]:
    """Write tokenizer.json and tokenizer_config.json for `AutoTokenizer`; return `control_names_that_differ`."""
    transformers = require("transformers")
    proto = _model_proto(spm_path)
    piece = {i: proto.pieces[i].piece for i in (PAD_ID, UNK_ID, BOS_ID, EOS_ID)}
    tok = build_tokenizer(spm_path, kind)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=piece[PAD_ID],
        unk_token=piece[UNK_ID],
        bos_token=piece[BOS_ID],
        eos_token=piece[EOS_ID],
        model_max_length=max_len,
        split_special_tokens=True,  # a text "</s>" is four characters, as in SentencePiece
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(folder))
    return control_names_that_differ(spm_path, tok)


def _model_proto(spm_path: Path):
    """The SentencePiece model's settings and pieces (its protobuf)."""
    require("google.protobuf", "export")
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # protobuf makes the class at import
    proto.ParseFromString(spm_path.read_bytes())
    return proto


def _bpe_merges(proto) -> list[tuple[str, str]]:
    """Every merge (left, right) whose result is a piece, ordered by that piece's score (best first).

    SentencePiece's BPE merges, at each step, the adjacent pair whose concatenation is the
    highest-scoring piece; a `tokenizers` BPE applies the lowest-ranked merge: the same order.
    """
    pieces = {p.piece: (p.score, i) for i, p in enumerate(proto.pieces) if p.type == _NORMAL}
    merges = []
    for merged, (score, rank) in pieces.items():
        for cut in range(1, len(merged)):
            left, right = merged[:cut], merged[cut:]
            if left in pieces and right in pieces:
                merges.append(((-score, rank, pieces[left][1], pieces[right][1]), (left, right)))
    return [pair for _, pair in sorted(merges)]
