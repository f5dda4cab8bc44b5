"""Attention maps (attention_maps.py) of a run loaded on each device: the CPU's maps, as NumPy arrays."""

from pathlib import Path

import numpy as np
import pytest
import torch

from tformer_cli.attention_maps import classifier_maps, text_maps
from tformer_cli.config import config_to_dict, load_config
from tformer_cli.run import build_model_from_config, load_run
from tformer_cli.run.checkpoints import save_checkpoint
from tformer_cli.tokenizer import Tokenizer

SMALL = ["model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.d_ff=32", "model.dropout=0.0"]
KINDS = {
    "seq2seq": ["data.kind=parallel", "model.kind=seq2seq"],
    "lm": ["data.kind=text", "model.kind=lm"],
    "classifier": ["data.kind=pattern", "model.kind=classifier", "data.pattern.vocab_size=12"],
}


def _checkpoint(folder: Path, tokenizer_dir: Path, kind: str) -> Path:
    """A freshly initialised model of `kind` saved as a standalone checkpoint (text kinds with `tokenizer_dir`'s
    tokenizer)."""
    config = load_config(None, [*SMALL, *KINDS[kind], f"data.dir={tokenizer_dir}", "tokenizer.vocab_size=40"])
    tokenizer = Tokenizer(tokenizer_dir / "spm.model") if kind != "classifier" else None
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
    return classifier_maps(run, 1) if kind == "classifier" else text_maps(run, "the cat is red")


@pytest.mark.parametrize("kind", list(KINDS))
def test_maps_of_a_run_on_any_device_are_the_cpu_s(tmp_path, tokenizer_dir, kind, device):
    path = _checkpoint(tmp_path, tokenizer_dir, kind)
    maps, rows, cols, title = _maps(path, kind, device.type)
    cpu_maps, cpu_rows, cpu_cols, cpu_title = _maps(path, kind, "cpu")
    assert (rows, cols, title) == (cpu_rows, cpu_cols, cpu_title)
    assert [name for name, _ in maps] == [name for name, _ in cpu_maps]
    assert len(maps) == {"seq2seq": 3, "lm": 1, "classifier": 1}[kind]  # one layer: seq2seq's self, self, cross
    for (name, weights), (_, cpu_weights) in zip(maps, cpu_maps, strict=True):
        assert isinstance(weights, np.ndarray) and weights.shape == cpu_weights.shape, name
        assert np.allclose(weights, cpu_weights, atol=1e-4), name
        assert np.allclose(weights.sum(-1), 1.0, atol=1e-3), name
