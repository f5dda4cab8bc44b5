"""A decoding step captured in a CUDA graph and replayed: one launch per step instead of one per operation."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from tformer_cli.errors import first_line


class StepRunner:
    """Calls `step()`, which reads and writes only tensors allocated once; with `graph` (CUDA), the first call
    captures it in a CUDA graph and later calls replay it.

    Capture needs warm-up runs first (on a side stream, as PyTorch's documentation asks); they write keys at
    the current step, which the real step overwrites, and change `state` in place, which is restored. A capture
    that fails (an operation a graph cannot hold, an old driver) warns once and the step runs eagerly from then
    on: the same answers, without the graph's speed.
    """

    def __init__(self, step: Callable[[], Tensor], graph: bool, state: list[Tensor]) -> None:
        self.step, self.use_graph, self.state = step, graph, state
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: Tensor | None = None

    def __call__(self) -> Tensor:
        if self.use_graph and self.graph is None:
            try:
                self._capture()
            except Exception as e:  # noqa: BLE001 (any failure to capture: run eagerly, said once)
                self.use_graph, self.graph = False, None
                warnings.warn(
                    f"decoding without CUDA graphs (capture failed: {type(e).__name__}: {first_line(e)}); "
                    "decode.static=never takes the dynamic path",
                    RuntimeWarning,
                    stacklevel=2,
                )
        if not self.use_graph:
            return self.step()
        assert self.graph is not None and self.out is not None
        self.graph.replay()
        return self.out

    def _capture(self) -> None:
        saved = [t.clone() for t in self.state]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(side):
                for _ in range(2):
                    self.step()
        finally:  # also when a warm-up run fails: the eager step then starts from the state as it was
            torch.cuda.current_stream().wait_stream(side)
            for tensor, value in zip(self.state, saved, strict=True):
                tensor.copy_(value)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.out = self.step()
        self.graph = graph
