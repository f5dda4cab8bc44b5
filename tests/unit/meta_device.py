"""The meta device as a stand-in for a GPU on a machine without one (not a test module).

A meta tensor has a shape, a dtype and a device, and no values. An operation that mixes a CPU tensor into
work on another device fails on meta as it does on CUDA ("Expected all tensors to be on the same device"),
so code run with its model and inputs on meta shows, on any machine, the tensors it makes without the
model's device. Two things CUDA does that meta does not, `OffTheCpu` adds:
- CUDA refuses an index on the CPU for the tensor it indexes (index_select, gather, scatter, an embedding
  lookup ...); meta's kernels let it through.
- A read of a value (`int(t)`, `bool(t)`, `t.tolist()`, `t.cpu()`: a host sync on a GPU) has nothing to read on
  meta. `OffTheCpu` counts each one and answers with a stand-in (`bool`: `answer`, a number: `number`, a copy to
  the CPU: zeros; a data-dependent size: every element selected), so that code whose course does not depend on
  those values runs to its end.
As on CUDA, a CPU tensor of no dimensions may still join an operation on the device (it counts as a number).
"""

from __future__ import annotations

import traceback
from collections import Counter

import torch
import torch.fx.experimental._config as fx_config
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


class OffTheCpu(TorchDispatchMode):
    """Runs code on meta tensors as it would run on CUDA; `reads` counts its reads of values, `sites` them by the
    line of tformer_cli that read (bench/host_reads.py prints those).

    Raises (from inside the code run):
        RuntimeError: a CPU tensor mixed into an operation on meta tensors, or a CPU index of a meta tensor.
    """

    def __init__(self, answer: bool = True, number: int = 1) -> None:
        super().__init__()
        self.answer, self.number, self.reads = answer, number, 0
        self.sites: Counter[str] = Counter()
        # a data-dependent size (boolean indexing, nonzero): as if every element were selected
        self._all_selected = fx_config.patch(meta_nonzero_assume_all_nonzero=True)

    def __enter__(self):
        self._all_selected.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._all_selected.__exit__(*exc)

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
        if packet in ("aten.nonzero", "aten.masked_select") and on_meta:
            self._read()  # the size of the result is read
        if packet in _INDEXED and on_meta:
            cpu = [tuple(t.shape) for t in tensors if not t.is_meta]
            if cpu:
                raise RuntimeError(f"{func}: an index on the CPU {cpu} for a tensor on the device")
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
