"""Every number a user can type has a bound the machine can serve.

A typo (an extra zero, 1e20, a 20-digit integer) is refused in one line naming the key, before anything forks,
allocates or loops: `data.workers=99999999999999999999` used to fork until the process table was full.
"""

import pytest
from test_config_ranges import assert_names, numeric_fields, overrides

from tformer_cli.config import load_config
from tformer_cli.errors import ConfigError

HUGE = ["99999999999999999999", "100000000000000000000", "18446744073709551616"]  # past 64 bits, 1e20, 2^64
LARGE = ["9223372036854775807", "1000000000000000000"]  # 2^63 - 1 and 1e18: 64-bit integers, past every bound


@pytest.mark.parametrize("key", sorted(k for k, kind in numeric_fields().items() if kind == "int"))
def test_every_integer_key_has_an_upper_bound(key):
    for value in LARGE + HUGE:
        with pytest.raises(ConfigError) as err:
            load_config(None, [f"{key}={value}"])
        message = str(err.value)
        assert "\n" not in message
        if value in LARGE:
            problem = assert_names(message, key, value)
            assert "in [" in problem or "in (" in problem, problem  # a range with both ends
        else:  # past 64 bits, the reader refuses the number before its range is asked
            assert f": {key} " in message and message.endswith(f", got {value}"), message


@pytest.mark.parametrize("key", ["decode.max_len_a", "train.max_minutes"])
def test_floats_that_make_a_length_or_a_time_refuse_1e20(key):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides(key, "1e20"))
    assert_names(str(err.value), key, "1e+20")


def test_a_recipe_file_names_the_key_and_its_line(tmp_path):
    recipe = tmp_path / "r.yaml"
    for value, problem in (
        ("99999999999999999999", "r.yaml:2: data.workers must be a 64-bit integer"),
        ("9223372036854775807", "data.workers must be in [0, 1024], got 9223372036854775807"),
    ):
        recipe.write_text(f"data:\n  workers: {value}\n")
        with pytest.raises(ConfigError) as err:
            load_config(recipe)
        message = str(err.value)
        assert problem in message and "\n" not in message


def test_generated_data_must_fit_in_memory():
    pattern = ["data.kind=pattern", "model.kind=classifier"]
    with pytest.raises(ConfigError, match=r"data.pattern.n_examples x data.pattern.seq_len must be <= 1_073_741_824"):
        load_config(None, [*pattern, "data.pattern.n_examples=100000000", "data.pattern.seq_len=1000"])
    sessions = ["data.kind=sessions", "model.kind=lm"]
    with pytest.raises(ConfigError, match=r"data.sessions.n_sessions x data.sessions.session_len must be <="):
        load_config(None, [*sessions, "data.sessions.n_sessions=100000000", "data.sessions.session_len=1000"])
    load_config(None, [*sessions, "data.sessions.n_sessions=1000000", "data.sessions.session_len=1000"])


def test_a_sweep_grid_past_a_thousand_points_is_refused_with_its_size_before_it_expands():
    from pathlib import Path

    from tformer_cli.sweep import plan

    tiny = Path(__file__).parents[2] / "recipes" / "tiny_classifier.yaml"
    values = lambda n: ",".join(str(i) for i in range(1, n + 1))  # noqa: E731
    grid = [f"train.epochs={values(7)}", f"train.log_every={values(11)}", f"train.keep_last={values(13)}"]
    with pytest.raises(ConfigError, match=r"^the sweep has 1,001 points, more than 1,000: "):
        plan(tiny, grid)  # 7 x 11 x 13
    with pytest.raises(ConfigError, match=r"^the sweep has 1,001 points"):
        plan(tiny, [f"train.epochs={values(1001)}"], ablation=True)
    assert len(plan(tiny, ["train.epochs=1,2", "train.log_every=1,2"]).points) == 4


def test_a_larger_grid_trains_when_the_user_raises_max_points():
    from pathlib import Path

    from tformer_cli.sweep import plan

    tiny = Path(__file__).parents[2] / "recipes" / "tiny_classifier.yaml"
    grid = [f"train.epochs={','.join(str(i) for i in range(1, 1002))}"]
    with pytest.raises(ConfigError, match=r"give --max-points 1001 to train them all"):
        plan(tiny, grid)
    assert len(plan(tiny, grid, max_points=1001).points) == 1001


def test_a_hundred_thousand_values_are_counted_at_once_not_compared_pairwise():
    """The duplicate check counts (linear); comparing each value with every other took minutes at 10^5 values."""
    import time
    from pathlib import Path

    from tformer_cli.sweep import plan

    tiny = Path(__file__).parents[2] / "recipes" / "tiny_classifier.yaml"
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"^the sweep has 100,000 points"):
        plan(tiny, [f"train.epochs={','.join(str(i) for i in range(1, 100_001))}"])
    assert time.perf_counter() - start < 5
