"""The package's version: one place, read by pyproject.toml, `tformer --version`, exports and model cards."""

__version__ = "0.1.0"
