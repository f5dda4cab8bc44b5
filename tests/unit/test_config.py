"""Every recipe error a user can make gets one actionable line."""

import dataclasses
import re

import pytest

from tformer_cli.config import config_from_dict, config_to_dict, config_to_yaml, load_config
from tformer_cli.errors import ConfigError

BASE = """\
run:
  name: t
data:
  kind: pattern
model:
  kind: classifier
  d_model: 32
  n_heads: 4
train:
  lr: 0.001
"""


@pytest.fixture
def recipe(tmp_path):
    def write(text: str = BASE):
        path = tmp_path / "r.yaml"
        path.write_text(text)
        return path

    return write


def test_defaults_and_values(recipe):
    cfg = load_config(recipe())
    assert cfg.model.d_model == 32 and cfg.train.lr == 0.001 and cfg.model.d_ff == 2048


def test_unknown_key_in_file_names_key_line_and_suggestion(recipe):
    with pytest.raises(ConfigError) as err:
        load_config(recipe(BASE + "  lrr: 1\n"))
    msg = str(err.value)
    assert "r.yaml:11" in msg and "'train.lrr'" in msg and "did you mean 'train.lr'" in msg
    assert "\n" not in msg


def test_unknown_section(recipe):
    with pytest.raises(ConfigError, match=r"r.yaml:\d+: unknown key 'trian'; did you mean 'train'"):
        load_config(recipe(BASE + "trian:\n  lr: 1\n"))


def test_unknown_key_in_override(recipe):
    with pytest.raises(ConfigError, match=r"override 'train.lrr=1': unknown key 'train.lrr'; did you mean 'train.lr'"):
        load_config(recipe(), ["train.lrr=1"])


def test_wrong_type_names_key_type_and_value(recipe):
    with pytest.raises(ConfigError, match=r"r.yaml:7: model.d_model expects int, got 'big'"):
        load_config(recipe(BASE.replace("d_model: 32", "d_model: big")))
    with pytest.raises(ConfigError, match=r"model.d_model expects int, got 2.5"):
        load_config(recipe(), ["model.d_model=2.5"])
    with pytest.raises(ConfigError, match=r"model.norm expects layernorm \| rmsnorm, got 'batchnorm'"):
        load_config(recipe(), ["model.norm=batchnorm"])
    with pytest.raises(ConfigError, match=r"model.bias expects bool"):
        load_config(recipe(), ["model.bias=1"])


def test_a_yaml_boolean_where_a_word_is_expected_says_why(recipe):
    # YAML 1.1 reads `on` as true: the message says so instead of leaving "got True" unexplained
    with pytest.raises(ConfigError, match=r"decode.static expects auto \| always \| never, got True \(YAML reads yes"):
        load_config(recipe(), ["decode.static=on"])
    with pytest.raises(ConfigError, match=r"model.d_model expects int, got 'big'$"):
        load_config(recipe(), ["model.d_model=big"])


def test_scientific_notation_is_a_float(recipe):
    cfg = load_config(recipe(BASE.replace("lr: 0.001", "lr: 1e-4")), ["train.eps=1e-9"])
    assert cfg.train.lr == pytest.approx(1e-4) and isinstance(cfg.train.lr, float)
    assert cfg.train.eps == pytest.approx(1e-9)
    assert load_config(recipe(), ["train.lr=5e-4"]).train.lr == pytest.approx(5e-4)
    assert load_config(recipe(), ["train.lr=3"]).train.lr == 3.0  # ints widen to float


@pytest.mark.parametrize(
    ("written", "said"),
    [
        ("010", r"'010' is 8 to YAML \(octal\); write 8, or 10 without the leading 0"),
        ("-007", r"'-007' is -7 to YAML \(octal\)"),
        ("1:30", r"'1:30' is 90 to YAML \(base 60\); write the number itself"),
        ("1:30.5", r"'1:30.5' is 90.5 to YAML \(base 60\)"),
    ],
)
def test_a_number_yaml_1_1_reads_as_octal_or_base_60_is_refused_not_misread(recipe, written, said):
    # PyYAML reads YAML 1.1, where 010 is 8 and 1:30 is 90: no recipe means that, so the key and line are named
    with pytest.raises(
        ConfigError, match=r"^override 'train.epochs=" + re.escape(written) + r"': train.epochs: " + said
    ):
        load_config(recipe(), [f"train.epochs={written}"])
    with pytest.raises(ConfigError, match=r"r.yaml:11: train.epochs: " + said):
        load_config(recipe(BASE + f"  epochs: {written}\n"))
    with pytest.raises(ConfigError, match=r"train.betas: " + said):  # inside a list
        load_config(recipe(), [f"train.betas=[0.9, {written}]"])


def test_numbers_yaml_reads_as_written_still_load(recipe):
    cfg = load_config(recipe(), ["train.epochs=10", "train.lr=0x10", "run.seed=0", "train.max_updates=1_000"])
    assert (cfg.train.epochs, cfg.train.lr, cfg.run.seed, cfg.train.max_updates) == (10, 16.0, 0, 1000)
    assert load_config(recipe(), ["run.name='0777'"]).run.name == "0777"  # quoted: text
    assert load_config(recipe(), ["train.lr=0.001"]).train.lr == pytest.approx(1e-3)  # a leading 0 of a float


def test_cross_field_problems_reported_together(recipe):
    with pytest.raises(ConfigError) as err:
        load_config(recipe(), ["model.n_heads=5", "train.lr=-1", "model.dropout=1.5"])
    msg = str(err.value)
    assert "n_heads (5)" in msg and "train.lr must be > 0" in msg and "model.dropout" in msg
    assert "\n" not in msg


def test_python_tag_is_refused_and_not_executed(recipe, tmp_path):
    marker = tmp_path / "pwned"
    evil = BASE + f"  x: !!python/object/apply:os.system ['touch {marker}']\n"
    with pytest.raises(ConfigError, match="not allowed"):
        load_config(recipe(evil))
    assert not marker.exists()


def test_duplicate_key_is_refused(recipe):
    with pytest.raises(ConfigError, match=r"r.yaml:9: duplicate key 'model.d_model'"):
        load_config(recipe(BASE.replace("  n_heads: 4\n", "  n_heads: 4\n  d_model: 64\n")))


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n", "null\n", "~\n"])
def test_an_empty_recipe_says_so(recipe, text):
    with pytest.raises(ConfigError, match=r"r.yaml: the recipe is empty"):
        load_config(recipe(text))


def test_syntax_error_and_missing_file(recipe, tmp_path):
    with pytest.raises(ConfigError, match="YAML syntax error"):
        load_config(recipe("run: [unclosed\n"))
    with pytest.raises(ConfigError, match="recipe not found"):
        load_config(tmp_path / "nope.yaml")


def test_override_shapes(recipe):
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(recipe(), ["train.lr"])
    with pytest.raises(ConfigError, match="'model' is a section"):
        load_config(recipe(), ["model=3"])
    cfg = load_config(recipe(), ["train.betas=[0.9, 0.98]", "model.n_kv_heads=2", "model.n_kv_heads=null"])
    assert cfg.train.betas == (0.9, 0.98) and cfg.model.n_kv_heads is None


def test_config_round_trips_through_dict_and_yaml(recipe, tmp_path):
    cfg = load_config(recipe(), ["train.betas=[0.9, 0.98]"])
    assert config_from_dict(config_to_dict(cfg), "ckpt") == cfg
    path = tmp_path / "resolved.yaml"
    path.write_text(config_to_yaml(cfg))
    assert load_config(path) == cfg


def test_config_is_frozen(recipe):
    cfg = load_config(recipe())
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.lr = 1.0  # type: ignore[misc]


def test_mapping_inside_a_list_is_a_type_error_not_a_traceback(recipe):
    with pytest.raises(ConfigError, match=r"r.yaml:11: train.betas expects float, got \{'a': 1\}"):
        load_config(recipe(BASE + "  betas: [{a: 1}, 0.9]\n"))
