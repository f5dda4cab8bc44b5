"""Decoding, beside the model: the searches, their fast caches, CPU-packed layers, the fixed-shape path for
GPUs (static caches, CUDA graphs) and text streaming.

The entry points are decoding/api.py's `translate_batch` and `generate`, which choose the path; every search takes
(model, inputs, settings), the settings one `SearchSettings` (decoding/settings.py), and the rules are
decoding/rules.py's. The model (tformer_cli/model/) is the readable reference; what here makes decoding fast is
swapped in or handed to it (a cache, a packed layer) and tested against the reference.
"""
