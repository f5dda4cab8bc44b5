"""Nothing silently wrong: every number has a range, places are names, and YAML aliases are refused."""

import dataclasses
import math
import re
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import pytest

from tformer_cli.config import load_config
from tformer_cli.errors import ConfigError
from tformer_cli.schema import Config

ROOT = Path(__file__).parents[2]

# key -> (values that must load, values just outside the range that must be refused). The values at
# the edge of each range are in the first list, so a check one step too strict fails here as well.
RANGES: dict[str, tuple[list[str], list[str]]] = {
    "run.seed": (["0", "4294967295"], ["-1", "4294967296"]),
    "run.threads": (["0", "3", "1024"], ["-1", "1025"]),
    "data.pattern.seed": (["0", "4294967295"], ["-1", "4294967296"]),
    "data.pattern.n_examples": (["8001"], ["1", "100000001"]),
    "data.pattern.n_train": (["1"], ["0", "100000001"]),
    "data.pattern.seq_len": (["5", "65536"], ["0", "131073"]),
    "data.pattern.vocab_size": (["4", "1048576"], ["3", "1048577"]),
    "data.pattern.n_classes": (["2"], ["1", "1048577"]),
    "data.pattern.pattern_len": (["1"], ["0", "131073"]),
    "data.sessions.seed": (["0", "4294967295"], ["-1", "4294967296"]),
    "data.sessions.n_sessions": (
        ["1001"],
        ["2", "100000001"],
    ),  # 1001: the default 500 + 500 held out, and one to train on
    "data.sessions.n_valid": (["1"], ["0", "100000001"]),
    "data.sessions.n_test": (["1"], ["0", "100000001"]),
    "data.sessions.session_len": (["2", "131072"], ["1", "131073"]),
    "data.sessions.min_len": (["null", "2"], ["1", "131073"]),
    "data.sessions.n_items": (["2", "1048575"], ["1", "1048576"]),
    "data.sessions.p_local": (["0", "1"], ["-0.001", "1.001"]),
    "data.sessions.p_long": (["0", "1"], ["-0.001", "1.001"]),
    "data.sessions.long_after": (["0", "131072"], ["-1", "131073"]),
    "data.sessions.min_gap": (["1", "131072"], ["0", "131073"]),
    "data.max_len": (["2", "131072"], ["1", "131073"]),
    "data.max_len_ratio": (["1"], ["0.999"]),
    "data.block_size": (["1", "131072"], ["0", "131073"]),
    "data.workers": (["0", "1024"], ["-1", "1025", "9223372036854775807"]),
    "tokenizer.vocab_size": (["5", "1048576"], ["4", "1048577"]),
    "tokenizer.character_coverage": (["0.98", "1"], ["0.979", "1.001"]),  # SentencePiece's own range
    "tokenizer.input_sentence_size": (
        ["0", "101", "1000000000"],
        ["-1", "1", "100", "1000000001"],
    ),  # 0 = every sentence
    "tokenizer.threads": (["1", "1024"], ["0", "1025"]),
    "model.d_model": (["8", "65536"], ["0", "65537"]),
    "model.n_heads": (["1", "512"], ["0", "1025"]),
    "model.n_kv_heads": (["null", "1"], ["0", "1025"]),
    "model.n_layers": (["1", "1024"], ["0", "1025", "100000"]),
    "model.n_decoder_layers": (["null", "1", "1024"], ["0", "1025"]),
    "model.d_ff": (["1", "262144"], ["0", "262145"]),
    "model.dropout": (["0", "0.999"], ["-0.001", "1"]),
    "model.attn_dropout": (["0", "0.999"], ["-0.001", "1"]),
    "model.activation_dropout": (["0", "0.999"], ["-0.001", "1"]),
    "model.max_len": (["1", "131072"], ["0", "131073"]),
    "train.lr": (["1e-12"], ["0"]),
    "train.betas": (["0", "0.999"], ["-0.001", "1"]),
    "train.eps": (["1e-12"], ["0"]),
    "train.weight_decay": (["0"], ["-0.001"]),
    "train.warmup_steps": (["0", "1000000000"], ["-1", "1000000001"]),
    "train.lr_scale": (["1e-3"], ["0"]),
    "train.min_lr_ratio": (["0", "1"], ["-0.001", "1.001"]),
    "train.epochs": (["1", "1000000000"], ["0", "1000000001"]),
    "train.max_updates": (["null", "1", "1000000000"], ["0", "1000000001"]),
    "train.max_minutes": (["0", "0.5", "5256000"], ["-0.001", "5256001"]),
    "train.batch_size": (["1", "16777216"], ["0", "16777217"]),
    "train.max_tokens": (["1", "16777216"], ["0", "16777217"]),
    "train.pad_to_multiple": (["1", "8", "131072"], ["0", "131073"]),
    "train.update_freq": (["1", "65536"], ["0", "65537"]),
    "train.clip_norm": (["0"], ["-0.001"]),
    "train.label_smoothing": (["0", "0.999"], ["-0.001", "1"]),
    "train.bpe_dropout": (["0", "0.999"], ["-0.001", "1"]),
    "train.loss_chunk": (["0", "1", "16777216"], ["-1", "16777217"]),
    "train.log_every": (["1", "1000000000"], ["0", "1000000001"]),
    "train.valid_every": (["0", "1000000000"], ["-1", "1000000001"]),
    "train.valid_bleu_lines": (["0", "100000000"], ["-1", "100000001"]),
    "train.keep_last": (["1", "10000"], ["0", "10001"]),
    "train.keep_best": (["0", "10000"], ["-1", "10001"]),
    "train.patience": (["0", "1000000000"], ["-1", "1000000001"]),
    "train.max_nonfinite": (["1", "1000000000"], ["0", "1000000001"]),
    "train.ema_decay": (["0", "0.9999"], ["-0.001", "1"]),
    "decode.beam": (["1", "1024"], ["0", "1025"]),
    "decode.len_penalty": (["-1", "0", "2"], []),  # any finite alpha: < 0 favours short outputs
    "decode.max_len_a": (["0", "1000"], ["-0.001", "1000.001"]),
    "decode.max_len_b": (["1", "131072"], ["0", "131073"]),
    "decode.nbest": (["1"], ["0", "1025"]),
    "decode.max_tokens": (["1", "16777216"], ["0", "16777217"]),
    "decode.max_new_tokens": (["1", "131072"], ["0", "131073"]),
    "decode.temperature": (["0"], ["-0.001"]),
    "decode.top_k": (["0", "1048576"], ["-1", "1048577"]),
    "decode.top_p": (["1e-6", "1"], ["0", "1.001"]),
    "decode.seed": (["0", "4294967295"], ["-1", "4294967296"]),
    "decode.samples": (["1", "1024"], ["0", "1025"]),
    "decode.min_len": (["0", "131072"], ["-1", "131073"]),
    "decode.no_repeat_ngram": (["0", "131072"], ["-1", "131073"]),
    "decode.repetition_penalty": (["1e-6", "1", "2.5"], ["0", "-1"]),
}

# Numbers for which a large negative value is meaningful; every other one must refuse -1e9.
NEGATIVE_OK = {
    "decode.len_penalty": "GNMT alpha: a negative one favours short outputs, a legitimate if odd choice",
}


def numeric_fields(cls: type = Config, prefix: str = "") -> dict[str, str]:
    """Every int and float key of the schema -> 'int', 'float' or 'floats' (a tuple of floats)."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        key, tp = f"{prefix}{f.name}", hints[f.name]
        if dataclasses.is_dataclass(tp):
            out |= numeric_fields(tp, key + ".")
            continue
        args = typing.get_args(tp) or (tp,)
        if typing.get_origin(tp) is tuple and float in args:
            out[key] = "floats"
        elif float in args:
            out[key] = "float"
        elif int in args:
            out[key] = "int"
    return out


def overrides(key: str, value: str) -> list[str]:
    """`key=value`; for a tuple of floats, one override with `value` in each place (beside 0.5)."""
    if numeric_fields()[key] == "floats":
        return [f"{key}=[{value}, 0.5]", f"{key}=[0.5, {value}]"]
    return [f"{key}={value}"]


def refusal(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    message = str(err.value)
    assert "\n" not in message
    return message


def assert_names(message: str, key: str, value: str | None = None) -> str:
    """`key` is the subject of one problem in `message` (`where: key must ...; key2 must ...`); return it."""
    problem = next((p for p in re.split(r": |; ", message) if p.startswith(f"{key} must ")), None)
    assert problem is not None, f"no problem about {key}: {message}"
    if value is not None:
        assert problem.endswith(f", got {value}"), problem
    return problem


def test_the_range_table_covers_every_number_of_the_schema():
    assert set(RANGES) == set(numeric_fields()), "a new int/float key needs a range in Config.problems() and here"


@pytest.mark.parametrize("key", sorted(numeric_fields()))
def test_absurd_numbers_are_refused_naming_the_key(key):
    kind = numeric_fields()[key]
    absurd = [".nan", ".inf", "-.inf", "1e400", "-1e400"] if kind != "int" else []
    if key not in NEGATIVE_OK:
        absurd.append("-1000000000" if kind == "int" else "-1e9")
    for override in [o for value in absurd for o in overrides(key, value)]:
        assert_names(refusal([override]), key)


@pytest.mark.parametrize("key", sorted(RANGES))
def test_range_edges(key):
    inside, outside = RANGES[key]
    for override in [o for value in inside for o in overrides(key, value)]:
        load_config(None, [override])
    for override in [o for value in outside for o in overrides(key, value)]:
        problem = assert_names(refusal([override]), key)
        assert re.fullmatch(rf"{re.escape(key)} must be .*(in [\[(]|>=? |<=? ).*, got .+", problem), problem


@pytest.mark.parametrize("key", sorted(k for k, kind in numeric_fields().items() if kind != "int"))
def test_problems_refuse_non_finite_floats_set_in_python(key):
    for bad in (math.nan, math.inf, -math.inf):
        value = (bad, 0.5) if numeric_fields()[key] == "floats" else bad
        config = _replaced(Config(), key.split("."), value)
        assert_names("config: " + "; ".join(config.problems()), key)


def _replaced(section, path: list[str], value):
    """`section` with the key at `path` (e.g. ["data", "sessions", "p_local"]) set to `value`."""
    inner = value if len(path) == 1 else _replaced(getattr(section, path[0]), path[1:], value)
    return dataclasses.replace(section, **{path[0]: inner})


@pytest.mark.parametrize(
    ("override", "key", "shown"),
    [
        ("train.clip_norm=.nan", "train.clip_norm", "nan"),  # disabled clipping without a word
        ("train.max_updates=-5", "train.max_updates", "-5"),
        ("train.valid_every=-1", "train.valid_every", "-1"),
        ("train.log_every=0", "train.log_every", "0"),  # a ZeroDivisionError in the loop
        ("train.betas=[2, 3]", "train.betas", "[2.0, 3.0]"),  # a ValueError from torch.optim
        ("train.lr=.inf", "train.lr", "inf"),
        ("decode.len_penalty=-.inf", "decode.len_penalty", "-inf"),
    ],
)
def test_known_offenders_name_key_value_and_range(override, key, shown):
    message = refusal([override])
    assert message.startswith(f"override '{override}': ") or message.startswith("config: ")
    assert_names(message, key, shown)


def test_non_finite_floats_are_refused_where_they_are_read(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train:\n  lr: 0.001\n  clip_norm: .nan\n")
    with pytest.raises(ConfigError, match=r"r.yaml:3: train.clip_norm must be a finite number, got nan$"):
        load_config(recipe)
    for raw in ("inf", "1e400", "-1.5e999", "1" + "0" * 400):  # a 400-digit int does not fit a float
        message = refusal([f"train.lr={raw}"])
        assert message.startswith(f"override 'train.lr={raw}': train.lr "), message


def test_cross_field_problems_still_come_together_on_one_line():
    message = refusal(["train.log_every=0", "model.dropout=1.5", "decode.nbest=5"])
    for key in ("train.log_every", "model.dropout", "decode.nbest"):
        assert_names(message, key)
    assert message.count("; ") == 2


def test_sessions_keep_a_training_session_and_fit_the_model():
    sessions = ["data.kind=sessions", "model.kind=lm"]
    message = refusal([*sessions, "data.sessions.n_sessions=1000"])  # 500 + 500 held out: none left to train on
    assert_names(message, "data.sessions.n_sessions", "1000")
    assert_names(refusal([*sessions, "data.sessions.min_len=21"]), "data.sessions.min_len", "21")
    learned = [*sessions, "model.pos=learned"]
    assert_names(refusal([*learned, "model.max_len=18"]), "model.max_len", "18")  # 19 inputs per session
    load_config(None, [*learned, "model.max_len=19"])
    load_config(None, [*sessions, "data.sessions.n_sessions=1001", "data.sessions.min_len=20"])


def test_ranking_metrics_pick_best_checkpoints_of_sessions_only():
    for metric in ("hit10", "mrr"):
        assert "needs data.kind=sessions" in refusal([f"train.best_metric={metric}"])
        load_config(None, ["data.kind=sessions", "model.kind=lstm", f"train.best_metric={metric}"])


def test_pattern_classes_must_fit_the_patterns_there_are():
    # 2 token values, patterns of 2: only 4 distinct patterns; 5 classes used to loop forever
    overrides = ["data.kind=pattern", "model.kind=classifier", "data.pattern.vocab_size=4"]
    message = refusal([*overrides, "data.pattern.pattern_len=2", "data.pattern.n_classes=5"])
    assert_names(message, "data.pattern.n_classes", "5")
    load_config(None, [*overrides, "data.pattern.pattern_len=2", "data.pattern.n_classes=4"])


# ---------------------------------------------------------------- strings that name places


@pytest.mark.parametrize("name", ["", "' '", ".", "..", "a/b", "/tmp/x", "a\\b", "x\x00y"])
def test_run_name_is_one_folder_name(name):
    shown = repr(name.strip("'"))  # "' '" is YAML for one space
    assert_names(refusal([f"run.name={name}"]), "run.name", shown)


@pytest.mark.parametrize(("key", "value"), [("run.out_dir", ""), ("run.out_dir", "' '"), ("data.dir", "")])
def test_places_are_not_empty(key, value):
    assert_names(refusal([f"{key}={value}"]), key, repr(value.strip("'")))


@pytest.mark.parametrize("value", [".", "/", "a/..", "..", "a\x00b"])
def test_data_dir_names_the_folder_prepare_replaces(value):
    assert_names(refusal([f"data.dir={value}"]), "data.dir", repr(value))


def test_ordinary_places_load():
    cfg = load_config(None, ["run.name=wmt-base_2", "run.out_dir=.", "data.dir=./data/x"])
    assert (cfg.run.name, cfg.run.out_dir, cfg.data.dir) == ("wmt-base_2", ".", "./data/x")


# ---------------------------------------------------------------- YAML anchors and aliases

BILLION_LAUGHS = """\
data:
  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]
  b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
  c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
  d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
  e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
  f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
  g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
  h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
  i: [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""

# Run in a child with a time and memory limit: if the refusal ever regresses, the expansion
# (9**9 strings) fails this test instead of hanging or swapping the machine.
CHILD = """\
import resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from tformer_cli.config import load_config
from tformer_cli.errors import ConfigError
start = time.perf_counter()
try:
    load_config(sys.argv[1])
except ConfigError as exc:
    print(f"{time.perf_counter() - start:.3f} {exc}")
"""


def test_billion_laughs_is_refused_at_once(tmp_path):
    recipe = tmp_path / "laughs.yaml"
    recipe.write_text(BILLION_LAUGHS)
    try:
        child = subprocess.run(
            [sys.executable, "-c", CHILD, str(recipe)], capture_output=True, text=True, timeout=10, cwd=ROOT
        )
    except subprocess.TimeoutExpired:
        pytest.fail("loading a billion-laughs recipe was still busy after 10 s")
    assert child.returncode == 0, child.stderr[-2000:]
    seconds, message = child.stdout.strip().split(" ", 1)
    assert message == f"{recipe}:2: YAML anchors (&a) are not allowed in recipes"
    assert float(seconds) < 0.5


def test_aliases_and_anchors_are_refused_with_file_and_line(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train:\n  lr: 0.001\n  betas: [0.9, *x]\n")  # an alias to nothing: refused as an alias
    with pytest.raises(ConfigError, match=re.escape(f"{recipe}:3: YAML aliases (*x) are not allowed in recipes")):
        load_config(recipe)
    recipe.write_text("run:\n  name: &n r\n")
    with pytest.raises(ConfigError, match=re.escape(f"{recipe}:2: YAML anchors (&n) are not allowed in recipes")):
        load_config(recipe)
    recipe.write_text(
        textwrap.dedent("""\
        base: &base {lr: 0.001}
        train:
          <<: *base
    """)
    )
    with pytest.raises(ConfigError, match=r"r.yaml:1: YAML anchors \(&base\)"):
        load_config(recipe)


@pytest.mark.parametrize("override", ["train.betas=[&b 0.9, *b]", "run.name=*x", "run.name=&x"])
def test_aliases_and_anchors_in_overrides_are_refused(override):
    message = refusal([override])
    assert message.startswith(f"override '{override}': YAML ")
    assert "are not allowed in recipes" in message
