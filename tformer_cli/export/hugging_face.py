"""`tformer export --format hf`: a trained model as a Hugging Face `transformers` model directory.

Each recipe maps onto the Hugging Face architecture that computes exactly what tformer computes,
or is refused with one line naming the recipe key that has no exact equivalent:

| tformer recipe                                                   | Hugging Face            |
|------------------------------------------------------------------|-------------------------|
| seq2seq, post-LN (the paper), sinusoidal, LayerNorm, relu/gelu   | MarianMTModel           |
| seq2seq, pre-LN, sinusoidal, LayerNorm, relu/gelu, shared embed. | PegasusForConditionalGeneration |
| lm, pre-LN, RMSNorm, SwiGLU, RoPE (grouped-query heads allowed)  | LlamaForCausalLM        |
| lm, pre-LN, LayerNorm, relu/gelu, RoPE                           | GPTNeoXForCausalLM      |
| lm, pre-LN, LayerNorm, relu/gelu, learned or sinusoidal          | GPT2LMHeadModel         |

How the weights are laid out differently:
- Marian and Pegasus lay their sinusoidal table out as [sin of every frequency, cos of every
  frequency]; tformer interleaves them (the paper's PE(pos, 2i), PE(pos, 2i+1)). A permutation of the
  model dimension maps one onto the other exactly: every weight that reads or writes the residual
  stream is permuted (LayerNorm is elementwise, so it commutes with a permutation).
- tformer multiplies token embeddings by sqrt(d_model). Marian and Pegasus do too
  (`scale_embedding`); the decoder-only models do not, so their input embedding is stored multiplied
  by it and the output projection is stored apart (untied), unscaled.
- tformer fuses Q, K and V in one projection; Hugging Face splits them (GPT-NeoX interleaves them by
  head, GPT-2 stores them transposed).
- A sinusoidal LM becomes GPT-2 with its table written into the learned position embeddings: exact up
  to `model.max_len` positions (tformer extends the formula beyond it; GPT-2 cannot).

The tokenizer is a `tokenizer.json` built from the run's SentencePiece model (`hf_tokenizer.py`), so
that `AutoTokenizer.from_pretrained(DIR)` gives tformer's ids: source text + `</s>` for translation,
`</s>` + text for a language model (tformer reads text as a stream in which a line starts after `</s>`).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tformer_cli.errors import TformerError
from tformer_cli.export.folder import MARKER, export_folder, require
from tformer_cli.export.hf_generation import generation_config
from tformer_cli.export.hf_tokenizer import save_tokenizer
from tformer_cli.export.model_card import model_card
from tformer_cli.files import write_json, write_text
from tformer_cli.model.positions import sinusoidal_table
from tformer_cli.run import Run
from tformer_cli.schema import ModelConfig
from tformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID

State = dict[str, Tensor]


def hf_architecture(m: ModelConfig) -> str:
    """The Hugging Face architecture that represents `m` exactly.

    Raises:
        TformerError: one line naming the recipe key (and value) that has no exact equivalent.
    """

    def refuse(key: str, why: str) -> TformerError:
        return TformerError(f"model.{key}={getattr(m, key)} cannot be exported to Hugging Face: {why}")

    if m.attention_score != "scaled_dot":
        raise refuse("attention_score", "its attention layers all score with the scaled dot product")
    if m.kind == "seq2seq":
        if m.pos != "sinusoidal":
            raise refuse(
                "pos",
                "Marian and Pegasus (the encoder-decoders it maps to) use sinusoidal positions; `tformer export "
                "--format ctranslate2` takes these, or train with model.pos=sinusoidal",
            )
        if m.norm != "layernorm":
            raise refuse("norm", "Marian and Pegasus use LayerNorm")
        if m.ffn == "swiglu":
            raise refuse("ffn", "Marian and Pegasus have a plain two-layer feed-forward network")
        if m.n_kv_heads not in (None, m.n_heads):
            raise refuse("n_kv_heads", "Marian and Pegasus have no grouped-query attention")
        if m.norm_placement == "post":
            return "marian"
        if not m.share_all_embeddings:
            raise refuse("share_all_embeddings", "Pegasus (pre-LN) shares one embedding between encoder and decoder")
        return "pegasus"
    if m.kind != "lm":
        raise TformerError(f"model.kind={m.kind} cannot be exported to Hugging Face (seq2seq and lm can)")
    if m.norm_placement != "pre":
        raise refuse("norm_placement", "the decoder-only Hugging Face models (Llama, GPT-NeoX, GPT-2) are pre-LN")
    if m.pos in ("alibi", "none"):
        raise refuse("pos", "no Llama, GPT-NeoX or GPT-2 model has it")
    if m.norm == "rmsnorm":
        if m.ffn != "swiglu" or m.pos != "rope":
            key = "ffn" if m.ffn != "swiglu" else "pos"
            raise refuse(key, "RMSNorm maps to Llama, which has ffn=swiglu and pos=rope")
        return "llama"
    if m.ffn == "swiglu":
        raise refuse("ffn", "SwiGLU with LayerNorm has no Hugging Face architecture (Llama uses RMSNorm)")
    if m.n_kv_heads not in (None, m.n_heads):
        raise refuse("n_kv_heads", "GPT-NeoX and GPT-2 have no grouped-query attention (Llama, with RMSNorm, has)")
    return "gpt_neox" if m.pos == "rope" else "gpt2"


def export_hugging_face(run: Run, output: Path) -> None:
    """Write `run` to the folder `output` as a Hugging Face model: config, weights, tokenizer, card.

    Raises:
        TformerError: the recipe has no exact Hugging Face equivalent, the optional extra is missing,
            or `output` is not a folder this export may write (see `folder.export_folder`).
    """
    architecture = hf_architecture(run.config.model)
    transformers = require("transformers")
    if run.tokenizer is None:
        raise TformerError(f"{run.checkpoint}: the run's tokenizer was not read; it is needed for the export")
    config = _hf_config(architecture, run, transformers)
    state = _STATE[architecture](run.model.state_dict(), run.config.model)
    auto = transformers.AutoModelForCausalLM if run.kind == "lm" else transformers.AutoModelForSeq2SeqLM
    model = auto.from_config(config)  # the architecture; every weight is then replaced by tformer's
    _load_exactly(model, state, architecture)
    with export_folder(output) as folder:
        model.save_pretrained(folder)
        generation_config(run, transformers).save_pretrained(folder)
        if run.kind == "seq2seq":  # tformer's search, for `from_pretrained(DIR, trust_remote_code=True)`
            (folder / "custom_generate").mkdir()
            shutil.copyfile(Path(__file__).parent / "hf_custom_generate.py", folder / "custom_generate" / "generate.py")
        differ = save_tokenizer(run.tokenizer.path, folder, run.kind, run.config.model.max_len)
        write_text(folder / "README.md", model_card(run, architecture, differ))
        write_json(
            folder / MARKER,
            {"format": "hf", "architecture": config.architectures[0], "checkpoint": str(run.checkpoint)},
        )


def _load_exactly(model, state: State, architecture: str) -> None:
    """Put `state` into `model`; every weight of the model must come from tformer."""
    expected = set(model.state_dict())
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:  # a mapping bug, never a user error
        raise RuntimeError(
            f"{architecture}: weights missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
    model.load_state_dict({k: v.detach().clone() for k, v in state.items()}, strict=True)
    model.tie_weights()


def _hf_config(architecture: str, run: Run, transformers) -> Any:
    """The Hugging Face config of each architecture tformer exports to: one table of keys per architecture,
    which is why this function is long (a table is read down, not followed)."""
    assert run.tokenizer is not None  # export_hugging_face refuses a run without it
    m, vocab = run.config.model, run.tokenizer.vocab_size
    common = {"vocab_size": vocab, "pad_token_id": PAD_ID, "eos_token_id": EOS_ID, "torch_dtype": "float32"}
    match architecture:
        case "marian" | "pegasus":
            n_dec = m.n_decoder_layers or m.n_layers
            cls = transformers.MarianConfig if architecture == "marian" else transformers.PegasusConfig
            extra = {"share_encoder_decoder_embeddings": m.share_all_embeddings} if architecture == "marian" else {}
            return cls(
                **common,
                **extra,
                d_model=m.d_model,
                encoder_layers=m.n_layers,
                decoder_layers=n_dec,
                encoder_attention_heads=m.n_heads,
                decoder_attention_heads=m.n_heads,
                encoder_ffn_dim=m.d_ff,
                decoder_ffn_dim=m.d_ff,
                activation_function=m.ffn,
                max_position_embeddings=m.max_len,
                scale_embedding=True,
                dropout=0.0,
                decoder_start_token_id=BOS_ID,
                bos_token_id=BOS_ID,
                forced_eos_token_id=EOS_ID,
                tie_word_embeddings=m.tie_embeddings or m.share_all_embeddings,
                architectures=["MarianMTModel" if architecture == "marian" else "PegasusForConditionalGeneration"],
            )
        case "llama":
            return transformers.LlamaConfig(
                **common,
                bos_token_id=EOS_ID,  # the stream marker tformer puts before a prompt
                hidden_size=m.d_model,
                intermediate_size=m.d_ff,
                num_hidden_layers=m.n_layers,
                num_attention_heads=m.n_heads,
                num_key_value_heads=m.n_kv_heads or m.n_heads,
                hidden_act="silu",
                max_position_embeddings=m.max_len,
                rms_norm_eps=1e-5,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                attention_bias=m.bias,
                mlp_bias=m.bias,
                tie_word_embeddings=False,
                architectures=["LlamaForCausalLM"],
            )
        case "gpt_neox":
            return transformers.GPTNeoXConfig(
                **common,
                bos_token_id=EOS_ID,
                hidden_size=m.d_model,
                intermediate_size=m.d_ff,
                num_hidden_layers=m.n_layers,
                num_attention_heads=m.n_heads,
                hidden_act=m.ffn,
                max_position_embeddings=m.max_len,
                layer_norm_eps=1e-5,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
                use_parallel_residual=False,
                attention_bias=m.bias,
                tie_word_embeddings=False,
                architectures=["GPTNeoXForCausalLM"],
            )
        case "gpt2":
            return transformers.GPT2Config(
                **common,
                bos_token_id=EOS_ID,
                n_embd=m.d_model,
                n_inner=m.d_ff,
                n_layer=m.n_layers,
                n_head=m.n_heads,
                n_positions=m.max_len,
                activation_function=m.ffn,
                layer_norm_epsilon=1e-5,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
                tie_word_embeddings=False,
                architectures=["GPT2LMHeadModel"],
            )
    raise ValueError(architecture)


# ---- weights ---------------------------------------------------------------------------------------


def _split_qkv(w: Tensor, m: ModelConfig) -> tuple[Tensor, Tensor, Tensor]:
    """tformer's fused [Q; K; V] rows (weight or bias) as three tensors."""
    d_head = m.d_model // m.n_heads
    kv = (m.n_kv_heads or m.n_heads) * d_head
    return tuple(w.split([m.n_heads * d_head, kv, kv], dim=0))


def _linear(out: State, name: str, src: State, prefix: str, rows=None, cols=None) -> None:
    """Copy a Linear's weight (and bias, when it has one; zeros otherwise) with optional row/column maps."""
    w = src[f"{prefix}.weight"]
    b = src.get(f"{prefix}.bias", torch.zeros(w.size(0)))
    out[f"{name}.weight"] = _apply(_apply(w, rows, 0), cols, 1)
    out[f"{name}.bias"] = _apply(b, rows, 0)


def _apply(t: Tensor, perm: Tensor | None, dim: int) -> Tensor:
    return t if perm is None else t.index_select(dim, perm)


def _bart_family(src: State, m: ModelConfig, pre_ln: bool) -> State:
    """Marian (post-LN) and Pegasus (pre-LN): BART's names, with the model dimension permuted."""
    d = m.d_model
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])  # interleaved sin/cos -> halves
    out: State = {}

    def norm(name: str, prefix: str) -> None:
        out[f"{name}.weight"] = src[f"{prefix}.weight"][perm]
        out[f"{name}.bias"] = src[f"{prefix}.bias"][perm]

    def attention(name: str, prefix: str, cross: bool) -> None:
        if cross:
            q_w, (k_w, v_w) = src[f"{prefix}.q_proj.weight"], src[f"{prefix}.kv_proj.weight"].chunk(2)
            zeros = torch.zeros(2 * d)
            q_b = src.get(f"{prefix}.q_proj.bias", zeros[:d])
            k_b, v_b = src.get(f"{prefix}.kv_proj.bias", zeros).chunk(2)
        else:
            q_w, k_w, v_w = _split_qkv(src[f"{prefix}.qkv_proj.weight"], m)
            q_b, k_b, v_b = _split_qkv(src.get(f"{prefix}.qkv_proj.bias", torch.zeros(3 * d)), m)
        for part, w, b in (("q", q_w, q_b), ("k", k_w, k_b), ("v", v_w, v_b)):
            out[f"{name}.{part}_proj.weight"], out[f"{name}.{part}_proj.bias"] = w[:, perm], b
        _linear(out, f"{name}.out_proj", src, f"{prefix}.out_proj", rows=perm)

    for side in ("encoder", "decoder"):
        for i in range(_n_blocks(src, side)):
            hf, ours = f"model.{side}.layers.{i}", f"{side}.blocks.{i}"
            attention(f"{hf}.self_attn", f"{ours}.self_attn", cross=False)
            norm(f"{hf}.self_attn_layer_norm", f"{ours}.self_attn_norm")
            if side == "decoder":
                attention(f"{hf}.encoder_attn", f"{ours}.cross_attn", cross=True)
                norm(f"{hf}.encoder_attn_layer_norm", f"{ours}.cross_attn_norm")
            _linear(out, f"{hf}.fc1", src, f"{ours}.ffn.w1", cols=perm)
            _linear(out, f"{hf}.fc2", src, f"{ours}.ffn.w2", rows=perm)
            norm(f"{hf}.final_layer_norm", f"{ours}.ffn_norm")
        if pre_ln:
            norm(f"model.{side}.layer_norm", f"{side}.final_norm")
        out[f"model.{side}.embed_tokens.weight"] = src[f"{side}.embedding.embedding.weight"][:, perm]
        out[f"model.{side}.embed_positions.weight"] = _halves_table(m.max_len, d)
    if m.share_all_embeddings:
        out["model.shared.weight"] = out["model.encoder.embed_tokens.weight"]
    out["lm_head.weight"] = src["lm_head.weight"][:, perm]
    out["final_logits_bias"] = torch.zeros(1, src["lm_head.weight"].size(0))
    return out


def _halves_table(n: int, d: int) -> Tensor:
    """Marian's / Pegasus's own position table (sin half, cos half): what they would compute themselves."""
    table = sinusoidal_table(n, d)
    return torch.cat([table[:, 0::2], table[:, 1::2]], dim=1)


def _n_blocks(src: State, side: str = "decoder") -> int:
    return len({k.split(".")[2] for k in src if k.startswith(f"{side}.blocks.")})


def _layer_norm(out: State, name: str, src: State, prefix: str) -> None:
    out[f"{name}.weight"], out[f"{name}.bias"] = src[f"{prefix}.weight"], src[f"{prefix}.bias"]


def _embeddings(src: State, m: ModelConfig) -> tuple[Tensor, Tensor]:
    """(input embedding with tformer's sqrt(d_model) folded in, output projection)."""
    embedding = src["decoder.embedding.embedding.weight"]
    return embedding * math.sqrt(m.d_model), src["lm_head.weight"].clone()


def _llama(src: State, m: ModelConfig) -> State:
    out: State = {}
    out["model.embed_tokens.weight"], out["lm_head.weight"] = _embeddings(src, m)
    for i in range(_n_blocks(src)):
        hf, ours = f"model.layers.{i}", f"decoder.blocks.{i}"
        parts = zip(("q", "k", "v"), _split_qkv(src[f"{ours}.self_attn.qkv_proj.weight"], m), strict=True)
        for part, w in parts:
            out[f"{hf}.self_attn.{part}_proj.weight"] = w
        if m.bias:
            for part, b in zip(("q", "k", "v"), _split_qkv(src[f"{ours}.self_attn.qkv_proj.bias"], m), strict=True):
                out[f"{hf}.self_attn.{part}_proj.bias"] = b
        gate, up = src[f"{ours}.ffn.w1.weight"].chunk(2)
        out[f"{hf}.mlp.gate_proj.weight"], out[f"{hf}.mlp.up_proj.weight"] = gate, up
        out[f"{hf}.mlp.down_proj.weight"] = src[f"{ours}.ffn.w2.weight"]
        out[f"{hf}.self_attn.o_proj.weight"] = src[f"{ours}.self_attn.out_proj.weight"]
        if m.bias:
            out[f"{hf}.mlp.gate_proj.bias"], out[f"{hf}.mlp.up_proj.bias"] = src[f"{ours}.ffn.w1.bias"].chunk(2)
            out[f"{hf}.mlp.down_proj.bias"] = src[f"{ours}.ffn.w2.bias"]
            out[f"{hf}.self_attn.o_proj.bias"] = src[f"{ours}.self_attn.out_proj.bias"]
        out[f"{hf}.input_layernorm.weight"] = src[f"{ours}.self_attn_norm.weight"]
        out[f"{hf}.post_attention_layernorm.weight"] = src[f"{ours}.ffn_norm.weight"]
    out["model.norm.weight"] = src["decoder.final_norm.weight"]
    return out


def _gpt_neox(src: State, m: ModelConfig) -> State:
    out: State = {}
    out["gpt_neox.embed_in.weight"], out["lm_head.weight"] = _embeddings(src, m)
    d_head = m.d_model // m.n_heads

    def by_head(t: Tensor) -> Tensor:  # [Q; K; V] rows -> head 0 (q, k, v), head 1 (q, k, v), ...
        q, k, v = (x.reshape(m.n_heads, d_head, *x.shape[1:]) for x in _split_qkv(t, m))
        return torch.stack([q, k, v], dim=1).reshape(3 * m.d_model, *t.shape[1:])

    for i in range(_n_blocks(src)):
        hf, ours = f"gpt_neox.layers.{i}", f"decoder.blocks.{i}"
        out[f"{hf}.attention.query_key_value.weight"] = by_head(src[f"{ours}.self_attn.qkv_proj.weight"])
        out[f"{hf}.attention.dense.weight"] = src[f"{ours}.self_attn.out_proj.weight"]
        if m.bias:
            out[f"{hf}.attention.query_key_value.bias"] = by_head(src[f"{ours}.self_attn.qkv_proj.bias"])
            out[f"{hf}.attention.dense.bias"] = src[f"{ours}.self_attn.out_proj.bias"]
        _linear(out, f"{hf}.mlp.dense_h_to_4h", src, f"{ours}.ffn.w1")
        _linear(out, f"{hf}.mlp.dense_4h_to_h", src, f"{ours}.ffn.w2")
        _layer_norm(out, f"{hf}.input_layernorm", src, f"{ours}.self_attn_norm")
        _layer_norm(out, f"{hf}.post_attention_layernorm", src, f"{ours}.ffn_norm")
    _layer_norm(out, "gpt_neox.final_layer_norm", src, "decoder.final_norm")
    return out


def _gpt2(src: State, m: ModelConfig) -> State:
    out: State = {}
    out["transformer.wte.weight"], out["lm_head.weight"] = _embeddings(src, m)
    learned = src.get("decoder.positions.embedding.weight")
    out["transformer.wpe.weight"] = learned if learned is not None else sinusoidal_table(m.max_len, m.d_model)

    def conv1d(name: str, prefix: str) -> None:  # GPT-2's Conv1D stores (in, out)
        w = src[f"{prefix}.weight"]
        out[f"{name}.weight"] = w.t().contiguous()
        out[f"{name}.bias"] = src.get(f"{prefix}.bias", torch.zeros(w.size(0)))

    for i in range(_n_blocks(src)):
        hf, ours = f"transformer.h.{i}", f"decoder.blocks.{i}"
        conv1d(f"{hf}.attn.c_attn", f"{ours}.self_attn.qkv_proj")
        conv1d(f"{hf}.attn.c_proj", f"{ours}.self_attn.out_proj")
        conv1d(f"{hf}.mlp.c_fc", f"{ours}.ffn.w1")
        conv1d(f"{hf}.mlp.c_proj", f"{ours}.ffn.w2")
        _layer_norm(out, f"{hf}.ln_1", src, f"{ours}.self_attn_norm")
        _layer_norm(out, f"{hf}.ln_2", src, f"{ours}.ffn_norm")
    _layer_norm(out, "transformer.ln_f", src, "decoder.final_norm")
    return out


_STATE = {
    "marian": lambda src, m: _bart_family(src, m, pre_ln=False),
    "pegasus": lambda src, m: _bart_family(src, m, pre_ln=True),
    "llama": _llama,
    "gpt_neox": _gpt_neox,
    "gpt2": _gpt2,
}
