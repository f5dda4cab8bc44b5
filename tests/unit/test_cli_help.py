"""What --help and the errors tell a newcomer: flags read as flags, each command's override example is one that
command takes, and a misspelt choice gets a "did you mean" as a misspelt key does."""

import re

import pytest
from typer.testing import CliRunner

from tformer_cli.cli import app
from tformer_cli.config import ConfigError, load_config
from tformer_cli.run.load import INFERENCE_OVERRIDES

runner = CliRunner()
COMMANDS = ["prepare", "check", "train", "eval", "bleu", "perplexity", "translate", "score", "generate", "attention"]
COMMANDS += ["average", "export", "sweep"]
RUN_COMMANDS = {"eval", "perplexity", "translate", "score", "generate", "export"}  # they read a trained run


def _help(command: str) -> str:
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("command", COMMANDS)
def test_a_flag_is_shown_without_a_value(command):
    text = _help(command)
    assert "<bool>" not in text
    assert re.search(r"--help\s+Show this message", text)


@pytest.mark.parametrize("command", sorted(RUN_COMMANDS))
def test_the_override_example_of_a_command_on_a_run_is_one_it_takes(command):
    example = re.search(r"overrides, e\.g\. (\S+)", " ".join(_help(command).split())).group(1)
    assert example.startswith(INFERENCE_OVERRIDES), example


@pytest.mark.parametrize("command", ["prepare", "check", "train"])
def test_the_override_example_of_a_recipe_command_is_a_valid_override(command):
    example = re.search(r"overrides, e\.g\. (\S+)", " ".join(_help(command).split())).group(1)
    load_config("recipes/tiny_classifier.yaml", [example])


def test_a_misspelt_choice_gets_did_you_mean():
    with pytest.raises(ConfigError, match=r"got 'sinusiodal'; did you mean 'sinusoidal'\?"):
        load_config("recipes/tiny_classifier.yaml", ["model.pos=sinusiodal"])


def test_a_choice_far_from_every_option_gets_the_options_only():
    with pytest.raises(ConfigError) as error:
        load_config("recipes/tiny_classifier.yaml", ["model.pos=zzz"])
    assert "did you mean" not in str(error.value) and "sinusoidal | learned" in str(error.value)
