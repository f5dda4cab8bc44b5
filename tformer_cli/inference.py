"""Loading a trained model for inference: checkpoint -> recipe -> tokenizer -> model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from tformer_cli.config import config_from_dict
from tformer_cli.decoding.packed import pack_linears
from tformer_cli.errors import CheckpointError, TformerError
from tformer_cli.evaluate import resolve_checkpoint
from tformer_cli.schema import Config
from tformer_cli.tokenizer import Tokenizer
from tformer_cli.train.loop import resolve_device
from tformer_cli.train.store import average_checkpoints, load_verified, paths_to_average
from tformer_cli.train.tasks import model_from_section


@dataclass
class Loaded:
    model: nn.Module
    config: Config
    tokenizer: Tokenizer
    checkpoint: Path


def load_for_inference(
    path: Path, overrides: list[str] | None = None, device: str = "auto", average: int = 0
) -> Loaded:
    """Rebuild a translation or language model from a checkpoint (or a run's best checkpoint).

    `decode.*` overrides may change the search; `average` > 0 averages the run's last N step
    checkpoints (0: off); the tokenizer must be the one the model was trained with (same sha256
    fingerprint). Every checkpoint read is verified against its run's index (store.load_verified).

    Raises:
        CheckpointError: a negative `average`, fewer checkpoints than asked, a checkpoint that does not
            verify, a classifier, or another tokenizer.
    """
    if average < 0:
        raise CheckpointError(f"--average takes the number of step checkpoints to average (0: off), got {average}")
    if average:
        paths = paths_to_average(path, average, "--average")
        ckpt, state = paths[-1], average_checkpoints(paths)
    else:
        ckpt = resolve_checkpoint(path)
        state = load_verified(ckpt)
    config = config_from_dict(state["config"], str(ckpt), overrides or [], allowed=("decode.",))
    if config.model.kind == "classifier":
        raise CheckpointError(
            f"{ckpt} is a classifier: it reads no text (`tformer eval` scores it, "
            "`tformer attention --example N` shows its attention)"
        )
    tokenizer = Tokenizer(Path(config.data.dir) / "spm.model")
    if state.get("tokenizer_fingerprint") != tokenizer.fingerprint:
        raise CheckpointError(
            f"{ckpt} was trained with another tokenizer than {tokenizer.path} "
            f"(fingerprints {str(state.get('tokenizer_fingerprint'))[:12]} vs {tokenizer.fingerprint[:12]})"
        )
    model = model_from_section(config.model, tokenizer.vocab_size)
    model.load_state_dict(state["model"])
    device_ = resolve_device(device)
    model.to(device_).eval()
    cast_weights(model, inference_dtype(config.decode.precision, device_))
    pack_linears(model)  # on CPU, weights packed once for MKL or oneDNN (model/packed.py); elsewhere unused
    return Loaded(model, config, tokenizer, ckpt)


def inference_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The weights' dtype for `decode.precision` (fairseq's --fp16/--bf16, Hugging Face's torch_dtype).

    Inference has no optimizer state to protect, so the weights themselves are cast (autocast would
    re-cast every weight at every step): activations and the key/value cache follow, while scores
    (log-probabilities, perplexity) are still summed in fp32 (the logits are converted before the softmax).
    """
    if precision == "fp16" and device.type != "cuda":
        raise TformerError("decode.precision=fp16 needs CUDA; on CPU use decode.precision=bf16")
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def cast_weights(model: nn.Module, dtype: torch.dtype) -> None:
    """Cast the parameters (not the buffers: position tables and ALiBi slopes stay fp32) to `dtype`.

    The Parameter objects are kept, so tied weights stay tied.
    """
    with torch.no_grad():
        for param in model.parameters():
            param.data = param.data.to(dtype)
