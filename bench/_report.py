"""Shared by the benchmarks: machine description and writing a section of docs/benchmarks.md."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

import torch

DOC = Path(__file__).parents[1] / "docs" / "benchmarks.md"


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return cpu


def threads(n: int) -> str:
    """'1 thread', '2 threads'."""
    return f"{n} thread{'s' * (n != 1)}"


def machine() -> str:
    return f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, {threads(torch.get_num_threads())}"


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section between `<!-- name -->` markers in docs/benchmarks.md."""
    DOC.parent.mkdir(exist_ok=True)
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n\nEvery table here is written by the command above it.\n"
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    block = f"{start}\n{body.strip()}\n{end}"
    if start in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOC.write_text(text)


def bench_lm():
    """The benchmarks' language model: 6 layers, d_model 384, 6 heads, vocabulary 8000, RoPE, seed 0."""
    from tformer_cli.model import build_model

    torch.manual_seed(0)
    model = build_model(
        "lm",
        vocab_size=8000,
        d_model=384,
        n_heads=6,
        n_layers=6,
        d_ff=1536,
        dropout=0.0,
        norm_placement="pre",
        pos="rope",
        max_len=1024,
    )
    return model.eval()


def rss_kb(field: str) -> int:
    """A memory field of this process from /proc/self/status (VmRSS, VmHWM, RssAnon), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    raise RuntimeError(field)
