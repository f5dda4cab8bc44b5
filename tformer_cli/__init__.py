"""tformer: train and evaluate Transformer models from YAML recipes.

From Python (docs/api.md): `import tformer_cli as tformer`, then `tformer.load(run)` (a `Model` that translates,
generates, scores and evaluates) and `tformer.evaluate_translations(hypotheses, references)`. They are imported
on first use, so that `tformer --help` does not pay for torch.
"""

from typing import TYPE_CHECKING

from tformer_cli.version import __version__

# tformer_cli/api.py (not `evaluate`: importing the submodule tformer_cli.evaluate would replace that name)
_API = ("load", "Model", "evaluate_translations", "PairScore")

if TYPE_CHECKING:
    from tformer_cli.api import Model, PairScore, evaluate_translations, load

__all__ = ["Model", "PairScore", "__version__", "evaluate_translations", "load"]


def __getattr__(name: str):
    """The Python API's names, imported from tformer_cli/api.py when first asked for."""
    if name in _API:
        from tformer_cli import api

        return getattr(api, name)
    raise AttributeError(f"module 'tformer_cli' has no attribute {name!r}")
