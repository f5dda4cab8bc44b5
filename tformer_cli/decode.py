"""Decoding for language models: greedy and sampling (temperature, top-k, top-p), with a KV cache.

Shape legend: B batch, T length, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from tformer_cli.model.lm import LanguageModel


def sample_next(
    logits: Tensor,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Choose the next token from logits (B, V).

    temperature 0 is greedy (argmax). Otherwise: divide by the temperature, keep the top_k most
    likely tokens (0 = all), then the smallest set whose probability reaches top_p, and sample.
    """
    if temperature <= 0.0 or top_k == 1:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the tokens before it already reach top_p (the first one always stays)
        drop = probs.cumsum(-1) - probs >= top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


@torch.inference_mode()
def generate(
    model: LanguageModel,
    prompt: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_id: int | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    on_token: Callable[[Tensor], None] | None = None,
) -> Tensor:
    """Extend `prompt` (B, T) by up to `max_new_tokens` tokens.

    With `use_cache`, the prompt is run once and each new token costs one step over the cached keys
    and values; without it, every step recomputes the whole prefix (the reference, and the baseline
    the benchmark compares with). Stops early once every row has produced `eos_id`.

    Returns:
        (B, T + n_new) tokens; rows that finished early are padded with `eos_id`.
    """
    model.eval()
    tokens = prompt
    cache = model.new_cache(prompt.size(1) + max_new_tokens) if use_cache else None
    logits = model(prompt, cache=cache)[:, -1]  # (B, V)
    done = torch.zeros(prompt.size(0), dtype=torch.bool, device=prompt.device)
    for _ in range(max_new_tokens):
        next_token = sample_next(logits, temperature, top_k, top_p, generator)  # (B,)
        if eos_id is not None:
            next_token = next_token.masked_fill(done, eos_id)
            done |= next_token == eos_id
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        if on_token is not None:
            on_token(next_token)
        if eos_id is not None and bool(done.all()):
            break
        step_input = next_token[:, None] if cache is not None else tokens
        logits = model(step_input, cache=cache)[:, -1]
    if cache is not None:
        cache.release()  # its buffers serve the next prompt
    return tokens
