"""What training a recipe holds in memory, computed from the recipe alone: nothing is built or allocated.

`tformer check` and `tformer train` ask this before a model exists, so that a recipe that cannot fit
(model.d_model=16384, a batch of a million tokens) is refused in one line, with the estimate, instead of
allocating until the OS kills the process.

Parameters are counted from the architecture's shapes (`parameter_counts`: the components of
`model.count_parameters`, which tests/unit/test_budget.py holds it to for every model kind and option).
Neither a real model nor one on the meta device is built: a meta build's first use imports PyTorch's
decompositions (seconds), and a real one is what cannot fit. Memory of one training process:

    weights      4 bytes a parameter (fp32), plus the buffers (the sinusoidal tables)
                 bf16 / fp16 autocast: + 2 (the weights' casts, kept for the backward pass)
                 bf16-weights: 2 (the bf16 model) + 4 (the fp32 master copy)
    gradients    the weights' dtype: 4 bytes a parameter (2 for bf16-weights)
    Adam         8 bytes a parameter (two fp32 moments)
    average      train.ema_decay: 4 bytes a parameter (the weights' fp32 average, train/ema.py), else none
    activations  what the backward pass keeps from the forward pass of one micro-batch (`_activations`):
                 per token and layer, the inputs of each matrix product, the attention's q, k, v and
                 output, the norms' inputs, the FFN's hidden activations and the dropout masks, and the
                 output layer's logits with their log-softmax and gradient (loss_chunk tokens at a time
                 when set). Fused attention keeps no T x T weights; the other score functions do.

It is an estimate of what must be held at once, not an upper bound (the allocator's caching and
fragmentation, DDP's gradient buckets and validation's decoding come on top): a recipe refused here
cannot fit, and one accepted may still need a smaller batch. `train` compares it with the memory
available on the device the run will use (`check_fits`); `check` prints both, and refuses only what no
single device could hold, since a recipe is often checked on a laptop and trained on a GPU.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tformer_cli.errors import TformerError
from tformer_cli.kinds import DATA_KINDS, MODEL_KINDS
from tformer_cli.schema import Config, ModelConfig, row_length, vocabulary

if TYPE_CHECKING:  # torch is imported where a device is asked about: `check` refuses the impossible without it
    import torch

GIB = 1024**3
# The most memory one device holds today (288 GB accelerators); `check` refuses only past this and this machine.
LARGEST_DEVICE = 288 * GIB


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one training process holds, by what holds them."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    average: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + self.average

    def describe(self) -> str:
        """`about 16.4 GiB (weights 372 MiB, gradients 241 MiB, Adam 481 MiB, activations 15.3 GiB)`, and
        `, average 120 MiB` before the closing bracket with train.ema_decay."""
        parts = (self.weights, self.gradients, self.optimizer, self.activations)
        weights, grads, adam, acts = (_size(p) for p in parts)
        average = f", average {_size(self.average)}" if self.average else ""
        terms = f"weights {weights}, gradients {grads}, Adam {adam}, activations {acts}{average}"
        return f"about {_size(self.total)} ({terms})"


# ---------------------------------------------------------------- parameters


def parameter_counts(config: Config, vocab_size: int | None = None) -> OrderedDict[str, int]:
    """Parameters by component, as `model.count_parameters(build_model_from_config(config))` gives them.

    Args:
        config: the recipe (its `model:` section; the vocabulary as `build_model_from_config` takes it).
        vocab_size: text and parallel data: the prepared vocabulary; None takes tokenizer.vocab_size.

    Returns:
        Components in the model's order (shared tensors counted once), plus a `total`.
    """
    m = config.model
    vocab, n_classes = vocabulary(config, vocab_size)
    groups: OrderedDict[str, int] = OrderedDict()

    def add(name: str, count: int) -> None:
        if count:
            groups[name] = groups.get(name, 0) + count

    if not MODEL_KINDS[m.kind].attention:  # the LSTM
        add("embeddings", vocab * m.d_model)
        add("lstm layers", m.n_layers * 8 * m.d_model * (m.d_model + 1))  # 4 gates: W_ih, W_hh, b_ih, b_hh
        add("output head", 0 if m.tie_embeddings else vocab * m.d_model)
    else:
        kind = MODEL_KINDS[m.kind]
        for side in kind.stacks:
            cross = kind.has_source and side == "decoder "
            n = m.decoder_layers if cross else m.n_layers
            shared = cross and m.share_all_embeddings  # the decoder's embeddings are the encoder's
            add("embeddings", 0 if shared else vocab * m.d_model)
            add("embeddings", m.max_len * m.d_model if m.pos == "learned" else 0)  # named positions.embedding
            for name, count in _block(m, cross).items():
                add(side + name, n * count)
            add(side + "norms", _norm(m) if m.norm_first else 0)  # the stack's final norm
        if not kind.predicts_tokens:  # the classifier
            add("output head", (m.d_model + 1) * n_classes)
        else:
            tied = m.tie_embeddings or (kind.has_source and m.share_all_embeddings)
            add("output head", 0 if tied else vocab * m.d_model)
    groups["total"] = sum(groups.values())
    return groups


def _norm(m: ModelConfig) -> int:
    return 2 * m.d_model if m.norm == "layernorm" else m.d_model  # LayerNorm: weight and bias; RMSNorm: weight


def _block(m: ModelConfig, cross: bool) -> dict[str, int]:
    """One layer's parameters by component (model/layers.py Block)."""
    d, b = m.d_model, int(m.bias)
    d_head = d // m.n_heads
    kv = 2 * (m.n_kv_heads or m.n_heads) * d_head  # keys and values
    score = {"general": 1, "additive": 2}.get(m.attention_score, 0) * m.n_heads * d_head * d_head
    score += m.n_heads * d_head if m.attention_score == "additive" else 0
    width = 2 * m.d_ff if m.ffn == "swiglu" else m.d_ff  # SwiGLU's gate and value in one matrix
    out = {"self-attention": d * (d + kv) + b * (d + kv) + d * d + b * d + score}
    if cross:
        out["cross-attention"] = 2 * (d * d + b * d) + d * kv + b * kv + score
    out["feed-forward"] = d * width + b * width + m.d_ff * d + b * d
    out["norms"] = (3 if cross else 2) * _norm(m)
    return out


# ---------------------------------------------------------------- memory


def training_memory(config: Config, parameters: int | None = None) -> MemoryEstimate:
    """What one training process holds (see the module docstring for the terms).

    Args:
        config: the recipe.
        parameters: its parameter count; None counts them (`parameter_counts`).
    """
    n = parameter_counts(config)["total"] if parameters is None else parameters
    precision = config.train.precision
    buffers = _buffers(config.model)
    match precision:
        case "bf16-weights":
            weights, grads = 6 * n + buffers, 2 * n
        case "bf16" | "fp16" | "auto":  # auto: bf16 where the device has it (the smaller estimate)
            weights, grads = 6 * n + buffers, 4 * n
        case _:
            weights, grads = 4 * n + buffers, 4 * n
    average = 4 * n if config.train.ema_decay else 0
    return MemoryEstimate(weights, grads, 8 * n, _activations(config), average)


def _buffers(m: ModelConfig) -> int:
    """Bytes of the buffers that scale with the recipe: each stack's fp32 sinusoidal table."""
    stacks = len(MODEL_KINDS[m.kind].stacks)  # the LSTM has none
    return stacks * 4 * m.max_len * m.d_model if m.pos == "sinusoidal" else 0


def micro_batch(config: Config) -> tuple[int, int, int]:
    """(sequences, source or input length, predicted tokens) of one micro-batch, padding included."""
    t = config.train
    length, _ = row_length(config)
    if DATA_KINDS[config.data.kind].batch == "train.max_tokens":  # a budget per side, of sentences up to data.max_len
        length = min(length, t.max_tokens)
        return t.max_tokens // length, length, t.max_tokens // length * length
    return t.batch_size, length, t.batch_size * length if MODEL_KINDS[config.model.kind].predicts_tokens else 0


def _activations(config: Config) -> int:
    """Bytes the backward pass keeps from one micro-batch's forward pass."""
    m, t = config.model, config.train
    rows, length, predicted = micro_batch(config)
    tokens = rows * length  # the input side's positions
    e = 4 if t.precision == "fp32" else 2  # bytes an activation
    vocab, _ = vocabulary(config, None)
    if not MODEL_KINDS[m.kind].attention:  # the LSTM
        per_token = m.n_layers * 8 * m.d_model * e  # the layer's input, 4 gates, cell and hidden states
        stacks = per_token * tokens
    else:
        encoder = m.n_layers * _layer_bytes(m, e, cross=False, context=length)
        stacks = tokens * encoder
        if MODEL_KINDS[m.kind].has_source:  # the decoder's layers also cross-attend to the source
            n_dec = m.decoder_layers
            kv = 2 * (m.n_kv_heads or m.n_heads) * (m.d_model // m.n_heads)
            stacks += predicted * n_dec * _layer_bytes(m, e, cross=True, context=length)
            stacks += tokens * n_dec * kv * e  # each decoder layer's keys and values of the source
    chunk = min(t.loss_chunk, predicted) if t.loss_chunk else predicted
    logits = chunk * vocab * (e + 8)  # the logits, their fp32 log-softmax and its gradient
    embeddings = (tokens + predicted) * 2 * m.d_model * e  # each stack's input and final output
    return stacks + logits + embeddings


def _layer_bytes(m: ModelConfig, e: int, cross: bool, context: int) -> int:
    """Bytes one layer keeps per token for the backward pass (`context`: the keys each query sees)."""
    d, h = m.d_model, m.n_heads
    kv = 2 * (m.n_kv_heads or h) * (d // h)
    hidden = {"relu": 1, "gelu": 2, "swiglu": 3}[m.ffn] * m.d_ff  # relu in place: its output only
    elements = (4 * d + kv) + 2 * d + hidden  # self-attention (x, q k v, output, norm input); FFN (x, norm input)
    masks = (3 if cross else 2) * d if m.dropout > 0 else 0  # bytes: one bool a dropped element
    masks += m.d_ff if m.activation_dropout > 0 else 0
    if cross:
        elements += 4 * d  # x, q, output, norm input
    if m.attention_score != "scaled_dot":  # the reference path keeps the T x T scores and weights
        per_query = h * context * (2 + (d // h if m.attention_score == "additive" else 0))
        elements += per_query * (2 if cross else 1)
    return elements * e + masks


# ---------------------------------------------------------------- the machine


def available_memory(device: torch.device) -> tuple[int, str]:
    """(bytes available, what they are) on `device`: CUDA's free memory, else the host's available memory."""
    import torch

    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free, f"{torch.cuda.get_device_name(device)} ({device}) has"
    return host_available(), "this machine's memory has"


def host_available() -> int:
    """The host memory a process can take: MemAvailable (free and reclaimable), within a cgroup's limit."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):  # not Linux: free pages, which understates (caches not counted)
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:  # a container's limit (cgroup v2): "max", or bytes
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            available = min(available, max(int(limit) - used, 0))
    except (OSError, ValueError):
        pass
    return available


def training_device(config: Config) -> torch.device:
    """The device `tformer train` will use: run.device resolved as training resolves it, torchrun's GPU."""
    import torch

    from tformer_cli.run import resolve_device

    device = resolve_device(config.run.device)
    if device.type == "cuda" and device.index is None:  # train/dist.py: under NCCL, GPU LOCAL_RANK; else the current
        local = int(os.environ.get("LOCAL_RANK", "0"))
        nccl = int(os.environ.get("WORLD_SIZE", "1")) > 1 and config.run.dist_backend != "gloo"
        index = local if nccl and local < torch.cuda.device_count() else torch.cuda.current_device()
        device = torch.device("cuda", index)
    return device


def _processes_here(device: torch.device) -> int:
    """Training processes sharing this device's memory: torchrun's processes on this host share its memory."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if device.type == "cpu" else 1


def _shrink(config: Config) -> str:
    batch = DATA_KINDS[config.data.kind].batch
    chunked = not MODEL_KINDS[config.model.kind].predicts_tokens or config.train.loss_chunk
    chunk = "" if chunked else ", set train.loss_chunk"
    return f"lower {batch} (raise train.update_freq to keep the batch){chunk}, or make the model smaller"


def check_fits(config: Config, device: torch.device | None = None) -> MemoryEstimate:
    """Refuse, in one line, a recipe whose training cannot fit the memory of the device that will run it.

    Args:
        config: the recipe.
        device: the training device; None resolves it as `train` does (`training_device`).

    Returns:
        The estimate, when it fits.

    Raises:
        TformerError: the estimate exceeds the device's available memory.
    """
    device = training_device(config) if device is None else device
    estimate = training_memory(config)
    available, where = available_memory(device)
    needed = estimate.total * _processes_here(device)
    if needed > available:
        raise TformerError(
            f"training this recipe needs {estimate.describe()} per process (tformer_cli/budget.py), and "
            f"{where} {_size(available)} available: {_shrink(config)}"
        )
    return estimate


def check_lines(config: Config, parameters: int) -> list[str]:
    """What `tformer check` prints about memory; refuses what no single device could hold.

    A recipe is often checked on one machine and trained on another (a laptop, then a GPU), so `check`
    refuses only an estimate past both this machine's device and `LARGEST_DEVICE`, and says when
    `train` would refuse it here.

    Raises:
        TformerError: the estimate exceeds both this machine's memory and the largest device's.
    """
    estimate = training_memory(config, parameters)
    line = f"training memory: {estimate.describe()} per process (formula: tformer_cli/budget.py)"
    host = host_available()
    if estimate.total > max(host, LARGEST_DEVICE):  # no GPU holds more: refused before torch is imported
        raise TformerError(_beyond_any_device(config, estimate, f"this machine's memory has {_size(host)} available"))
    import torch

    if config.run.device == "cuda" and not torch.cuda.is_available():  # checked here, trained elsewhere
        return [line, "no CUDA device on this machine to compare it with (run.device=cuda)"]
    available, where = available_memory(training_device(config))
    if estimate.total > max(available, LARGEST_DEVICE):
        raise TformerError(_beyond_any_device(config, estimate, f"{where} {_size(available)} available"))
    verdict = ": `tformer train` would refuse it on this machine" if estimate.total > available else ""
    return [line, f"{where} {_size(available)} available{verdict}"]


def _beyond_any_device(config: Config, estimate: MemoryEstimate, here: str) -> str:
    return (
        f"training this recipe needs {estimate.describe()} per process, more than any single device holds "
        f"(the largest: {LARGEST_DEVICE // GIB} GiB; {here}): {_shrink(config)}"
    )


def _size(n: int) -> str:
    """`412 MiB`, `16.4 GiB`, `1,047 GiB`."""
    if n < GIB:
        return f"{n / 2**20:,.0f} MiB"
    return f"{n / GIB:,.1f} GiB" if n < 1000 * GIB else f"{n / GIB:,.0f} GiB"
