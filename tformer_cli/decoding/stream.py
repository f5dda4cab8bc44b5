"""`tformer generate`'s output: a prompt continued, its text written as the tokens are produced."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from tformer_cli.decoding.search import generate
from tformer_cli.decoding.static import static_generate, use_static
from tformer_cli.schema import DecodeConfig
from tformer_cli.tokenizer import EOS_ID, Tokenizer


def stream_generation(
    model: nn.Module, tokenizer: Tokenizer, text: str, cfg: DecodeConfig, write: Callable[[str], None]
) -> str:
    """Continue `text` with `cfg`'s sampling settings; `write` gets the prompt, then each new piece of text.

    Prompt and continuation are detokenized together and only the new characters are written, so a
    piece's leading space (SentencePiece's "▁") survives. The stream starts after an end-of-line (the
    prompt follows EOS, as each line does in training) and stops at the next EOS or after
    `cfg.max_new_tokens` tokens.

    Returns:
        The whole text written.
    """
    ids = [EOS_ID] + tokenizer.encode([text])[0]
    device = next(model.parameters()).device
    produced = list(ids)
    shown = tokenizer.decode(produced)
    write(shown)

    def show(token: torch.Tensor) -> None:
        nonlocal shown
        produced.append(int(token[0]))
        decoded = tokenizer.decode(produced)
        write(decoded[len(shown) :])
        shown = decoded

    search = static_generate if use_static(cfg.static, device) else generate  # decoding/static.py
    search(
        model,
        torch.tensor([ids], device=device),
        cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_k=cfg.top_k,
        top_p=cfg.top_p,
        eos_id=EOS_ID,
        generator=torch.Generator(device=device).manual_seed(cfg.seed),
        on_token=show,
    )
    return shown
