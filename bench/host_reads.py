"""Where `tformer train` waits for its device: the reads of a value from the device (a host sync on a GPU) per
update, by the line of tformer_cli that reads.

    python bench/host_reads.py RECIPE [key=value ...] [--updates N]

Trains RECIPE (eager) on the meta device (tests/unit/meta_device.py: shapes and no values, so the recipe's own
model and batches cost next to nothing on any machine) for N and for 2N updates, logging and validating only at
the end, and prints the difference per update, then what the end of a run reads (its log line, validation and
checkpoint). Reads answered with stand-ins; autocast (train.precision bf16 or fp16), which has no meta device
and reads nothing, runs as fp32; the data must be prepared. Prints only; nothing is written to docs/.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "unit"))
from meta_device import META, OffTheCpu  # noqa: E402

from tformer_cli.config import load_config  # noqa: E402
from tformer_cli.train import loop  # noqa: E402


@contextmanager
def _on_meta() -> Iterator[None]:
    """`tformer train` on the meta device, whatever run.device says (as it was again after)."""
    resolve_device = loop.resolve_device
    loop.resolve_device = lambda setting: META
    try:
        yield
    finally:
        loop.resolve_device = resolve_device


def reads_of(recipe: str | None, overrides: list[str], updates: int) -> Counter[str]:
    """The reads of `tformer train RECIPE` for `updates` updates on the meta device, by line."""
    with tempfile.TemporaryDirectory() as out, _on_meta():
        config = load_config(
            recipe,
            [*overrides, f"train.max_updates={updates}", "train.log_every=1000000", "train.valid_every=1000000"]
            + [f"run.out_dir={out}", "train.compile=false"],
        )
        if config.train.precision in ("bf16", "fp16"):  # autocast has no meta device; it reads nothing itself
            config = dataclasses.replace(config, train=dataclasses.replace(config.train, precision="fp32"))
        with OffTheCpu() as reads:
            loop.train(config, Path(out) / config.run.name)
    return reads.sites


def reads_per_update(recipe: str | None, overrides: list[str], updates: int) -> tuple[dict, dict]:
    """(reads per update, reads at the end of a run), each by line: from runs of `updates` and 2 x `updates`."""
    short, long = (reads_of(recipe, overrides, n) for n in (updates, 2 * updates))
    per_update = {site: (long[site] - short[site]) / updates for site in long if long[site] != short[site]}
    at_end = {site: short[site] - updates * per_update.get(site, 0) for site in short}
    return per_update, {site: count for site, count in at_end.items() if count}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--updates", type=int, default=4)
    args = parser.parse_args()
    per_update, at_end = reads_per_update(args.recipe, args.overrides, args.updates)
    print(f"{args.recipe} {' '.join(args.overrides)}: reads of device values")
    for title, counts in (
        ("per update", per_update),
        ("at the end of a run: log line, validation, checkpoint", at_end),
    ):
        print(f"{title} ({sum(counts.values()):g} in all):")
        for site, count in sorted(counts.items(), key=lambda item: -item[1]):
            print(f"  {count:6.2f}  {site}")


if __name__ == "__main__":
    main()
