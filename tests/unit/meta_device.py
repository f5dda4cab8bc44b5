"""The meta device as a stand-in for a GPU on a machine without one (not a test module).

A meta tensor has a shape, a dtype and a device, and no values. An operation that mixes a CPU tensor into
work on another device fails on meta as it does on CUDA ("Expected all tensors to be on the same device"),
so code run with its model and inputs on meta shows, on any machine, the tensors it makes without the
model's device. Two things CUDA does that meta does not, `OffTheCpu` adds:
- CUDA refuses an index on the CPU for the tensor it indexes (index_select, gather, scatter, an embedding
  lookup ...), and a CPU tensor indexed with indices on the device (`t[i]`); meta's kernels let them through.
- A read of a value (`int(t)`, `bool(t)`, `t.tolist()`, `t.cpu()`: a host sync on a GPU) has nothing to read on
  meta. `OffTheCpu` counts each one and answers with a stand-in (`bool`: `answer`, a number: `number`, a copy to
  the CPU: zeros; a size that depends on values: every element selected), so that code whose course does not depend on
  those values runs to its end.
As on CUDA, a CPU tensor of no dimensions may still join an operation on the device (it counts as a number).

Code whose course depends on the values it reads (the dynamic searches: which sentences finished, which tokens
won) runs with `off_the_cpu`: first on the CPU, recording each value it reads (`Recorded`), then on meta with those
values read back in the same order (`Replayed`), so that it takes the same course on the device it checks.
"""

from __future__ import annotations

import copy
import sys
import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

META = torch.device("meta")
_CPU = torch.device("cpu")

_READS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.item.default,
    torch.ops.aten.is_nonzero.default,
}
_INDEXED = {  # operations whose index tensors must be on the indexed tensor's device on CUDA
    "aten.index_select",
    "aten.gather",
    "aten.scatter",
    "aten.scatter_",
    "aten.scatter_add",
    "aten.scatter_add_",
    "aten.embedding",
    "aten.take_along_dim",
    "aten.index_add",
    "aten.index_add_",
    "aten.index_fill",
    "aten.index_fill_",
}

_INDEXING = {"aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"}  # t[i], t[i] = v


class OffTheCpu(TorchDispatchMode):
    """Runs code on meta tensors as it would run on CUDA; `reads` counts its reads of values, `sites` them by the
    line of tformer_cli that read (bench/host_reads.py prints those).

    Raises (from inside the code run):
        RuntimeError: a CPU tensor mixed into an operation on meta tensors, a CPU index of a meta tensor, or meta
            indices of a CPU tensor.
    """

    def __init__(self, answer: bool = True, number: int = 1) -> None:
        super().__init__()
        self.answer, self.number, self.reads = answer, number, 0
        self.sites: Counter[str] = Counter()

    def __enter__(self):
        # A module moved to meta keeps its tied weights tied (PyTorch would make new Parameters: meta tensors
        # cannot take another device's data in place); moved to CUDA they stay tied too.
        self._swap = torch.__future__.get_swap_module_params_on_conversion()
        torch.__future__.set_swap_module_params_on_conversion(True)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            torch.__future__.set_swap_module_params_on_conversion(self._swap)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        tensors += [t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)]
        on_meta = any(t.is_meta for t in tensors)
        if func in _READS and args[0].is_meta:
            self._read()
            value = args[0]
            return self.answer if value.dtype == torch.bool else self.number
        packet = str(func.overloadpacket)
        if on_meta and _selects_by_value(packet, args):
            self._read()  # the size of the result is read
            return _all_selected(packet, args)
        if packet in _INDEXED and on_meta:
            cpu = [tuple(t.shape) for t in tensors if not t.is_meta]
            if cpu:
                raise RuntimeError(f"{func}: an index on the CPU {cpu} for a tensor on the device")
        if packet in _INDEXING and not args[0].is_meta and on_meta:
            raise RuntimeError(f"{func}: a tensor on the CPU indexed with indices on the device")
        to_cpu = any(isinstance(a, torch.device) and a == _CPU for a in (kwargs.get("device"), *args[1:]))
        if packet in ("aten._to_copy", "aten.to") and args[0].is_meta and to_cpu:
            self._read()
            dtype = kwargs.get("dtype") or next((a for a in args[1:] if isinstance(a, torch.dtype)), args[0].dtype)
            return torch.zeros(args[0].shape, dtype=dtype)
        return func(*args, **kwargs)

    def _read(self) -> None:
        self.reads += 1
        ours = [frame for frame in traceback.extract_stack() if "tformer_cli" in frame.filename]
        if ours:
            frame = ours[-1]
            self.sites[f"{frame.filename.split('tformer_cli/')[-1]}:{frame.lineno} {frame.name}"] += 1


def _selects_by_value(packet: str, args: tuple) -> bool:
    """nonzero, masked_select, or indexing with a boolean mask: the result's size depends on values."""
    if packet in ("aten.nonzero", "aten.masked_select"):
        return True
    indices = args[1] if packet in _INDEXING and len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)


def _all_selected(packet: str, args: tuple) -> torch.Tensor:
    """A selection by value on meta, as if every element were selected (meta's own kernels refuse: no values)."""
    tensor = args[0]
    if packet == "aten.nonzero":
        return torch.empty(tensor.numel(), tensor.dim(), dtype=torch.long, device=META)
    if packet == "aten.masked_select":
        return torch.empty(torch.broadcast_shapes(tensor.shape, args[1].shape).numel(), dtype=tensor.dtype, device=META)
    if packet != "aten.index":  # t[mask] = v: nothing to write on meta
        return tensor if packet.endswith("_") else torch.empty_like(tensor)
    (mask,) = [i for i in args[1] if i is not None]  # one boolean mask over the leading dimensions
    return torch.empty(mask.numel(), *tensor.shape[mask.dim() :], dtype=tensor.dtype, device=META)


_VALUE_READS = {"__bool__", "__int__", "__float__", "__index__", "item", "tolist", "nonzero"}


_MACHINERY = ("meta_device.py", "torch/overrides.py", "torch/utils/_python_dispatch.py")


def _reads_a_value(func: Any, args: tuple) -> bool:
    """A read of values, or a size that depends on them (indexing by a boolean mask), by tformer's own code (the
    libraries' reads, e.g. an optimizer's of its step count on the host, may differ by device and are left be)."""
    frame = sys._getframe(1)  # up to the code that made the call, past this file and torch's mode machinery
    while frame is not None and frame.f_code.co_filename.endswith(_MACHINERY):
        frame = frame.f_back
    if frame is None or "tformer_cli" not in frame.f_code.co_filename:
        return False
    name = getattr(func, "__name__", "")
    if name in _VALUE_READS:
        return True
    if name != "__getitem__" or len(args) < 2:
        return False
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)


class Recorded(TorchFunctionMode):
    """Records, in order, what the code run reads of its tensors' values (`log`)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, Any]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if _reads_a_value(func, args):
            value = tuple(out.shape) if func.__name__ == "__getitem__" else out
            self.log.append((func.__name__, value.clone() if isinstance(value, torch.Tensor) else value))
        return out


class Replayed(TorchFunctionMode):
    """Answers the code's reads of values with a recording's (`Recorded.log`), in order; `left` counts the
    recorded reads not yet asked for.

    Raises (from inside the code run):
        AssertionError: the code reads another thing than the recording says (it took another course).
    """

    def __init__(self, log: list[tuple[str, Any]]) -> None:
        super().__init__()
        self.log, self.next = log, 0

    @property
    def left(self) -> int:
        return len(self.log) - self.next

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if not _reads_a_value(func, args):
            return func(*args, **(kwargs or {}))
        assert self.next < len(self.log), f"{func.__name__}: read beyond the recording"
        name, value = self.log[self.next]
        self.next += 1
        assert name == func.__name__, f"read {func.__name__} where the recording read {name}"
        if name in ("nonzero", "__getitem__") and not args[0].is_meta:  # a size read on the host: as it is
            return func(*args, **(kwargs or {}))
        if name == "nonzero":
            return value.to(META)
        if name == "__getitem__":
            return torch.empty(value, dtype=args[0].dtype, device=META)
        return value  # a value read from the device, or from the host (where a copy from meta holds stand-ins)


def off_the_cpu(run: Callable[..., Any], *args: Any) -> tuple[Any, Any]:
    """`run(*args)` on the CPU, then again with the arguments (models, tensors, devices) on the meta device, the values
    it reads replayed from the first run, under `OffTheCpu`'s checks. Returns both results.

    Raises:
        RuntimeError: the meta run mixed a CPU tensor into its work (as CUDA would refuse).
        AssertionError: it took another course than the CPU run, or did not end where that did.
    """
    with Recorded() as recorded:
        on_cpu = run(*args)
    with OffTheCpu(), Replayed(recorded.log) as replayed:
        on_meta = [copy.deepcopy(a).to(META) if isinstance(a, nn.Module) else _to_meta(a) for a in args]
        result = run(*on_meta)
    assert replayed.left == 0, f"the run on meta ended with {replayed.left} recorded reads not made"
    return on_cpu, result


def _to_meta(value: Any) -> Any:
    if isinstance(value, torch.device):
        return META
    return value.to(META) if isinstance(value, torch.Tensor) else value
