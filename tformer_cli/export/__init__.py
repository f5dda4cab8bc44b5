"""`tformer export`: a trained model in formats other tools read.

- `weights.py`: the weights alone, as safetensors (any kind of model).
- `hugging_face.py`: a Hugging Face `transformers` model directory (config, weights, tokenizer, card).
- `ctranslate2.py`: a CTranslate2 model directory (and the engine `tformer translate --engine` uses).
- `folder.py`: writing an export directory all at once, and the optional extra's one-line error.
"""

from tformer_cli.export.weights import export_safetensors

__all__ = ["export_safetensors"]
