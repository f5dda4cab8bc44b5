"""The recipe: one strict, typed, frozen config tree.

A recipe YAML is laid over the dataclass defaults (defaults live here and nowhere else), then
`key=value` overrides are laid over that. Every problem is a `ConfigError` whose one line names the
dotted key and where it came from (file:line, or the override), with a "did you mean" for typos.
The schema is in `tformer_cli/schema.py`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, cast, get_args, get_origin

import yaml
from yaml.constructor import ConstructorError

from tformer_cli.data.root import with_data_root
from tformer_cli.errors import ConfigError
from tformer_cli.kinds import DATA_KINDS
from tformer_cli.schema import Config, config_to_dict

_FLOAT_RE = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")
INT64 = (-(2**63), 2**63 - 1)
MAX_DEPTH = 64  # levels of [ and { a recipe or an override may nest
_ALLOWED_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "seq", "map")}
_NUMBER_TAGS = {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}


@dataclass(frozen=True)
class Located:
    """A value read from the recipe, with where it came from (for error messages)."""

    value: Any
    where: str


# ---------------------------------------------------------------- reading YAML safely


def _read_tree(path: Path) -> dict[str, Any]:
    """Parse `path` into nested dicts of `Located` leaves; refuse duplicates and non-plain tags."""
    if not path.is_file():
        raise ConfigError(f"recipe not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
        if _flow_depth(text) > MAX_DEPTH:
            raise ConfigError(f"{path}: nested too deeply (more than {MAX_DEPTH} levels of [ and {{)")
        anchor = _first_anchor(text)
        if anchor:
            raise ConfigError(f"{path}:{anchor[0]}: {anchor[1]}")
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is None or (isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null")):
            # nothing but blanks, comments, `---` or `null`: defaults alone would train on no named data
            raise ConfigError(f"{path}: the recipe is empty (no sections: run:, data:, model:, train:, ...)")
        if not isinstance(node, yaml.MappingNode):
            raise ConfigError(f"{path}:1: a recipe must be a mapping of sections (run:, model:, train:, ...)")
        return _walk(node, "", str(path))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{_yaml_where(exc, str(path))}: YAML syntax error: {_yaml_problem(exc)}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply (a recipe is sections of keys and values)") from None


def _flow_depth(text: str) -> int:
    """The deepest nesting of `[` and `{` in `text`, roughly (quotes and comments are not told apart).

    PyYAML's scanner takes time quadratic in that depth (5,000 levels: half a minute) before it would
    fail on Python's recursion limit; recipes use 2 or 3 levels, so a rough count refuses the hostile ones
    at once and no real one.
    """
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(depth - 1, 0)
    return deepest


def _yaml_where(exc: yaml.YAMLError, name: str) -> str:
    """`name:line` of a YAML error, where it says (a reader error knows a character position only)."""
    mark = getattr(exc, "problem_mark", None)
    return f"{name}:{mark.line + 1}" if mark else name


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What a YAML error says is wrong, in one line (a NUL or other control character: which, where)."""
    if isinstance(exc, yaml.reader.ReaderError):
        char = chr(exc.character) if isinstance(exc.character, int) else exc.character
        return f"character {char!r} at position {exc.position} is not allowed in YAML"
    return " ".join(str(getattr(exc, "problem", None) or exc).split())


def _first_anchor(text: str) -> tuple[int, str] | None:
    """The line of the first YAML anchor (&name) or alias (*name) in `text`, and a message saying so.

    Recipes have no use for them, and nested aliases ("billion laughs") would keep `_walk` busy
    forever: found in the event stream, before any node is built, so refusing them costs nothing.
    """
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        assert event.start_mark is not None  # the parser marks every event it makes
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            return line, f"YAML aliases (*{event.anchor}) are not allowed in recipes"
        if (anchor := getattr(event, "anchor", None)) is not None:
            return line, f"YAML anchors (&{anchor}) are not allowed in recipes"
    return None


def _walk(node: yaml.Node, prefix: str, file: str) -> Any:
    where = f"{file}:{node.start_mark.line + 1}"
    if node.tag not in _ALLOWED_TAGS:
        raise ConfigError(f"{where}: YAML tag {node.tag.split(':')[-1]!r} is not allowed (key {prefix or 'root'!r})")
    if isinstance(node, yaml.MappingNode):
        tree: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            dotted = f"{prefix}.{key}" if prefix else key
            if key in tree:
                raise ConfigError(f"{file}:{key_node.start_mark.line + 1}: duplicate key {dotted!r}")
            tree[key] = _walk(value_node, dotted, file)
        return tree
    if isinstance(node, yaml.SequenceNode):
        return Located([_plain(_walk(item, prefix, file)) for item in node.value], where)
    if (problem := _number_problem(node)) is not None:
        raise ConfigError(f"{where}: {prefix}: {problem}")
    try:
        return Located(yaml.SafeLoader("").construct_object(node, deep=True), where)
    except ConstructorError as exc:
        raise ConfigError(f"{where}: cannot read {prefix!r}: {exc.problem}") from None


def _number_problem(node: yaml.Node) -> str | None:
    """Why a plain scalar YAML reads as a number is refused: YAML 1.1 (PyYAML's) reads a leading 0 as octal (010
    is 8) and colons as base 60 (1:30 is 90), readings a recipe never means and no reader would see."""
    if not isinstance(node, yaml.ScalarNode) or node.style is not None or node.tag not in _NUMBER_TAGS:
        return None  # quoted, a string, a section or a list
    digits = node.value.lstrip("+-").replace("_", "")
    if ":" in digits:
        value = yaml.SafeLoader("").construct_object(node)
        return f"{node.value!r} is {value} to YAML (base 60); write the number itself"
    if node.tag.endswith(":int") and len(digits) > 1 and digits[0] == "0" and digits[1].isdigit():
        value = yaml.SafeLoader("").construct_object(node)
        return (
            f"{node.value!r} is {value} to YAML (octal); write {value}, or {int(digits)} without the leading 0 "
            f"(in quotes, {node.value!r} is text)"
        )
    return None


def _refuse_ambiguous_numbers(node: yaml.Node, key: str, where: str) -> None:
    """`_number_problem` of every scalar in `node` (an override's value: a scalar, list or mapping), as a
    ConfigError naming `key` and `where`."""
    if (problem := _number_problem(node)) is not None:
        raise ConfigError(f"{where}: {key}: {problem}")
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_ambiguous_numbers(item, key, where)
    elif isinstance(node, yaml.MappingNode):
        for _, value in node.value:
            _refuse_ambiguous_numbers(value, key, where)


def _plain(walked: Any) -> Any:
    """A walked node as a plain value (a mapping inside a list: its `_coerce` then names the key)."""
    if isinstance(walked, dict):
        return {key: _plain(value) for key, value in walked.items()}
    return walked.value


def _apply_override(tree: dict[str, Any], item: str) -> None:
    """Lay one `section.key=value` over the tree; the value is read as YAML (safely)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected key=value, e.g. train.lr=5e-4")
    dotted, raw = item.split("=", 1)
    where = f"override '{item if len(item) <= 500 else item[:200] + '...'}'"  # 5,000 brackets: not all of them
    if _flow_depth(raw) > MAX_DEPTH:
        raise ConfigError(f"{where}: nested too deeply (more than {MAX_DEPTH} levels of [ and {{)")
    try:
        anchor = _first_anchor(raw)
    except (yaml.YAMLError, RecursionError):
        anchor = None
    if anchor:
        raise ConfigError(f"{where}: {anchor[1]}")
    try:
        parsed = yaml.compose(raw, Loader=yaml.SafeLoader) if raw.strip() else None
        value = yaml.SafeLoader("").construct_document(parsed) if parsed is not None else ""
    except yaml.YAMLError:
        parsed, value = None, raw
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply") from None
    if parsed is not None:
        _refuse_ambiguous_numbers(parsed, dotted.strip(), where)
    parts = dotted.strip().split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if isinstance(child, Located):
            raise ConfigError(f"{where}: {'.'.join(parts[: i + 1])!r} is a value, not a section")
        node = child
    node[parts[-1]] = Located(value, where)


# ---------------------------------------------------------------- typed building


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        dotted = f"{prefix}.{f.name}" if prefix else f.name
        keys.append(dotted)
        if dataclasses.is_dataclass(hints[f.name]):
            keys += _all_keys(hints[f.name], dotted)
    return keys


def _unknown(dotted: str, where: str) -> ConfigError:
    close = difflib.get_close_matches(dotted, _all_keys(Config), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"{where}: unknown key {dotted!r}{hint}")


def _first_where(tree: dict[str, Any]) -> str:
    for value in tree.values():
        return value.where if isinstance(value, Located) else _first_where(value)
    return "recipe"


def _build(cls: type, tree: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if key not in names:
            raise _unknown(dotted, value.where if isinstance(value, Located) else _first_where(value))
        target = hints[key]
        if dataclasses.is_dataclass(target):
            if isinstance(value, Located):
                if value.value is None:
                    continue  # an empty section (`model:` with nothing under it) keeps the defaults
                raise ConfigError(f"{value.where}: {dotted!r} is a section; set its keys, e.g. {dotted}.<key>=...")
            kwargs[key] = _build(cast(type, target), value, dotted)  # a type hint: the section's dataclass
        elif isinstance(value, dict):
            raise ConfigError(f"{_first_where(value)}: {dotted!r} is a value, not a section")
        else:
            kwargs[key] = _coerce(value.value, target, dotted, value.where)
    return cls(**kwargs)


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(str(a) for a in get_args(tp))
    if get_origin(tp) in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(tp))
    if get_origin(tp) is tuple:
        args = get_args(tp)
        return (
            f"list of {_type_name(args[0])}" if args[-1] is Ellipsis else f"list of {len(args)} {_type_name(args[0])}"
        )
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, dotted: str, where: str) -> Any:
    """Check `value` against the annotation `tp`; the only conversions are int -> float and '1e-4' -> float."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in get_args(tp):
            return None
        if int in get_args(tp) and isinstance(value, int) and not isinstance(value, bool):
            return _coerce(value, int, dotted, where)  # an int for `int | None`: its own message if out of range
        for option in get_args(tp):
            if option is not type(None):
                try:
                    return _coerce(value, option, dotted, where)
                except ConfigError:
                    pass
    elif origin is Literal:
        if value in get_args(tp):
            return value
    elif origin is tuple:
        args = get_args(tp)
        if args[-1] is Ellipsis and isinstance(value, list) and value:  # tuple[X, ...]: a non-empty list
            return tuple(_coerce(v, args[0], dotted, where) for v in value)
        if isinstance(value, list) and len(value) == len(args):
            return tuple(_coerce(v, a, dotted, where) for v, a in zip(value, args, strict=True))
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not INT64[0] <= value <= INT64[1]:  # past what torch, numpy and the OS take: refused here, for every key
                raise ConfigError(f"{where}: {dotted} must be a 64-bit integer, got {value}")
            return value
    elif tp is float:
        number = _finite_float(value, dotted, where)
        if number is not None:
            return number
    elif tp is str:
        if isinstance(value, str):
            return value
    hint = " (YAML reads yes, no, on, off, true and false as booleans)" if isinstance(value, bool) else ""
    if isinstance(value, str) and (close := difflib.get_close_matches(value, _words(tp), n=1, cutoff=0.6)):
        hint = f"; did you mean {close[0]!r}?"  # a misspelt choice, as a misspelt key gets
    raise ConfigError(f"{where}: {dotted} expects {_type_name(tp)}, got {value!r}{hint}")


def _words(tp: Any) -> list[str]:
    """The string choices an annotation takes (a Literal's, also inside a union)."""
    if get_origin(tp) is Literal:
        return [a for a in get_args(tp) if isinstance(a, str)]
    if get_origin(tp) in (Union, types.UnionType):
        return [word for option in get_args(tp) for word in _words(option)]
    return []


def _finite_float(value: Any, dotted: str, where: str) -> float | None:
    """`value` as a float if it is a number (None if not); nan and infinities are refused.

    Refused here, where every float is read, because nan slips through range checks (`nan < 0` is
    false: `train.clip_norm=.nan` would disable clipping) and no setting needs an infinity.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    if isinstance(value, str) and not _FLOAT_RE.match(value.strip()):
        return None  # YAML 1.1 reads `1e-4` (no dot) as a string: the one string read as a number
    try:
        number = float(value)
    except OverflowError:  # an int of 400 digits
        number = math.inf
    if not math.isfinite(number):
        raise ConfigError(f"{where}: {dotted} must be a finite number, got {value!r}")
    return number


# ---------------------------------------------------------------- public API


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a recipe, apply `key=value` overrides, check types and cross-field rules.

    Args:
        path: the recipe YAML (None: defaults only, e.g. for tests).
        overrides: `section.key=value` strings, applied in order.

    Returns:
        The frozen config.

    Raises:
        ConfigError: one line naming the key and its origin (several cross-field problems joined).
    """
    tree = _read_tree(Path(path)) if path is not None else {}
    for item in overrides:
        _apply_override(tree, item)
    where = str(path or "config")
    config = _checked(_build(Config, tree, ""), where)
    return dataclasses.replace(config, data=with_data_root(config.data, where))  # $TFORMER_DATA in data paths


def _checked(config: Config, where: str) -> Config:
    """Every cross-field problem at once, as one line."""
    problems = config.problems()
    if problems:
        raise ConfigError(f"{where}: " + "; ".join(problems))
    return config


def config_from_dict(
    data: dict[str, Any], where: str, overrides: list[str] | tuple[str, ...] = (), allowed: tuple[str, ...] = ()
) -> Config:
    """Rebuild a config saved with `config_to_dict` (e.g. inside a checkpoint), with overrides.

    Args:
        allowed: what overrides may touch: section prefixes ("decode.") and single keys ("run.threads=");
            at inference, changing the model or data of a trained checkpoint would not fit its weights.
    """

    def locate(d: dict[str, Any]) -> dict[str, Any]:
        return {k: locate(v) if isinstance(v, dict) else Located(v, where) for k, v in d.items()}

    tree = locate(data)
    for item in overrides:
        if allowed and not item.startswith(allowed):
            names = ", ".join(a[:-1] if a.endswith("=") else a + "*" for a in allowed)  # "decode.*, run.threads"
            raise ConfigError(f"override {item!r}: only {names} can change here")
        _apply_override(tree, item)
    return _checked(_build(Config, tree, ""), where)


def config_to_yaml(config: Config) -> str:
    return yaml.safe_dump(config_to_dict(config), sort_keys=False, default_flow_style=None)


_HUB_KEYS = ("hub", "hub_config", "hub_revision", "train_split", "valid_split", "test_split")
_LOCAL_KEYS = ("train", "valid", "test")


def relevant_dict(config: Config) -> dict[str, Any]:
    """`config_to_dict(config)` less what the recipe's kinds never read: what a reader of the recipe needs.

    `data.pattern` only for data.kind=pattern and `data.sessions` only for sessions; the hub keys only when the
    recipe reads the hub, the local file keys only when it reads local files; the tokenizer only for text and
    parallel data. What `check`, model cards and sweep records show; config.yaml and checkpoints keep it all.
    """
    whole = config_to_dict(config)
    d = config.data
    kind = DATA_KINDS[d.kind]
    keys = kind.keys
    if not kind.generated:
        keys += _LOCAL_KEYS if d.train is not None else _HUB_KEYS
    data = {key: value for key, value in whole["data"].items() if key in keys}
    shown = {**whole, "data": data}
    if kind.generated:
        del shown["tokenizer"]
    return shown


def relevant_yaml(config: Config) -> str:
    """`relevant_dict` as the YAML `check` prints and model cards show."""
    return yaml.safe_dump(relevant_dict(config), sort_keys=False, default_flow_style=None)
