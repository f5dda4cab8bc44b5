"""Collect attention weights for one input, for `tformer attention` (the reference path returns them).

Inputs are built on the model's device (a run loaded on CUDA works as one on the CPU); maps come back
as NumPy arrays, on the CPU.
"""

from __future__ import annotations

import torch
from torch import nn

from tformer_cli.data import sessions
from tformer_cli.data.pattern import generate_from
from tformer_cli.errors import TformerError
from tformer_cli.model.attention import MultiHeadAttention
from tformer_cli.run import Run
from tformer_cli.tokenizer import BOS_ID, EOS_ID


def _capture(model: nn.Module, run) -> list[tuple[str, torch.Tensor]]:
    modules = [(name, m) for name, m in model.named_modules() if isinstance(m, MultiHeadAttention)]
    for _, m in modules:
        m.keep_weights = True
    with torch.inference_mode():
        run()
    maps = []
    for name, m in modules:
        short = (
            name.replace("blocks.", "L").replace("encoder.", "enc ").replace("decoder.", "dec ").replace("_attn", "")
        )
        assert m.last_weights is not None
        maps.append((short, m.last_weights[0].float().cpu().numpy()))
        m.keep_weights, m.last_weights = False, None
    return maps


def classifier_maps(run: Run, example: int):
    """Maps for validation example `example` of a PatternSequence run; the pattern's tokens are marked.

    Raises:
        TformerError: `example` is not an index of the validation split.
    """
    data = generate_from(run.config.data.pattern)  # the recipe's own examples, as training generated them
    n_valid = data.valid_tokens.size(0)
    if not 0 <= example < n_valid:
        raise TformerError(f"--example {example}: the validation split has examples 0..{n_valid - 1}")
    tokens = data.valid_tokens[example : example + 1].to(run.device)
    label = int(data.valid_labels[example])
    start = int(data.positions[data.train_tokens.size(0) + example])
    width = data.patterns.size(1)
    labels = [f"*{t}" if start <= i < start + width else str(t) for i, t in enumerate(tokens[0].tolist())]
    maps = _capture(run.model, lambda: run.model(tokens))
    title = f"validation example {example}: class {label}, pattern at positions {start}..{start + width - 1} (marked *)"
    return maps, labels, [labels] * len(maps), title


_RULE_MARKS = {sessions.LOCAL: "+1", sessions.LONG: "<<", sessions.RANDOM: "?"}  # how each rule made the next item


def session_maps(run: Run, example: int):
    """Maps for validation session `example` of a sessions run: its items on both axes.

    Row t is the prediction of the item after item t: its label is `item -> next item` and how the
    generator made that next item (`+1` local, `<<` a copy of an earlier item, `?` random). Columns
    are the items attended to.

    Raises:
        TformerError: `example` is not an index of the validation split.
    """
    data = sessions.split(run.config.data.sessions, "valid")  # the recipe's own sessions, as training made them
    if not 0 <= example < len(data):
        raise TformerError(f"--example {example}: the validation split has sessions 0..{len(data) - 1}")
    n_targets = int((data.rules[example] != sessions.NO_TARGET).sum())  # the inputs before any padding
    inputs = data.inputs[example, :n_targets].tolist()
    targets, rules = data.targets[example, :n_targets].tolist(), data.rules[example, :n_targets].tolist()
    cols = [str(item) for item in inputs]
    rows = [f"{item}->{nxt} {_RULE_MARKS[rule]}" for item, nxt, rule in zip(inputs, targets, rules, strict=True)]
    tokens = torch.tensor([inputs], device=run.device)
    maps = _capture(run.model, lambda: run.model(tokens))
    title = f"validation session {example}: row = item -> next item (+1 local, << long-range copy, ? random)"
    return maps, rows, [cols] * len(maps), title


def text_maps(run: Run, text: str):
    """Maps for a sentence: encoder/decoder self- and cross-attention (seq2seq, decoding greedily), or LM."""
    from tformer_cli.decoding.search import greedy

    model, tok, device = run.model, run.tokenizer, run.device
    src_ids = tok.encode([text])[0] + [EOS_ID]
    if run.kind == "lm":
        ids = torch.tensor([src_ids[:-1]], device=device)
        pieces = tok.pieces(src_ids[:-1])
        maps = _capture(model, lambda: model(ids))
        return maps, pieces, [pieces] * len(maps), text
    src = torch.tensor([src_ids], device=device)
    hyp = greedy(model, src)[0].tokens
    tgt_in = torch.tensor([[BOS_ID] + hyp[:-1]], device=device)
    maps = _capture(model, lambda: model(src, tgt_in))
    src_pieces, tgt_pieces = tok.pieces(src_ids), ["<s>"] + tok.pieces(hyp[:-1])
    cols = [src_pieces if name.startswith("enc") or "cross" in name else tgt_pieces for name, _ in maps]
    rows = src_pieces  # rows differ per map; heatmaps label rows with the longer list's pieces
    return maps, rows if len(rows) >= len(tgt_pieces) else tgt_pieces, cols, f"{text} -> {tok.decode(hyp)}"
