"""A trained run's one home: its directory layout, its checkpoints, and the one way to load it.

- layout.py: the names of the run directory's files (and of eval results).
- checkpoints.py: the checkpoint file format, the index readers verify against, averaging.
- load.py: `build_model_from_config` (config -> model) and `load_run` (checkpoint -> ready model).
"""

from tformer_cli.run.load import (
    Run,
    build_model_from_config,
    cast_weights,
    check_served,
    inference_dtype,
    load_run,
    not_served,
    resolve_device,
    use_tf32,
)

__all__ = [
    "Run",
    "build_model_from_config",
    "check_served",
    "cast_weights",
    "inference_dtype",
    "load_run",
    "not_served",
    "resolve_device",
    "use_tf32",
]
