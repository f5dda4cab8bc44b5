"""Decoding outputs of seeded random models, as JSON: did a change alter what decoding produces?

    git worktree add /tmp/before <commit>
    python bench/decode_outputs.py /tmp/before > before.json
    python bench/decode_outputs.py . > after.json
    cmp before.json after.json && echo identical

52 configurations: encoder-decoders (tiny; grouped-query heads with RoPE, pre-norm, RMSNorm and
SwiGLU; ALiBi; the WMT14-base shape) with greedy and beam search (beam 4, 2-best, sources with
padding), and language models with greedy and sampled generation; fp32 and bf16 weights; with the
KV cache and without. Tokens and scores (rounded to 1e-4) of every hypothesis.
"""

import json
import sys
from pathlib import Path

import torch

CHECKOUT = str(Path(sys.argv[1]).resolve())
sys.path.insert(0, CHECKOUT)
import tformer_cli  # noqa: E402

assert tformer_cli.__file__.startswith(CHECKOUT), tformer_cli.__file__  # this checkout's code, not another

try:  # the names since session 9 (decoding/, run/); earlier checkouts have the old ones
    from tformer_cli.decoding.packed import pack_linears
    from tformer_cli.decoding.search import beam_search, generate, greedy
    from tformer_cli.run import cast_weights
except ImportError:
    from tformer_cli.beam import beam_search, greedy
    from tformer_cli.decode import generate
    from tformer_cli.inference import cast_weights
    from tformer_cli.model.packed import pack_linears
from tformer_cli.model import build_model  # noqa: E402

SHAPES = {
    "tiny": dict(d_model=32, n_heads=4, n_layers=2, d_ff=64, vocab_size=60),
    "gqa_rope_pre": dict(
        d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64, vocab_size=60, pos="rope",
        norm_placement="pre", norm="rmsnorm", ffn="swiglu",
    ),
    "alibi": dict(d_model=32, n_heads=4, n_layers=2, d_ff=64, vocab_size=60, pos="alibi"),
    "base": dict(d_model=512, n_heads=8, n_layers=6, d_ff=2048, vocab_size=8000, share_all_embeddings=True),
}  # fmt: skip


def _model(kind: str, shape: dict, dtype: torch.dtype, std: float):
    """A seeded model with random weight matrices (std `std`) whose outputs vary, prepared for decoding."""
    torch.manual_seed(0)
    model = build_model(kind, dropout=0.0, **shape).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, std)
    cast_weights(model, dtype)
    pack_linears(model)
    return model


def seq2seq_outputs(out: dict) -> None:
    for name, shape in SHAPES.items():
        for dtype in (torch.float32, torch.bfloat16):
            model = _model("seq2seq", shape, dtype, 0.05 if name == "base" else 0.3)
            src = torch.randint(4, shape["vocab_size"], (9, 12), generator=torch.Generator().manual_seed(1))
            src[3, 7:], src[5, 4:] = 0, 0  # padding
            for cache in (True, False) if name != "base" else (True,):
                key = f"{name}_{str(dtype)[6:]}"
                hyps = greedy(model, src, a=1.0, b=5, use_cache=cache)
                out[f"{key}_greedy_{cache}"] = [(h.tokens, round(h.score, 4)) for h in hyps]
                nbest = beam_search(model, src, beam=4, a=1.0, b=5, nbest=2, use_cache=cache)
                out[f"{key}_beam_{cache}"] = [[(h.tokens, round(h.score, 4)) for h in hs] for hs in nbest]


def lm_outputs(out: dict) -> None:
    for name, shape in SHAPES.items():
        if name == "base":
            continue
        for dtype in (torch.float32, torch.bfloat16):
            model = _model("lm", {k: v for k, v in shape.items() if k != "share_all_embeddings"}, dtype, 0.3)
            prompt = torch.randint(4, shape["vocab_size"], (3, 5), generator=torch.Generator().manual_seed(2))
            key = f"lm_{name}_{str(dtype)[6:]}"
            for cache in (True, False):
                out[f"{key}_greedy_{cache}"] = generate(model, prompt, 12, use_cache=cache).tolist()
                sampler = torch.Generator().manual_seed(3)
                sampled = generate(
                    model, prompt, 12, temperature=0.9, top_k=20, top_p=0.9, use_cache=cache, generator=sampler
                )
                out[f"{key}_sample_{cache}"] = sampled.tolist()


def main() -> None:
    torch.set_num_threads(2)
    out: dict = {}
    seq2seq_outputs(out)
    lm_outputs(out)
    json.dump(out, sys.stdout, sort_keys=True)


if __name__ == "__main__":
    main()
