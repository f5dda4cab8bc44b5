"""Transformer components and the three architectures. No config files, no data loading here."""

from tformer_cli.model.build import build_model, count_parameters

__all__ = ["build_model", "count_parameters"]
