"""Every shipped recipe validates."""

from pathlib import Path

import pytest

from tformer_cli.config import load_config

RECIPES = sorted((Path(__file__).parents[2] / "recipes").glob("*.yaml"))


def test_there_are_recipes():
    assert len(RECIPES) >= 2


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_validates(path):
    load_config(path)
