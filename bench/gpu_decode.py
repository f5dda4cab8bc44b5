"""Decoding speed on a GPU: tformer's dynamic path, its static path (fixed shapes, the step in a CUDA graph:
decoding/static.py) and Hugging Face `generate`, in one process (docs/benchmarks.md's GPU decoding table).

    python bench/gpu_decode.py                      # on a CUDA GPU: the table, also in $OUT/gpu_decode.md (OUT set)
    python bench/gpu_decode.py --run RUN --src newstest2014.en   # and a trained run: beam 4, after loading
    python bench/gpu_decode.py --smoke              # on a CPU: tiny shapes, seconds (checks the script itself)

Shapes: random weights of the WMT14 base shape (6 + 6 layers, d_model 512, 8 heads, d_ff 2048)
with a vocabulary of 37,000; 512 source sentences of 25 tokens; every system produces exactly 30 tokens
per sentence (end-of-sentence forbidden before, forced at the limit). Rows at batch 1 decode the first
16 sentences (the slow systems take seconds each there). Each cell: one warm-up pass (it captures
tformer's graphs), then the median of ROUNDS timed passes, the GPU synchronised around each. Both models
come from bench/_systems.py (as in bench/gpu_train.py): Hugging Face's is `MarianMTModel` of the same
layout (ReLU, shared tied embeddings; its own random weights: speed only), `generate` with its default
dynamic cache, and with `cache_implementation="static"` where that works. tformer's fp16 model is `cast_weights` (as
`decode.precision=fp16`).

With --run: the run loaded as `tformer translate` loads it, the source file translated with the run's
decode settings (beam 4 unless overridden) by the static path and by the dynamic one, timed after
loading, outputs compared line by line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1]))
sys.path.insert(0, str(Path(__file__).parent))
from _systems import Shape, marian, tformer  # noqa: E402

from tformer_cli.decoding.search import beam_search, greedy  # noqa: E402
from tformer_cli.decoding.settings import SearchSettings  # noqa: E402
from tformer_cli.decoding.static import static_beam_search, static_greedy  # noqa: E402
from tformer_cli.run import cast_weights  # noqa: E402

ROUNDS = 3


def shapes(smoke: bool) -> dict:
    if smoke:
        return dict(vocab=500, d_model=32, n_heads=4, n_layers=2, d_ff=64, n_sent=8, src_len=9, n_out=6, one=2)
    return dict(vocab=37000, d_model=512, n_heads=8, n_layers=6, d_ff=2048, n_sent=512, src_len=25, n_out=30, one=16)


def system_shape(s: dict) -> Shape:
    """The encoder-decoder shape of bench/_systems.py for these rows (no dropout: decoding)."""
    return Shape(s["d_model"], s["n_layers"], s["n_heads"], s["d_ff"], s["vocab"], s["n_sent"], s["src_len"],
                 s["n_out"], dropout=0.0)  # fmt: skip


def tformer_model(s: dict, dtype: torch.dtype, device: str):
    torch.manual_seed(0)
    model = tformer(system_shape(s)).eval()
    cast_weights(model, dtype)
    return model.to(device)


def hf_model(s: dict, dtype: torch.dtype, device: str):
    torch.manual_seed(0)
    model = marian(system_shape(s))
    return None if model is None else model.eval().to(device=device, dtype=dtype)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str, rounds: int) -> float:
    """Median seconds of `rounds` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(rounds):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def tformer_pass(model, src, beam: int, batch: int, n_out: int, fixed: bool):
    settings = SearchSettings(beam=beam, max_len_a=0.0, max_len_b=n_out, min_new_tokens=n_out - 1)  # n_out each

    def run():
        for i in range(0, src.size(0), batch):
            chunk = src[i : i + batch]
            if beam == 1:
                hyps = (static_greedy if fixed else greedy)(model, chunk, settings)
                assert all(len(h.tokens) == n_out for h in hyps)
            else:
                search = static_beam_search if fixed else beam_search
                results = search(model, chunk, settings)
                assert all(len(h[0].tokens) == n_out for h in results)

    return run


def hf_pass(model, src, beam: int, batch: int, n_out: int, static_cache: bool):
    options = {"early_stopping": True} if beam > 1 else {}
    if static_cache:
        options["cache_implementation"] = "static"

    @torch.inference_mode()
    def run():
        for i in range(0, src.size(0), batch):
            out = model.generate(
                src[i : i + batch],
                num_beams=beam,
                do_sample=False,
                min_new_tokens=n_out,
                max_new_tokens=n_out,
                **options,
            )
            assert out.size(1) >= n_out

    return run


ROWS = [  # (precision, beam, batch)
    ("fp16", 4, 64),
    ("fp16", 1, 64),
    ("fp16", 4, 1),
    ("fp16", 1, 1),
    ("fp32", 1, 1),
]


def speed_table(s: dict, device: str, rounds: int) -> list[str]:
    torch.manual_seed(1)
    src = torch.randint(4, s["vocab"], (s["n_sent"], s["src_len"]), device=device)
    lines = [
        "| precision | search | batch | tformer dynamic | tformer static | HF generate | HF static cache "
        "| static / dynamic | static / HF |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    models: dict[str, tuple] = {}
    for precision, beam, batch in ROWS:
        dtype = {"fp16": torch.float16, "fp32": torch.float32}[precision]
        if device == "cpu" and dtype == torch.float16:
            dtype = torch.bfloat16  # smoke mode: a CPU has no fp16 matmuls worth timing
        if precision not in models:
            models[precision] = (tformer_model(s, dtype, device), hf_model(s, dtype, device))
        ours, hf = models[precision]
        rows = src if batch > 1 else src[: s["one"]]
        tokens = rows.size(0) * s["n_out"]
        cells = {}
        for name, fixed in (("dynamic", False), ("static", True)):
            cells[name] = tokens / timed(tformer_pass(ours, rows, beam, batch, s["n_out"], fixed), device, rounds)
        for name, static_cache in (("hf", False), ("hf_static", True)):
            try:
                cells[name] = tokens / timed(hf_pass(hf, rows, beam, batch, s["n_out"], static_cache), device, rounds)
            except Exception as e:  # noqa: BLE001 (reported in the table: one system's failure is a result)
                cells[name] = None
                print(
                    f"HF {'static cache' if static_cache else 'generate'} failed: {type(e).__name__}: {e}", flush=True
                )

        def fmt(x):
            return "failed" if x is None else f"{x:,.0f}"

        hf_best = max((x for x in (cells["hf"], cells["hf_static"]) if x is not None), default=None)
        line = (
            f"| {precision} | {'greedy' if beam == 1 else f'beam {beam}'} | {batch} | {fmt(cells['dynamic'])} "
            f"| {fmt(cells['static'])} | {fmt(cells['hf'])} | {fmt(cells['hf_static'])} "
            f"| {cells['static'] / cells['dynamic']:.2f}x | "
            + (f"{cells['static'] / hf_best:.2f}x |" if hf_best else "- |")
        )
        print(line, flush=True)
        lines.append(line)
    return lines


def trained_run(run: str, src_file: str, device: str, overrides: list[str]) -> list[str]:
    from dataclasses import replace

    from tformer_cli.decoding.load import load_for_decoding
    from tformer_cli.decoding.translate import translate_lines

    loaded = load_for_decoding(Path(run), ["decode.beam=4", *overrides], device)
    lines = Path(src_file).read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    cfg = loaded.config.decode
    out, seconds = {}, {}
    for mode in ("first", "never", "always"):  # the static path twice: the first pass captures its graphs
        sync(device)
        start = time.perf_counter()
        static = "never" if mode == "never" else "always"
        out[mode] = translate_lines(loaded.model, loaded.tokenizer, lines, replace(cfg, static=static))
        sync(device)
        seconds[mode] = time.perf_counter() - start
    pairs = list(zip(out["always"], out["never"], strict=True))
    same = sum([h.tokens for h in a] == [h.tokens for h in b] for a, b in pairs)
    score_gap = max((abs(h.score - g.score) for a, b in pairs for h, g in zip(a, b, strict=True)), default=0.0)
    tokens = sum(len(hyps[0].tokens) for hyps in out["always"] if hyps)
    return [
        f"{run} on {src_file}: {len(lines):,} lines, beam {cfg.beam}, {cfg.precision}, batches of "
        f"{cfg.max_tokens:,} source tokens",
        f"- static path: {seconds['always']:.2f} s ({tokens / seconds['always']:,.0f} tokens/s; a second pass: its "
        f"graphs were captured in the first, which took {seconds['first']:.2f} s)",
        f"- dynamic path: {seconds['never']:.2f} s; static / dynamic {seconds['never'] / seconds['always']:.2f}x",
        f"- identical hypotheses (the tokens of each n-best entry): {same:,} of {len(lines):,} lines; largest score "
        f"difference {score_gap:.1e}",
    ]


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    parser.add_argument("--run", help="a trained run to translate --src with")
    parser.add_argument("--src", help="the source file for --run")
    parser.add_argument("overrides", nargs="*", help="decode.* overrides for --run (decode.precision=fp16)")
    args = parser.parse_args(argv)
    device = "cpu" if args.smoke or not torch.cuda.is_available() else "cuda"
    if device == "cpu" and not args.smoke:
        sys.exit("no GPU here: bench/gpu_decode.py --smoke checks the script on a CPU")
    s, rounds = shapes(args.smoke), 1 if args.smoke else ROUNDS
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (smoke)"
    head = [
        f"## GPU decoding ({name}, torch {torch.__version__})",
        "",
        f"`python bench/gpu_decode.py{' --smoke' if args.smoke else ''}`: target tokens/s, {s['n_sent']} sentences of "
        f"{s['src_len']} tokens, exactly {s['n_out']} output tokens each (batch 1: the first {s['one']}); "
        f"median of {rounds} after a warm-up.",
        "",
    ]
    print("\n".join(head), flush=True)
    lines = head + speed_table(s, device, rounds)
    if args.run:
        lines += ["", *trained_run(args.run, args.src, device, args.overrides)]
    report = "\n".join(lines) + "\n"
    print("\n" + report)
    if "OUT" in os.environ:  # a results folder (bench/gpu_check.sh sets it)
        (Path(os.environ["OUT"]) / "gpu_decode.md").write_text(report)
    return report


if __name__ == "__main__":
    main()
