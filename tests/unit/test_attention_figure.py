"""The attention picture (attention_maps.attention_figure), read back from the drawn figure: each panel's tick
labels are its own tokens (source for the encoder, target for the decoder, target x source for cross-attention),
each panel has its matrix's shape and square cells, the labels are legible and inside the figure, there is a
colour bar, and the title is wrapped inside the figure."""

import matplotlib
import pytest
import torch
from test_attention_maps import _checkpoint

from tformer_cli.attention_maps import attention_figure, attention_heatmaps, classifier_maps, text_maps
from tformer_cli.decoding.search import greedy
from tformer_cli.decoding.settings import SearchSettings
from tformer_cli.run import load_run
from tformer_cli.tokenizer import EOS_ID

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TEXT = "the cat is red on the house"
LEGIBLE_PT = 7  # the smallest tick label read comfortably in print


def _expected(run, kind: str) -> dict[str, tuple[list[str], list[str]]]:
    """Each module's (row tokens, column tokens), worked out here from the tokenizer and the model."""
    tok = run.tokenizer
    if kind == "classifier":
        _, rows, _, _ = classifier_maps(run, 1)  # the pattern's marked tokens (test_attention_maps checks them)
        return {"enc L0.self": (rows[0], rows[0])}
    ids = tok.encode([TEXT])[0]
    if kind == "lm":
        return {"dec L0.self": (tok.pieces(ids), tok.pieces(ids))}
    source = tok.pieces(ids + [EOS_ID])
    hyp = greedy(run.model, torch.tensor([ids + [EOS_ID]]), SearchSettings())[0].tokens
    target = ["<s>"] + tok.pieces(hyp[:-1])  # the decoder's input tokens, its queries and its self-attention's keys
    assert len(target) != len(source)  # else a swapped axis would go unseen
    return {"enc L0.self": (source, source), "dec L0.self": (target, target), "dec L0.cross": (target, source)}


def _panels(fig):
    """{(module name, head): axes} of the drawn heat maps."""
    out = {}
    for ax in fig.axes:
        if ax.images:
            name, head = ax.get_title().rsplit(" head ", 1)
            out[name, int(head)] = ax
    return out


def _inside(fig, artists) -> bool:
    box = fig.bbox
    for artist in artists:
        b = artist.get_window_extent()
        if b.width and not (box.x0 - 1 <= b.x0 and b.x1 <= box.x1 + 1 and box.y0 - 1 <= b.y0 and b.y1 <= box.y1 + 1):
            return False
    return True


def _no_overlap(fig, axes) -> None:
    """No text of one panel (title, axis names, tick labels) overlaps another panel's, or the figure's title."""
    groups = [[ax.title, ax.xaxis.label, ax.yaxis.label, *ax.get_xticklabels(), *ax.get_yticklabels()] for ax in axes]
    groups.append([fig._suptitle])
    boxes = [[t.get_window_extent() for t in group if t is not None and t.get_text()] for group in groups]
    for i, mine in enumerate(boxes):
        for theirs in boxes[i + 1 :]:
            assert not any(a.overlaps(b) for a in mine for b in theirs)


@pytest.mark.parametrize("kind", ["seq2seq", "lm", "classifier"])
def test_each_panel_shows_its_own_tokens_with_square_cells_a_colour_bar_and_the_title_inside(
    tmp_path, tokenizer_dir, kind
):
    run = load_run(_checkpoint(tmp_path, tokenizer_dir, kind), device="cpu", cast=False)
    maps, rows, cols, title = classifier_maps(run, 1) if kind == "classifier" else text_maps(run, TEXT)
    title = f"{title} " * 12  # a long title: it must wrap
    fig = attention_figure(maps, rows, cols, title)
    fig.canvas.draw()
    expected = _expected(run, kind)
    panels = _panels(fig)
    assert sorted(panels) == sorted((name, h) for name in expected for h in range(2))  # 2 heads per module
    for (name, head), ax in panels.items():
        row_tokens, col_tokens = expected[name]
        assert ax.images[0].get_array().shape == (len(row_tokens), len(col_tokens)), name
        assert [t.get_text() for t in ax.get_xticklabels()] == col_tokens, (name, head)
        y_labels = [t.get_text() for t in ax.get_yticklabels()]
        assert y_labels == (row_tokens if head == 0 else [""] * len(row_tokens)), (name, head)
        if kind == "seq2seq" and head == 0:  # the axes' names: rows (queries), then columns (keys)
            words = {"enc L0.self": ("source", "source"), "dec L0.self": ("target", "target")}
            query, key = words.get(name, ("target", "source"))
            assert ax.get_ylabel().startswith(query) and ax.get_xlabel().startswith(key), name
        box = ax.get_window_extent()  # square cells: the panel's box has its matrix's aspect
        assert box.height / box.width == pytest.approx(len(row_tokens) / len(col_tokens), rel=0.03), name
        labels = ax.get_xticklabels() + ax.get_yticklabels()
        assert all(t.get_fontsize() >= LEGIBLE_PT for t in labels)
        assert _inside(fig, labels), name
    _no_overlap(fig, panels.values())
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(bars) == 1 and bars[0].get_xlim() == (0.0, 1.0)
    assert {c.get_cmap().name for c in bars[0].collections} == {"viridis"}  # the panels' colours, drawn
    assert {ax.images[0].get_cmap().name for ax in panels.values()} == {"viridis"}
    assert {ax.images[0].get_clim() for ax in panels.values()} == {(0.0, 1.0)}  # one scale: the bar's
    suptitle = fig.get_suptitle()
    assert suptitle.replace("\n", " ").split() == title.split() and "\n" in suptitle  # all of it, wrapped
    assert _inside(fig, [fig._suptitle])
    plt.close(fig)


def test_a_long_input_is_labelled_sparsely_without_overlap_and_written(tmp_path, tokenizer_dir):
    run = load_run(_checkpoint(tmp_path, tokenizer_dir, "lm"), device="cpu", cast=False)
    maps, rows, cols, title = text_maps(run, " ".join([TEXT] * 12))
    n = len(cols[0])
    assert n > 100
    fig = attention_figure(maps, rows, cols, title)
    fig.canvas.draw()
    ax = _panels(fig)["dec L0.self", 0]
    shown = [t for t in ax.get_xticklabels() if t.get_text()]
    assert 10 < len(shown) < n  # thinned out, not dropped
    step = int(ax.get_xticks()[1] - ax.get_xticks()[0])
    assert [t.get_text() for t in shown] == cols[0][::step]
    boxes = [t.get_window_extent() for t in shown]
    assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:], strict=False))  # side by side, not overlapping
    assert all(t.get_fontsize() >= LEGIBLE_PT for t in shown)
    plt.close(fig)
    attention_heatmaps(maps, rows, cols, tmp_path / "long.png", title)
    assert (tmp_path / "long.png").stat().st_size > 10_000
