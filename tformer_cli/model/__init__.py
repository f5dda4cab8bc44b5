"""Transformer components and the three architectures. No config files, no data loading here.

The builder's functions are imported when first asked for (PEP 562): `tformer_cli.model.spec`, the settings
the recipe's schema reads, imports no torch, and importing it loads this package first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tformer_cli.model.spec import ModelConfig

if TYPE_CHECKING:
    from tformer_cli.model.build import build_model, count_parameters

__all__ = ["ModelConfig", "build_model", "count_parameters"]


def __getattr__(name: str) -> Any:
    if name in ("build_model", "count_parameters"):
        from tformer_cli.model import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
