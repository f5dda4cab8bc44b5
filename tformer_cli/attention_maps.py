"""`tformer attention`: collect the attention weights for one input, and draw them.

Each `*_maps` function returns (maps, rows, cols, title): maps is [(module name, weights (H, T_q, T_k))],
rows[i] and cols[i] the tokens of map i's queries and keys (a translation model's encoder: source x
source; decoder self-attention: target x target; cross-attention: target x source, the target being
the decoder's input, `<s>` first). Inputs are built on the model's device (a run loaded on CUDA works
as one on the CPU); maps come back as NumPy arrays, on the CPU. `attention_heatmaps` draws them.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import cast

import numpy as np
import torch
from torch import nn

from tformer_cli.data import sessions
from tformer_cli.data.pattern import generate_from
from tformer_cli.errors import TformerError
from tformer_cli.kinds import MODEL_KINDS
from tformer_cli.log import console
from tformer_cli.model.attention import MultiHeadAttention, reference_attention
from tformer_cli.model.seq2seq import Seq2Seq
from tformer_cli.run import Run
from tformer_cli.tokenizer import BOS_ID, EOS_ID


def _capture(model: nn.Module, run) -> list[tuple[str, np.ndarray]]:
    """Run `run()` on the reference attention path; return each attention module's weights of the first row.

    A forward hook on each module's `weights_tap` keeps the last weights it saw; the hooks are removed and the
    path restored whatever `run` raises."""
    modules = [(name, m) for name, m in model.named_modules() if isinstance(m, MultiHeadAttention)]
    seen: dict[str, torch.Tensor] = {}
    handles = []
    try:
        for name, m in modules:
            handles.append(m.weights_tap.register_forward_hook(partial(_keep, seen, name)))
        with reference_attention(), torch.inference_mode():
            run()
    finally:
        for handle in handles:
            handle.remove()
    maps = []
    for name, _ in modules:
        short = (
            name.replace("blocks.", "L").replace("encoder.", "enc ").replace("decoder.", "dec ").replace("_attn", "")
        )
        maps.append((short, seen[name][0].float().cpu().numpy()))
    return maps


def _keep(seen: dict[str, torch.Tensor], name: str, module: nn.Module, args: tuple, weights: torch.Tensor) -> None:
    seen[name] = weights.detach()


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
    return maps, [labels] * len(maps), [labels] * len(maps), title


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
    return maps, [rows] * len(maps), [cols] * len(maps), title


def text_maps(run: Run, text: str):
    """Maps for a sentence: encoder/decoder self- and cross-attention (seq2seq, of its greedy translation), or
    an LM's self-attention over the sentence's tokens."""
    from tformer_cli.decoding.api import SearchSettings, translate_batch

    model, tok, device = run.model, run.tokenizer, run.device
    assert tok is not None  # a run that reads text (check_served) has its tokenizer
    has_source, limit = MODEL_KINDS[run.kind].has_source, run.config.model.max_len
    ids = tok.encode([text])[0]
    room = limit - 1 if has_source else limit  # a source ends in EOS
    if len(ids) > room:  # as translate and generate do: no position the model was not trained for
        console.print(
            f"[yellow]warning:[/] --text: {len(ids):,} tokens, more than the model serves (model.max_len {limit:,}): "
            f"shown from its first {room:,} tokens"
        )
        ids, text = ids[:room], tok.decode(ids[:room])
    if not has_source:  # a language model: its self-attention over the sentence
        pieces = tok.pieces(ids)
        lm_ids = torch.tensor([ids], device=device)
        maps = _capture(model, lambda: model(lm_ids))
        return maps, [pieces] * len(maps), [pieces] * len(maps), text
    src_ids = [*ids, EOS_ID]
    src = torch.tensor([src_ids], device=device)
    hyp = translate_batch(cast(Seq2Seq, model), src, SearchSettings(served=limit, static="never"))[0][0].tokens
    tgt_in = torch.tensor([[BOS_ID] + hyp[:-1]], device=device)
    maps = _capture(model, lambda: model(src, tgt_in))
    src_pieces, tgt_pieces = tok.pieces(src_ids), ["<s>"] + tok.pieces(hyp[:-1])  # the decoder's inputs
    rows = [src_pieces if name.startswith("enc") else tgt_pieces for name, _ in maps]  # queries
    cols = [src_pieces if name.startswith("enc") or "cross" in name else tgt_pieces for name, _ in maps]  # keys
    return maps, rows, cols, f"{text} -> {tok.decode(hyp)} (greedy search)"


# ---- the picture: one row of panels per attention module, one panel per head ----------------------

LABEL_PT = 7  # tick labels: the smallest size read comfortably in print
TITLE_PT = 10
MAX_WIDTH_IN = 22.0  # the figure's width when the panels need it; cells shrink (and labels thin out) beyond
CELL_IN = (0.01, 0.2)  # the side of one token's cell, in inches: smallest (a pixel or so), largest
LABEL_GAP_IN = 0.12  # tick labels closer than this would overlap: only every k-th token is labelled
CHAR_IN = LABEL_PT * 0.62 / 72  # the width of one tick-label character (DejaVu Sans, on average)
PANEL_GAP_IN = 0.35  # between two heads' panels
CMAP = "viridis"


def attention_heatmaps(
    maps: list[tuple[str, np.ndarray]],
    rows_by_map: list[list[str]],
    cols_by_map: list[list[str]],
    out: Path,
    title: str = "",
) -> None:
    """Write the attention picture of `maps` to `out` (.png, .pdf, .svg, ...: see `attention_figure`)."""
    from tformer_cli.plots import _save  # the figures' one atomic writer (imported here: matplotlib)

    _save(attention_figure(maps, rows_by_map, cols_by_map, title), out, dpi=120)


def attention_figure(
    maps: list[tuple[str, np.ndarray]],
    rows_by_map: list[list[str]],
    cols_by_map: list[list[str]],
    title: str = "",
):
    """The attention picture: per module (`name`, weights (H, T_q, T_k)) a row of H panels, each T_q x T_k cells
    of one size, the queries' tokens (`rows_by_map`) down the first panel and the keys' (`cols_by_map`) along
    every panel; one colour bar (0..1, shared); `title` wrapped to the figure's width.

    Returns:
        The matplotlib Figure (the caller saves or closes it).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    layout = _Layout.of(maps, rows_by_map, cols_by_map)
    wrapped = textwrap.fill(title, width=max(20, int(layout.width * 72 / (TITLE_PT * 0.6)))) if title else ""
    title_in = (wrapped.count("\n") + 1) * TITLE_PT * 1.5 / 72 if title else 0.0
    fig = plt.figure(figsize=(layout.width, sum(layout.rows_in) + title_in + 0.9), layout="constrained")
    panels = fig.subfigures(len(maps) + 1, 1, height_ratios=[*layout.rows_in, 0.9])
    *rows, bar = cast(np.ndarray, panels)  # two rows or more: an array of subfigures
    seq2seq = any("cross" in name for name, _ in maps)
    for subfig, (name, weights), row_labels, col_labels in zip(rows, maps, rows_by_map, cols_by_map, strict=True):
        _draw_row(subfig, layout, name, weights, row_labels, col_labels, _axis_names(name, seq2seq))
    cax = bar.add_axes((0.3, 0.6, 0.4, 0.15), label="<colorbar>")  # placed by hand: the layout leaves it be
    colorbar = bar.colorbar(ScalarMappable(Normalize(0.0, 1.0), CMAP), cax=cax, orientation="horizontal")
    colorbar.set_label("attention weight (each row sums to 1)", fontsize=LABEL_PT + 1)
    colorbar.ax.tick_params(labelsize=LABEL_PT)
    if wrapped:
        fig.suptitle(wrapped, fontsize=TITLE_PT)
    return fig


@dataclass(frozen=True)
class _Layout:
    """Sizes in inches: one token's cell, each row of panels' height, the figure's width."""

    n_heads: int
    widest: int  # the most keys of any map
    cell: float
    rows_in: list[float]
    width: float

    @staticmethod
    def of(maps: list[tuple[str, np.ndarray]], rows_by_map: list[list[str]], cols_by_map: list[list[str]]) -> _Layout:
        n_heads, widest = max(w.shape[0] for _, w in maps), max(w.shape[2] for _, w in maps)
        y_labels = max(CHAR_IN * max(map(len, labels), default=1) for labels in rows_by_map)  # the first panel's
        cell = (MAX_WIDTH_IN - y_labels - 1.0 - PANEL_GAP_IN * n_heads) / (n_heads * widest)
        cell = min(max(cell, CELL_IN[0]), CELL_IN[1])
        rows_in = [  # the matrix, the rotated key labels under it, the panel's title and the axis name
            w.shape[1] * cell + CHAR_IN * max(map(len, cols), default=1) + 1.0
            for (_, w), cols in zip(maps, cols_by_map, strict=True)
        ]
        width = y_labels + 0.6 + n_heads * (widest * cell + PANEL_GAP_IN)
        return _Layout(n_heads, widest, cell, rows_in, width)


def _draw_row(subfig, layout: _Layout, name: str, weights: np.ndarray, row_labels, col_labels, axis_names) -> None:
    """One module's heads, each panel as wide as its own matrix, packed to the left (a last, empty column takes
    the width left over); the first panel names the axes and labels the rows."""
    keys = weights.shape[2]
    ratios = [keys + PANEL_GAP_IN / layout.cell] * layout.n_heads + [layout.n_heads * (layout.widest - keys) + 1e-3]
    *axes, filler = subfig.subplots(1, layout.n_heads + 1, width_ratios=ratios)
    filler.set_axis_off()
    for h, ax in enumerate(axes):
        if h >= weights.shape[0]:
            ax.set_axis_off()
            continue
        ax.imshow(weights[h], cmap=CMAP, vmin=0.0, vmax=1.0, aspect="equal", interpolation="nearest")
        ax.set_title(f"{name} head {h}", fontsize=LABEL_PT + 1)
        _ticks(ax.set_xticks, col_labels, layout.cell, rotation=90)
        _ticks(ax.set_yticks, row_labels if h == 0 else [""] * len(row_labels), layout.cell)
        if h == 0:
            ax.set_ylabel(axis_names[0], fontsize=LABEL_PT + 1)
            ax.set_xlabel(axis_names[1], fontsize=LABEL_PT + 1)


def _ticks(set_ticks, labels: list[str], cell: float, rotation: int = 0) -> None:
    """Label every k-th of `labels` (cells `cell` inches apart), k the smallest that keeps them apart."""
    step = max(1, math.ceil(LABEL_GAP_IN / cell))
    set_ticks(range(0, len(labels), step), labels[::step], fontsize=LABEL_PT, rotation=rotation)


def _axis_names(name: str, seq2seq: bool) -> tuple[str, str]:
    """What a module's rows (queries) and columns (keys) are: source or target tokens, or the input's tokens."""
    if not seq2seq:
        return "query", "key"
    if name.startswith("enc"):
        return "source (query)", "source (key)"
    return "target (query: decoder input)", "source (key)" if "cross" in name else "target (key)"
