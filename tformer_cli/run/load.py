"""From a recipe to a model, and from a trained run to a model ready to use: one function each.

`build_model_from_config` is the only place a config becomes a model (training, `check` and every reader
call it: the recipe's `model:` section is the model's spec, the data gives the vocabulary); `load_run` is
the only loader of a trained run (eval, translate, generate, export, attention). Callers decide what a
model kind may do; nothing here refuses one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tformer_cli.config import config_from_dict
from tformer_cli.errors import CheckpointError, TformerError
from tformer_cli.kinds import DATA_KINDS, Command, describe, refusal
from tformer_cli.log import console
from tformer_cli.model import build_model
from tformer_cli.precision import resolve as resolve_precision
from tformer_cli.run.checkpoints import average_checkpoints, load_verified, paths_to_average, resolve_checkpoint
from tformer_cli.run.layout import checkpoint_label, run_dir_of
from tformer_cli.run.portable import tokenizer_file
from tformer_cli.schema import Config, vocabulary
from tformer_cli.tokenizer import PAD_ID, Tokenizer

# What a trained run's commands may override: the search and precision, the device and the CPU threads; not the
# model or data, which its weights were trained for.
INFERENCE_OVERRIDES = ("decode.", "run.threads=", "run.device=")


def build_model_from_config(config: Config, vocab_size: int | None = None) -> nn.Module:
    """The (freshly initialised) model a recipe describes.

    Args:
        config: the recipe: `model:` is the architecture, `data.kind` says where the vocabulary comes from.
        vocab_size: text and parallel data: the prepared tokenizer's vocabulary; None takes
            tokenizer.vocab_size (what `prepare` trains), so that nothing needs preparing to count
            parameters. Generated data takes its vocabulary from its recipe section and no `vocab_size`:
            pattern data its tokens and classes from data.pattern, sessions data n_items + 1 (0 is padding).

    Raises:
        ValueError: a `vocab_size` for generated data (a caller's bug: the recipe fixes that vocabulary).
    """
    if DATA_KINDS[config.data.kind].generated and vocab_size is not None:
        raise ValueError(f"{config.data.kind} data takes its vocabulary from data.{config.data.kind}, not a vocab_size")
    vocab_size, n_classes = vocabulary(config, vocab_size)
    return build_model(config.model, vocab_size=vocab_size, n_classes=n_classes, pad_id=PAD_ID)


def resolve_device(name: str) -> torch.device:
    """`auto` (CUDA when there is one, else the CPU), `cpu` or `cuda`.

    Raises:
        TformerError: a name other than these three, or cuda asked for on a machine without it.
    """
    if name not in ("auto", "cpu", "cuda"):
        raise TformerError(f"device {name!r}: choose auto, cpu or cuda")
    if name == "cuda" and not torch.cuda.is_available():
        raise TformerError("cuda asked for (run.device) but no CUDA device is available; use cpu")
    return torch.device("cuda" if name == "auto" and torch.cuda.is_available() else "cpu" if name == "auto" else name)


def use_tf32(device: torch.device) -> None:
    """On CUDA, let fp32 matrix products and cuDNN convolutions use TF32 tensor cores (as nanoGPT does).

    Without it, fp32 training and decoding on an Ampere or later GPU leave the tensor cores idle; TF32
    keeps fp32's range with a 10-bit mantissa (PyTorch's notes, "TensorFloat-32 (TF32) on Ampere (and
    later) devices"). This is global PyTorch state, set by `train` and by `load_run` (every reader) for a
    CUDA device; on the CPU nothing changes. `torch.set_float32_matmul_precision` rather than
    `torch.backends.cuda.matmul.allow_tf32`: PyTorch 2.9+ raises when its legacy flags and its newer
    `fp32_precision` settings are mixed, and this call keeps both consistent.
    """
    if device.type != "cuda":
        return
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True


def inference_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The weights' dtype for `decode.precision` (fairseq's --fp16/--bf16, Hugging Face's torch_dtype).

    Inference has no optimizer state to protect, so the weights themselves are cast (autocast would
    re-cast every weight at every step): activations and the key/value cache follow, while scores
    (log-probabilities, perplexity) are still summed in fp32 (the logits are converted before the softmax).

    Raises:
        TformerError: fp16 on a device other than CUDA.
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


@dataclass
class Run:
    """A trained model ready to use, and what it was trained with."""

    model: nn.Module  # on its device, in eval mode
    config: Config  # the checkpoint's own recipe, with the decode.* overrides given
    tokenizer: Tokenizer | None  # None for generated data (its models read ids), or when not read
    checkpoint: Path  # the file loaded; with `average`, the newest of those averaged
    run_dir: Path | None  # None for a checkpoint outside a run's checkpoints/ folder
    average: int  # how many step checkpoints were averaged (0: none)
    saved_config: dict[str, Any]  # the recipe as the checkpoint holds it (plain values)
    tokenizer_fingerprint: str | None  # as the checkpoint holds it
    ensemble: tuple[Path, ...] = ()  # the other members' checkpoints, where `model` is an ensemble led by this run's

    @property
    def kind(self) -> str:
        """model.kind: classifier, lm, lstm or seq2seq."""
        return self.config.model.kind

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def label(self) -> str:
        """How eval files name these weights (layout.checkpoint_label)."""
        return checkpoint_label(self.checkpoint, self.average, 1 + len(self.ensemble))


def load_run(
    path: Path,
    overrides: list[str] | None = None,
    device: str = "auto",
    average: int = 0,
    cast: bool = True,
    read_tokenizer: bool = True,
) -> Run:
    """Load a trained model from a checkpoint file or a run directory (its best, else latest, checkpoint).

    Every checkpoint read is verified against its run's index (`load_verified`); the model is rebuilt
    from the recipe saved in the checkpoint, never from a recipe file that may have changed since.
    On CUDA, fp32 matrix products then use TF32, as in training (`use_tf32`).

    Args:
        path: a checkpoint file, or a run directory.
        overrides: `decode.*` key=value overrides (the search, the precision), `run.threads` (CPU threads
            for torch, as in training) and `run.device` (which takes the place of `device`); nothing else may change.
        device: auto, cpu or cuda, where the overrides set no run.device (the training run's is not applied).
        average: > 0: average the run's last N step checkpoints (`path` must be a run directory); 0: off.
        cast: cast the weights to decode.precision (False: keep them as trained, e.g. to export them).
        read_tokenizer: text and parallel data: load the tokenizer the run keeps (a run made before keeps
            none: data.dir's) and check it. False reads none (`tformer export` of the weights): the vocabulary
            is then tokenizer.vocab_size, which is what the prepared tokenizer has (SentencePiece makes
            exactly that many pieces or fails).

    Raises:
        CheckpointError: a negative `average`, fewer checkpoints than asked, a checkpoint that does not
            verify, or a tokenizer other than the one the model was trained with.
        DataError: text or parallel data whose tokenizer is neither in the run nor in data.dir (naming both).
        ConfigError: an override that is not decode.*, run.threads or run.device, or is invalid.
    """
    checkpoint, state = _read(path, average)
    config = config_from_dict(state["config"], str(checkpoint), overrides or [], allowed=INFERENCE_OVERRIDES)
    if config.run.threads and any(item.startswith("run.threads=") for item in overrides or []):
        torch.set_num_threads(config.run.threads)  # asked for here; the training run's own setting is not applied
    if any(item.startswith("run.device=") for item in overrides or []):
        device = config.run.device  # asked for here; the device the run trained on is not applied
    tokenizer = _tokenizer(config, state, checkpoint) if read_tokenizer else None
    model = build_model_from_config(config, tokenizer.vocab_size if tokenizer is not None else None)
    model.load_state_dict(state["model"])
    target = resolve_device(device)
    model.to(target).eval()
    use_tf32(target)
    if cast:
        config = _with_decode_precision(config, target)
        cast_weights(model, inference_dtype(config.decode.precision, target))
    return Run(
        model=model,
        config=config,
        tokenizer=tokenizer,
        checkpoint=checkpoint,
        run_dir=run_dir_of(checkpoint),
        average=average,
        saved_config=state["config"],
        tokenizer_fingerprint=state.get("tokenizer_fingerprint"),
    )


def _with_decode_precision(config: Config, device: torch.device) -> Config:
    """`config` with decode.precision `auto` resolved for `device` (precision.py), the choice said on stderr."""
    choice, line = resolve_precision(config.decode.precision, device, "decode.precision")
    if line is not None:
        console.print(line)
    return dataclasses.replace(config, decode=dataclasses.replace(config.decode, precision=choice))


def _read(path: Path, average: int) -> tuple[Path, dict[str, Any]]:
    """The checkpoint `path` names and its verified state, or the average of the run's last `average`."""
    if average < 0:
        raise CheckpointError(f"--average takes the number of step checkpoints to average (0: off), got {average}")
    if average:
        paths = paths_to_average(path, average, "--average")
        return paths[-1], average_checkpoints(paths)
    checkpoint = resolve_checkpoint(path)
    return checkpoint, load_verified(checkpoint)


def _tokenizer(config: Config, state: dict[str, Any], checkpoint: Path) -> Tokenizer | None:
    """The tokenizer the run keeps (portable.tokenizer_file: a run made before keeps none, and data.dir's is
    read), which must be the one the model was trained with (same sha256)."""
    if DATA_KINDS[config.data.kind].generated:
        return None
    trained_with = state.get("tokenizer_fingerprint")
    tokenizer = Tokenizer(tokenizer_file(run_dir_of(checkpoint), state["config"], config.data.dir))
    if trained_with != tokenizer.fingerprint:
        raise CheckpointError(
            f"{checkpoint} was trained with another tokenizer than {tokenizer.path} "
            f"(fingerprints {str(trained_with)[:12]} vs {tokenizer.fingerprint[:12]})"
        )
    return tokenizer


def not_served(run: Run, reason: str) -> TformerError:
    """The one-line error of a command given a run it does not serve: "RUN is a classifier: REASON"."""
    return TformerError(f"{run.checkpoint} is {describe(run.config.data.kind, run.kind)}: {reason}")


def check_served(run: Run, command: Command) -> None:
    """Refuse a run that `command` does not serve (`refusal`).

    Raises:
        TformerError: "RUN is a classifier: it reads no text (...)", and the like.
    """
    if (reason := refusal(run.config.data.kind, run.kind, command)) is not None:
        raise not_served(run, reason)
