"""tformer: train and evaluate Transformer models from YAML recipes."""

__version__ = "0.1.0"
