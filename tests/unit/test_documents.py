"""The documents a newcomer reads first stay references: the README fits a screen and a page, each recipe's header
says what it trains in a few lines, and every relative link in README.md and docs/ leads somewhere."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
DOCUMENTS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def header_lines(recipe: Path) -> int:
    """The comment lines before the recipe's first key."""
    count = 0
    for line in recipe.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            break
        count += line.startswith("#")
    return count


def anchors(document: Path) -> set[str]:
    """The anchors GitHub makes of a Markdown file's headings: lowercased, punctuation but - and _ dropped."""
    found = set()
    for line in document.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_the_readme_is_at_most_250_lines():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 250


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_a_recipe_header_is_at_most_12_comment_lines(recipe):
    assert 0 < header_lines(recipe) <= 12


def test_the_header_count_stops_at_the_first_key(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("# one\n# two\n\nrun:\n  # inside\n  name: x\n# after\n")
    assert header_lines(recipe) == 2


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.name)
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(document):
    broken = []
    for target in LINK.findall(document.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (document.parent / path).resolve() if path else document
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(target)
    assert broken == []
