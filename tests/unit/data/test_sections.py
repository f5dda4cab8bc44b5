"""data/ reads the recipe's data and tokenizer sections, never the whole config: what each function takes is what it
reads, so a reader (or a test) can call it with those sections alone."""

import importlib
import inspect
import pkgutil

import tformer_cli.data
from tformer_cli.schema import Config, DataConfig


def _functions():
    """Every function and method defined in the modules of tformer_cli/data, with its qualified name."""
    for info in pkgutil.iter_modules(tformer_cli.data.__path__):
        module = importlib.import_module(f"tformer_cli.data.{info.name}")
        for name, value in vars(module).items():
            if getattr(value, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(value):
                yield f"{module.__name__}.{name}", value
            elif inspect.isclass(value):
                for attr, member in vars(value).items():
                    if inspect.isfunction(member):
                        yield f"{module.__name__}.{name}.{attr}", member


def test_no_function_in_data_takes_the_whole_config():
    found = dict(_functions())
    assert "tformer_cli.data.prepared.PreparedData.__init__" in found and "tformer_cli.data.prepare.prepare" in found
    whole = [
        f"{name}({parameter})"
        for name, function in found.items()
        for parameter, spec in inspect.signature(function).parameters.items()
        if spec.annotation in ("Config", Config)  # a string under `from __future__ import annotations`
        or spec.annotation is importlib.import_module("tformer_cli.schema").Config
    ]
    assert not whole, f"take the sections read, not the whole Config: {whole}"


def test_the_data_root_resolves_within_the_data_section(monkeypatch):
    """`with_data_root` takes and gives the data section: nothing else of a recipe changes with the data root."""
    from tformer_cli.data.root import with_data_root

    monkeypatch.setenv("TFORMER_DATA", "/corpora")
    resolved = with_data_root(DataConfig(train="$TFORMER_DATA/multi30k/train"), "recipe.yaml")
    assert isinstance(resolved, DataConfig) and resolved.train == "/corpora/multi30k/train"
