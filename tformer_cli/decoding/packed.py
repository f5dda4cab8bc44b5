"""CPU inference: linear layers whose weights are packed once instead of on every call.

PyTorch's CPU `F.linear` (MKL sgemm) rearranges the weight matrix into its blocked layout on every
call. Training amortises that over thousands of rows; a decoding step has only batch x beam rows
(4-128), and there the rearranging costs as much as the multiplication itself. Packing each weight
once, as inference engines do (CTranslate2 packs with MKL's `cblas_sgemm_pack`; `torch.compile`'s
freezing pass does the same), removes it.

Two packed products, whichever measured faster for the dtype (`python bench/decode_profile.py`;
the measurements are in docs/benchmarks.md, "Decoding speed" and "Why CPU decoding is built as it is"):
- fp32: MKL's packed GEMM (`cblas_sgemm_pack` / `cblas_sgemm_compute`, PyTorch's
  `torch.ops.mkl._mkl_linear`). MKL packs the weight (its B matrix) in a layout that does not depend
  on the row count (CTranslate2 and PaddlePaddle pack once and multiply any number of rows), so one
  packed copy serves every batch size; the tests check the products against `F.linear` at many row
  counts, and `_pack` checks each layer's before using it.
- bf16: oneDNN's packed product (`torch.ops.mkldnn._linear_pointwise`, AMX where the CPU has it).

The math is the same multiply-add in another summation order: results differ from `F.linear` by
rounding (about 1e-6 relative in fp32), and do not depend on the other rows of the batch.

`pack_linears(model)` swaps every `nn.Linear` of an inference model for a `PackedLinear` that shares
its parameters (same state_dict keys, tied weights stay tied): an optimised variant swapped in after
loading, beside the readable model. A `PackedLinear` falls back to `F.linear` whenever the packed
copy cannot be trusted or does not pay: gradients on, autocast on, another device or dtype, bf16 on a
CPU that oneDNN cannot pack bf16 for (no AVX-512 or AVX-NE-CONVERT), fp32 with fewer than `MIN_ROWS`
rows (there MKL's matrix-vector kernel is as fast), or a weight changed in place since packing
(`Tensor._version`, e.g. an optimizer step or a `load_state_dict`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MIN_ROWS = 4  # fp32: below this, F.linear (MKL's matrix-vector kernel) is as fast (docs/benchmarks.md)


def packing_available() -> bool:
    # torch's stubs type the flag as its descriptor (ContextProp); read, it is a bool
    return torch.backends.mkldnn.enabled and torch.backends.mkldnn.is_available()  # type: ignore[return-value]


def bf16_packing_available() -> bool:
    """oneDNN can pack and multiply bf16 weights on this CPU (it needs AVX-512 or AVX-NE-CONVERT)."""
    return packing_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def mkl_packing_available() -> bool:
    """MKL's packed fp32 GEMM is in this PyTorch build (the x86 wheels have it)."""
    return packing_available() and torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


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
        self._mkl = False  # the packed copy is MKL's (fp32) rather than oneDNN's
        self._bf16_packable = bf16_packing_available()  # checked once: a CPU without bf16 support keeps F.linear

    @staticmethod
    def _key(weight: Tensor) -> tuple:
        version = None if weight.is_inference() else weight._version  # inference tensors keep no version counter
        return (weight.data_ptr(), version, weight.dtype, weight.device)

    def _pack(self) -> Tensor:
        with torch.no_grad():
            weight = self.weight.detach()
            self._mkl = weight.dtype == torch.float32 and mkl_packing_available() and self._pack_mkl(weight)
            if not self._mkl:
                self._packed = torch.ops.mkldnn._reorder_linear_weight(weight, self._rows_hint)
        self._packed_key = self._key(self.weight)
        assert self._packed is not None  # packed by MKL or by oneDNN above
        return self._packed

    def _pack_mkl(self, weight: Tensor) -> bool:
        """Pack `weight` for MKL; True if its product can be trusted (else use oneDNN's)."""
        try:
            self._packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, self._rows_hint)
            # The packed layout is row-count independent (module docstring); check that here, on rows
            # other than the hint.
            probe = torch.linspace(-1.0, 1.0, 3 * self.in_features).view(3, self.in_features)
            got = torch.ops.mkl._mkl_linear(probe, self._packed, weight, None, 3)
        except RuntimeError:  # e.g. a PyTorch whose MKL linear ops take only MKL-DNN tensors
            return False
        return torch.allclose(got, F.linear(probe, weight), rtol=1e-4, atol=1e-4)

    def forward(self, x: Tensor) -> Tensor:
        weight, bias = self.weight, self.bias  # one attribute lookup each: this runs ~40 times per decoding step
        usable = (
            x.device.type == "cpu"
            and weight.device.type == "cpu"
            and x.dtype == weight.dtype
            and not torch.is_grad_enabled()
            and not torch.is_autocast_enabled("cpu")
            and (
                (x.dtype == torch.float32 and x.numel() >= MIN_ROWS * self.in_features)
                or (x.dtype == torch.bfloat16 and self._bf16_packable)
            )
        )
        if not usable:
            return F.linear(x, weight, bias)
        packed = self._packed if self._packed_key == self._key(weight) else self._pack()
        if self._mkl:
            return torch.ops.mkl._mkl_linear(x, packed, weight, bias, x.numel() // self.in_features)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

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
