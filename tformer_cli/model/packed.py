"""CPU inference: linear layers whose weights are packed once for oneDNN instead of on every call.

PyTorch's CPU `F.linear` (MKL sgemm) rearranges the weight matrix into its blocked layout on every
call. Training amortises that over thousands of rows; a decoding step has only batch x beam rows
(4-128), and there the rearranging costs as much as the multiplication itself. Packing each weight
once, as inference engines do (and `torch.compile`'s freezing pass does), removes it: on the
2-core machine, a 32 x 512 by 512 x 2048 product takes 298 us packed vs 498 us with `F.linear`
(`python bench/decode_profile.py`; docs/benchmarks.md, "Decoding speed").

The math is the same fp32 (or bf16) multiply-add in another summation order: results differ from
`F.linear` by rounding (about 1e-6 relative), and do not depend on the other rows of the batch.

`pack_linears(model)` swaps every `nn.Linear` of an inference model for a `PackedLinear` that shares
its parameters (same state_dict keys, tied weights stay tied). A `PackedLinear` falls back to
`F.linear` whenever the packed copy cannot be trusted or does not pay: gradients on, autocast on,
another device or dtype, fp32 with fewer than `MIN_ROWS` rows (there MKL's matrix-vector kernel is
as fast or faster; in bf16 the packed product is about 2x faster than `F.linear` even for one row),
or a weight changed in place since packing (`Tensor._version`, e.g. an optimizer step or a
`load_state_dict`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MIN_ROWS = 4  # fp32: below this F.linear (MKL's matrix-vector kernel) was faster in our measurements


def packing_available() -> bool:
    return torch.backends.mkldnn.enabled and torch.backends.mkldnn.is_available()


class PackedLinear(nn.Module):
    """`nn.Linear` for CPU inference: y = x W^T + b with W packed once (see the module docstring)."""

    def __init__(self, linear: nn.Linear, rows_hint: int = 128) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same Parameter objects: state_dict and tying unchanged
        self.bias = linear.bias
        self._rows_hint = rows_hint
        self._packed: Tensor | None = None
        self._packed_key: tuple | None = None

    def _key(self) -> tuple:
        w = self.weight
        version = None if w.is_inference() else w._version  # inference-mode tensors keep no version counter
        return (w.data_ptr(), version, w.dtype, w.device)

    def _pack(self) -> Tensor:
        with torch.no_grad():
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), self._rows_hint)
        self._packed_key = self._key()
        return self._packed

    def forward(self, x: Tensor) -> Tensor:
        usable = (
            x.device.type == "cpu"
            and self.weight.device.type == "cpu"
            and x.dtype == self.weight.dtype
            and x.dtype in (torch.float32, torch.bfloat16)
            and not torch.is_grad_enabled()
            and not torch.is_autocast_enabled("cpu")
            and (x.dtype == torch.bfloat16 or x.numel() >= MIN_ROWS * self.in_features)
        )
        if not usable:
            return F.linear(x, self.weight, self.bias)
        packed = self._packed if self._packed_key == self._key() else self._pack()
        return torch.ops.mkldnn._linear_pointwise(x, packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def pack_linears(model: nn.Module) -> int:
    """Replace every `nn.Linear` in `model` by a `PackedLinear` (in place); return how many.

    Does nothing (returns 0) where oneDNN is not available. Weights are packed lazily, on the first
    call that can use them, so a model moved to another device afterwards is unaffected.
    """
    if not packing_available():
        return 0
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PackedLinear(child))
                swapped += 1
    return swapped
