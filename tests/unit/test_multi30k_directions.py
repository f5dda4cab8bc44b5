"""recipes/multi30k_de_en.yaml is recipes/multi30k_en_de.yaml in the other direction: every setting the same but the
direction's own (the run's name, the prepared folder, which side is the source), so that a change to one recipe's
model or schedule cannot leave the other behind unsaid."""

from dataclasses import asdict
from pathlib import Path

from tformer_cli.config import load_config

RECIPES = Path(__file__).parents[2] / "recipes"
DIRECTION = {  # (English to German, German to English)
    ("run", "name"): ("multi30k_en_de", "multi30k_de_en"),
    ("data", "dir"): ("data/multi30k_en_de", "data/multi30k_de_en"),
    ("data", "src_field"): ("en", "de"),
    ("data", "tgt_field"): ("de", "en"),
    ("data", "src_lang"): ("en", "de"),
    ("data", "tgt_lang"): ("de", "en"),
}


def _settings(name: str) -> dict[tuple[str, str], object]:
    config = asdict(load_config(RECIPES / name, []))
    return {(section, key): value for section, values in config.items() for key, value in values.items()}


def test_de_en_differs_from_en_de_only_in_its_direction():
    en_de, de_en = _settings("multi30k_en_de.yaml"), _settings("multi30k_de_en.yaml")
    assert {key: (en_de[key], de_en[key]) for key in en_de if en_de[key] != de_en[key]} == DIRECTION
