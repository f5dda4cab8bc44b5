"""A CTranslate2 model directory built directly from tformer's weights (`tformer export --format ctranslate2`).

As CTranslate2's own fairseq and OpenNMT-py converters do, the weights are laid layer by layer into
`ctranslate2.specs`; nothing goes through another library's model class (CTranslate2's Marian loader
starts the decoder from a zero embedding, tformer's decoder starts from BOS). Every architecture
option maps onto the spec exactly or is refused with one line naming the recipe key (`check_exportable`).

tformer -> CTranslate2:
- TokenEmbedding (x sqrt(d_model))  -> embeddings, scale_embeddings (sqrt(d_model)).
- positions: sinusoidal -> tformer's own table (interleaved sin/cos from position 0; CTranslate2's
  built-in table is laid out differently); learned -> the learned table; none -> a zero table;
  rope -> rotary_dim 0, rotary_interleave False (tformer rotates halves); alibi (lm) -> alibi with
  positive key positions: CTranslate2 adds slope * j, tformer -slope * (i - j), a difference constant
  along each query's row, which the softmax removes (the slopes are the same).
- self-attention qkv_proj (rows q, k, v) -> linear[0]; cross-attention q_proj, kv_proj (rows k, v)
  -> linear[0], linear[1]; out_proj -> the last linear; n_kv_heads -> num_heads_kv.
- each sublayer's norm -> its layer_norm, applied before (pre) or after the residual (post); pre-LN's
  final norm -> the stack's layer_norm; rmsnorm -> rms_norm; epsilon 1e-5 as tformer's.
- FeedForward w1, w2 -> linear_0, linear_1; SwiGLU's w1 rows [gate; value] -> linear_0 (SiLU) and
  linear_0_noact; gelu is the exact (erf) GELU.
- lm_head (Seq2Seq's and LanguageModel's) -> projection (tied or not).
- the vocabulary: the SentencePiece pieces in id order; `<s>` (BOS) starts the decoder; `</s>` is
  appended to every source (tformer's sources end with EOS); spm.model is copied beside the model.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor, nn

from tformer_cli.errors import TformerError
from tformer_cli.export.ctranslate2_card import ctranslate2_card
from tformer_cli.export.folder import MARKER, export_folder, require
from tformer_cli.files import sha256_file
from tformer_cli.model.attention import MultiHeadAttention
from tformer_cli.model.layers import Block, FeedForward
from tformer_cli.model.lm import LanguageModel
from tformer_cli.model.positions import LearnedPositions, sinusoidal_table
from tformer_cli.model.seq2seq import Seq2Seq
from tformer_cli.model.stack import Stack
from tformer_cli.run import Run
from tformer_cli.run.checkpoints import paths_to_average, read_index
from tformer_cli.run.layout import CTRANSLATE2, checkpoint_label
from tformer_cli.schema import ModelConfig
from tformer_cli.version import __version__

QUANTIZATIONS = ("int8", "int8_float16", "float16")  # CTranslate2's names; None keeps float32
MIN_POSITIONS = 1024  # sinusoidal and none: table rows CTranslate2 reads (tformer's formula has no end)
NORM_EPS = 1e-5  # tformer's LayerNorm and RMSNorm (model/layers.py make_norm)
FORMAT = "ctranslate2"


def check_exportable(cfg: ModelConfig) -> None:
    """Refuse, with one line naming the recipe key, what CTranslate2's Transformer specs cannot represent.

    Raises:
        TformerError: a classifier or LSTM, an attention score other than scaled_dot, or ALiBi in an
            encoder (CTranslate2's encoder has no ALiBi, and tformer's encoder bias -slope * |i - j| is
            not a per-row shift of CTranslate2's slope * j).
    """
    if cfg.kind not in ("seq2seq", "lm"):
        raise TformerError(f"model.kind={cfg.kind} is not supported by the CTranslate2 export (seq2seq and lm are)")
    if cfg.attention_score != "scaled_dot":
        raise TformerError(
            f"model.attention_score={cfg.attention_score} is not supported by the CTranslate2 export "
            "(its attention scores with the scaled dot product only)"
        )
    if cfg.kind == "seq2seq" and cfg.pos == "alibi":
        raise TformerError(
            "model.pos=alibi is not supported by the CTranslate2 export of a seq2seq model "
            "(CTranslate2's encoder has no ALiBi; a language model's is exported)"
        )


def check_quantization(quantization: str | None) -> None:
    """Raises: TformerError: a value other than None or one of QUANTIZATIONS."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise TformerError(
            f"--quantization {quantization}: choose {', '.join(QUANTIZATIONS)} (or leave it out: float32)"
        )


def position_limit(cfg: ModelConfig) -> int | None:
    """How many positions the export can encode (sources and outputs must fit); None: no limit (rope, alibi)."""
    match cfg.pos:
        case "learned":
            return cfg.max_len
        case "sinusoidal" | "none":
            return max(cfg.max_len, MIN_POSITIONS)
    return None


def build_spec(model: nn.Module, cfg: ModelConfig, pieces: list[str]) -> Any:
    """The CTranslate2 spec of a tformer `seq2seq` or `lm` model (weights shared, not copied, where possible).

    Args:
        model: the tformer model (fp32 weights, as trained).
        cfg: its `model:` section.
        pieces: the vocabulary, one piece per id (the tokenizer's, or any names for a model without one).

    Raises:
        TformerError: see `check_exportable`.
    """
    check_exportable(cfg)
    specs = require("ctranslate2").specs
    options = _layer_options(specs, cfg)
    n_decoder = (cfg.n_decoder_layers or cfg.n_layers) if cfg.kind == "seq2seq" else cfg.n_layers
    if cfg.kind == "lm":
        decoder = specs.TransformerDecoderSpec(
            n_decoder, cfg.n_heads, with_encoder_attention=False, alibi=cfg.pos == "alibi", **options
        )
        spec = specs.TransformerDecoderModelSpec(decoder)
        _set_stack(decoder, cast(LanguageModel, model).decoder, cfg)
        spec.register_vocabulary(pieces)
    else:
        encoder = specs.TransformerEncoderSpec(cfg.n_layers, cfg.n_heads, **options)
        decoder = specs.TransformerDecoderSpec(n_decoder, cfg.n_heads, **options)
        spec = specs.TransformerSpec(encoder, decoder)
        seq2seq = cast(Seq2Seq, model)  # check_exportable: model.kind seq2seq or lm
        _set_stack(encoder, seq2seq.encoder, cfg)
        _set_stack(decoder, seq2seq.decoder, cfg)
        spec.register_source_vocabulary(pieces)
        spec.register_target_vocabulary(pieces)
        spec.config.decoder_start_token = "<s>"  # tformer's BOS
        spec.config.add_source_eos = True  # tformer's sources end with EOS
    decoder.projection.weight = _tensor(cast(nn.Linear, model.lm_head).weight)
    spec.config.bos_token, spec.config.eos_token, spec.config.unk_token = "<s>", "</s>", "<unk>"
    spec.config.layer_norm_epsilon = NORM_EPS
    return spec


def _layer_options(specs: Any, cfg: ModelConfig) -> dict[str, Any]:
    """The spec arguments shared by tformer's encoder and decoder stacks."""
    activation = {"relu": "RELU", "gelu": "GELU", "swiglu": "SWISH"}[cfg.ffn]
    options: dict[str, Any] = {
        "pre_norm": cfg.norm_placement == "pre",
        "activation": getattr(specs.Activation, activation),
        "ffn_glu": cfg.ffn == "swiglu",
        "rms_norm": cfg.norm == "rmsnorm",
        "num_heads_kv": cfg.n_kv_heads if cfg.n_kv_heads not in (None, cfg.n_heads) else None,
    }
    if cfg.pos == "rope":
        options.update(rotary_dim=0, rotary_interleave=False)
    return options


def _set_stack(spec: Any, stack: Stack, cfg: ModelConfig) -> None:
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _tensor(stack.embedding.weight)
    spec.scale_embeddings = True  # x sqrt(d_model), as TokenEmbedding
    table = _position_table(stack, cfg)
    if table is not None:
        spec.position_encodings.encodings = table
    blocks = cast("Iterable[Block]", stack.blocks)  # an nn.ModuleList types its items as modules
    for layer_spec, block in zip(spec.layer, blocks, strict=True):
        _set_block(layer_spec, block)
    if cfg.norm_placement == "pre":
        _set_norm(spec.layer_norm, cast("nn.LayerNorm | nn.RMSNorm", stack.final_norm))  # pre-LN: a norm


def _position_table(stack: Stack, cfg: ModelConfig) -> Tensor | None:
    limit = position_limit(cfg)
    match cfg.pos:
        case "sinusoidal":
            assert limit is not None  # position_limit: at least model.max_len
            return sinusoidal_table(limit, cfg.d_model)
        case "learned":
            return _tensor(cast(LearnedPositions, stack.positions).embedding.weight)
        case "none":  # CTranslate2 adds its own sinusoids when no table is given: give zeros
            assert limit is not None
            return torch.zeros(limit, cfg.d_model)
    return None


def _set_block(spec: Any, block: Block) -> None:
    _set_attention(spec.self_attention, block.self_attn)
    _set_norm(spec.self_attention.layer_norm, block.self_attn_norm)
    if block.cross_attn is not None:
        assert block.cross_attn_norm is not None  # made with cross_attn
        _set_attention(spec.attention, block.cross_attn)
        _set_norm(spec.attention.layer_norm, block.cross_attn_norm)
    _set_ffn(spec.ffn, block.ffn)
    _set_norm(spec.ffn.layer_norm, block.ffn_norm)


def _set_attention(spec: Any, attention: MultiHeadAttention) -> None:
    if attention.cross:
        _set_linear(spec.linear[0], attention.q_proj)
        _set_linear(spec.linear[1], attention.kv_proj)
    else:
        _set_linear(spec.linear[0], attention.qkv_proj)
    _set_linear(spec.linear[-1], attention.out_proj)


def _set_ffn(spec: Any, ffn: FeedForward) -> None:
    if ffn.kind == "swiglu":  # w1's rows: [gate; value], h = SiLU(gate) * value
        d_ff = ffn.w2.in_features
        _set_linear(spec.linear_0, ffn.w1, slice(0, d_ff))
        _set_linear(spec.linear_0_noact, ffn.w1, slice(d_ff, 2 * d_ff))
    else:
        _set_linear(spec.linear_0, ffn.w1)
    _set_linear(spec.linear_1, ffn.w2)


def _set_linear(spec: Any, linear: nn.Linear, rows: slice = slice(None)) -> None:
    spec.weight = _tensor(linear.weight[rows])
    if linear.bias is not None:
        spec.bias = _tensor(linear.bias[rows])


def _set_norm(spec: Any, norm: nn.LayerNorm | nn.RMSNorm) -> None:
    spec.gamma = _tensor(norm.weight)
    if (bias := getattr(norm, "bias", None)) is not None:  # RMSNorm has none
        spec.beta = _tensor(bias)


def _tensor(value: Tensor) -> Tensor:
    return value.detach().float().cpu().contiguous()


def write_model(spec: Any, folder: Path, quantization: str | None) -> None:
    """Validate `spec`, store its weights as `quantization` (None: float32) and save it into `folder`."""
    check_quantization(quantization)
    spec.validate()
    spec.optimize(quantization=quantization)
    spec.save(str(folder))


# ---------------------------------------------------------------- a trained run's export


def export_ctranslate2(run: Run, output: Path, quantization: str | None) -> None:
    """Write `run`'s model as a CTranslate2 model directory `output` (written all at once, see `export_folder`).

    The folder holds CTranslate2's model.bin, config.json and vocabulary, tformer's spm.model (to
    tokenize with), a translation model's README.md (the `translate_batch` call that gives `tformer
    translate`'s output) and `tformer_export.json`: the checkpoint(s) with their sha256 and step, the
    quantization, and the versions that wrote it.

    Raises:
        TformerError: an option CTranslate2 cannot represent, an unknown quantization, the `ctranslate2`
            package missing, a run without a tokenizer, or an `output` that is not a folder tformer wrote.
    """
    check_exportable(run.config.model)
    check_quantization(quantization)
    if run.tokenizer is None:
        raise TformerError(f"{run.checkpoint}: the CTranslate2 export needs the run's tokenizer (data.dir)")
    ctranslate2 = require("ctranslate2")
    spec = build_spec(run.model, run.config.model, run.tokenizer.pieces(list(range(run.tokenizer.vocab_size))))
    marker = {
        "format": FORMAT,
        "checkpoints": checkpoints_of(run),
        "quantization": quantization or "float32",
        "ctranslate2": ctranslate2.__version__,
        "tformer": __version__,
    }
    with export_folder(output) as folder:
        write_model(spec, folder, quantization)
        shutil.copyfile(run.tokenizer.path, folder / "spm.model")
        if run.kind == "seq2seq":
            card = ctranslate2_card(run, quantization)
            (folder / "README.md").write_text(card, encoding="utf-8")
        (folder / MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")


def checkpoints_of(run: Run) -> list[dict[str, Any]]:
    """The checkpoint file(s) `run`'s weights come from (each averaged one with --average): path, sha256, step."""
    paths = [run.checkpoint]
    if run.average:
        assert run.run_dir is not None  # load_run averages the step checkpoints of a run directory only
        paths = paths_to_average(run.run_dir, run.average, "--average")
    return [{"file": str(p.resolve()), "sha256": sha256_file(p), "step": _step(p)} for p in paths]


def _step(path: Path) -> int | None:
    """The training step of a checkpoint its run's index lists (None for a standalone file or an average)."""
    index = read_index(path.resolve().parent)
    entry = index["files"].get(path.name) if index is not None else None
    return entry["step"] if entry is not None else None


def run_export(run: Run, quantization: str | None, log: Callable[[str], None] | None = None) -> Path:
    """The CTranslate2 export `tformer translate --engine ctranslate2` uses, built now unless up to date.

    It lives in the run directory (beside a standalone checkpoint, for one outside a run):
    `ctranslate2/<checkpoint label>_<quantization>/`. It is reused while its marker names the same
    checkpoint bytes (sha256), quantization and CTranslate2 version; otherwise it is built again
    (and `log` told so).
    """
    check_quantization(quantization)
    base = run.run_dir if run.run_dir is not None else run.checkpoint.parent
    folder = base / CTRANSLATE2 / f"{checkpoint_label(run.checkpoint, run.average)}_{quantization or 'float32'}"
    if not _up_to_date(folder, run, quantization):
        if log is not None:
            log(f"building the CTranslate2 export {folder} (kept for the next translations of this checkpoint)")
        folder.parent.mkdir(exist_ok=True)
        export_ctranslate2(run, folder, quantization)
    return folder


def _up_to_date(folder: Path, run: Run, quantization: str | None) -> bool:
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    wanted = {
        "format": FORMAT,
        "quantization": quantization or "float32",
        "ctranslate2": require("ctranslate2").__version__,
        "checkpoints": [entry["sha256"] for entry in checkpoints_of(run)],
    }
    found = {**{key: marker.get(key) for key in wanted}, "checkpoints": _hashes(marker)}
    return found == wanted and (folder / "model.bin").is_file()


def _hashes(marker: dict[str, Any]) -> list[str] | None:
    entries = marker.get("checkpoints")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        return None
    return [e.get("sha256") for e in entries]
