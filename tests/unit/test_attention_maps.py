"""Attention maps (attention_maps.py) of a run loaded on each device: the CPU's maps, as NumPy arrays."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from meta_device import off_the_cpu

from tformer_cli.attention_maps import classifier_maps, session_maps, text_maps
from tformer_cli.config import config_to_dict, load_config
from tformer_cli.data import sessions
from tformer_cli.errors import TformerError
from tformer_cli.run import build_model_from_config, load_run
from tformer_cli.run.checkpoints import save_checkpoint
from tformer_cli.tokenizer import Tokenizer

SMALL = ["model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.d_ff=32", "model.dropout=0.0"]
KINDS = {
    "seq2seq": ["data.kind=parallel", "model.kind=seq2seq"],
    "lm": ["data.kind=text", "model.kind=lm"],
    "classifier": ["data.kind=pattern", "model.kind=classifier", "data.pattern.vocab_size=12"],
    "sessions": ["data.kind=sessions", "model.kind=lm", "data.sessions.n_items=20", "data.sessions.n_sessions=1010"],
}


def _checkpoint(folder: Path, tokenizer_dir: Path, kind: str) -> Path:
    """A freshly initialised model of `kind` saved as a standalone checkpoint (text kinds with `tokenizer_dir`'s
    tokenizer)."""
    config = load_config(None, [*SMALL, *KINDS[kind], f"data.dir={tokenizer_dir}", "tokenizer.vocab_size=40"])
    tokenizer = Tokenizer(tokenizer_dir / "spm.model") if kind in ("seq2seq", "lm") else None
    torch.manual_seed(0)
    model = build_model_from_config(config, tokenizer.vocab_size if tokenizer else None)
    path = folder / f"{kind}.pt"
    fingerprint = tokenizer.fingerprint if tokenizer else None
    save_checkpoint(
        {"model": model.state_dict(), "config": config_to_dict(config), "tokenizer_fingerprint": fingerprint}, path
    )
    return path


def _maps(path: Path, kind: str, device: str):
    run = load_run(path, device=device, cast=False)
    # Plain fp32 on CUDA too (load_run turned TF32 on; conftest restores the default after the test): a
    # seq2seq map follows a greedy hypothesis, which TF32's rounding could flip on a near tie.
    torch.set_float32_matmul_precision("highest")
    if kind in ("classifier", "sessions"):
        return (classifier_maps if kind == "classifier" else session_maps)(run, 1)
    return text_maps(run, "the cat is red")


@pytest.mark.parametrize("kind", list(KINDS))
def test_maps_of_a_run_on_any_device_are_the_cpu_s(tmp_path, tokenizer_dir, kind, device):
    path = _checkpoint(tmp_path, tokenizer_dir, kind)
    maps, rows, cols, title = _maps(path, kind, device.type)
    cpu_maps, cpu_rows, cpu_cols, cpu_title = _maps(path, kind, "cpu")
    assert (rows, cols, title) == (cpu_rows, cpu_cols, cpu_title)
    assert [name for name, _ in maps] == [name for name, _ in cpu_maps]
    # one layer: seq2seq's self, self and cross; the others' self-attention
    assert len(maps) == {"seq2seq": 3, "lm": 1, "classifier": 1, "sessions": 1}[kind]
    for (name, weights), (_, cpu_weights) in zip(maps, cpu_maps, strict=True):
        assert isinstance(weights, np.ndarray) and weights.shape == cpu_weights.shape, name
        assert np.allclose(weights, cpu_weights, atol=1e-4), name
        assert np.allclose(weights.sum(-1), 1.0, atol=1e-3), name


@pytest.mark.parametrize("kind", list(KINDS))
def test_maps_are_made_on_the_models_device(tmp_path, tokenizer_dir, kind):
    """The inputs, the greedy translation a seq2seq map follows and the maps are made on the run's device: on the
    meta device, which refuses a CPU tensor mixed in as CUDA does, the same labels and map shapes as on the CPU
    (tests/unit/meta_device.py; on CUDA `tformer attention` of a translation model once stopped: "index is on cpu")."""
    run = load_run(_checkpoint(tmp_path, tokenizer_dir, kind), device="cpu", cast=False)

    def maps_of(model):
        run.model = model
        if kind in ("classifier", "sessions"):
            return (classifier_maps if kind == "classifier" else session_maps)(run, 1)
        return text_maps(run, "the cat is red")

    (cpu_maps, *cpu_labels), (maps, *labels) = off_the_cpu(maps_of, run.model)
    assert labels == cpu_labels
    assert [(name, m.shape) for name, m in maps] == [(name, m.shape) for name, m in cpu_maps]


def test_a_session_s_map_has_its_items_on_the_axes_and_no_padding(tmp_path, tokenizer_dir):
    path = _checkpoint(tmp_path, tokenizer_dir, "sessions")
    run = load_run(path, device="cpu", cast=False)
    run.config = dataclasses.replace(  # the same weights read a padded session (min_len 3)
        run.config, data=dataclasses.replace(run.config.data, sessions=_padded(run.config.data.sessions))
    )
    data = sessions.split(run.config.data.sessions, "valid")
    example = int((data.items == sessions.PAD_ID).any(1).nonzero()[0])  # a session shorter than session_len
    n = int((data.items[example] != sessions.PAD_ID).sum()) - 1  # its inputs: every item but the last
    maps, rows, cols, title = session_maps(run, example)
    items = data.items[example].tolist()
    assert cols == [[str(item) for item in items[:n]]] and len(rows[0]) == n and maps[0][1].shape == (2, n, n)
    marks = {sessions.LOCAL: "+1", sessions.LONG: "<<", sessions.RANDOM: "?"}
    assert rows == [[f"{items[t]}->{items[t + 1]} {marks[int(data.rules[example, t])]}" for t in range(n)]]
    assert f"validation session {example}" in title
    with pytest.raises(TformerError, match=r"--example 10: the validation split has sessions 0\.\.9"):
        session_maps(run, 10)


def _padded(cfg):
    return dataclasses.replace(cfg, min_len=3, n_sessions=30, n_valid=10, n_test=10)
