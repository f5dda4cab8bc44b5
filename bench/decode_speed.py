"""Decoding speed: tformer (KV cache) vs a plain loop without cache vs Hugging Face `generate` vs CTranslate2.

    python bench/decode_speed.py          # writes its section of docs/benchmarks.md

Translation: a randomly initialised model of the WMT14 base shape (6+6 layers, d_model 512, 8 heads,
d_ff 2048) with a vocabulary of 8000; 100 source sentences of 25 tokens; every system produces exactly
N_OUT tokens per sentence (end-of-sentence forbidden before, forced at the limit), beam 4 and greedy,
batched (32 sentences) and one at a time. Language model: 6 layers, d_model 384, 6 heads, vocabulary
8000, 512 new tokens at batch 1 with and without the cache, and the time per token as the length grows.

tformer's model is prepared as `tformer translate` prepares it (`cast_weights` for
`decode.precision=bf16`, then `pack_linears`, as in `load_for_decoding`); Hugging Face's bf16 model
is `.to(torch.bfloat16)`, as `torch_dtype=torch.bfloat16` gives. CTranslate2's model is the same
tformer model exported as `tformer export --format ctranslate2` exports it (fp32, and int8 weights), run
with the settings of `tformer translate --engine ctranslate2` (no source EOS appended here, so that
every system reads the same 25 tokens). Batched rows: the median of ROUNDS interleaved rounds.
"""

from __future__ import annotations

import copy
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _report import bench_lm, machine, write_section  # noqa: E402

from tformer_cli.decoding.packed import pack_linears  # noqa: E402
from tformer_cli.decoding.search import beam_search, greedy  # noqa: E402
from tformer_cli.decoding.settings import SearchSettings  # noqa: E402
from tformer_cli.model import build_model  # noqa: E402
from tformer_cli.run import cast_weights  # noqa: E402
from tformer_cli.schema import ModelConfig  # noqa: E402

N_SENT, SRC_LEN, N_OUT, VOCAB = 100, 25, 30, 8000
PIECES = ["<pad>", "<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(4, VOCAB)]  # CTranslate2 reads pieces
ONE_AT_A_TIME = 20  # sentences timed one by one (and with the plain loop), to bound the run time
ROUNDS = 3  # batched configurations: median of this many interleaved rounds


def seq2seq_model(dtype: torch.dtype = torch.float32):
    torch.manual_seed(0)
    model = build_model(
        "seq2seq",
        vocab_size=VOCAB,
        d_model=512,
        n_heads=8,
        n_layers=6,
        d_ff=2048,
        dropout=0.0,
        share_all_embeddings=True,
    ).eval()
    cast_weights(model, dtype)  # as load_run does for `tformer translate`
    pack_linears(model)
    return model


def run_tformer(model, src: torch.Tensor, beam: int, batch: int, cache: bool) -> float:
    # N_OUT tokens each: EOS not before N_OUT - 1 new tokens, and the N_OUT-th is the limit's EOS
    settings = SearchSettings(beam=beam, max_len_a=0.0, max_len_b=N_OUT, min_new_tokens=N_OUT - 1, use_cache=cache)
    start = time.perf_counter()
    for i in range(0, src.size(0), batch):
        chunk = src[i : i + batch]
        if beam == 1:
            hyps = greedy(model, chunk, settings)
            assert all(len(h.tokens) == N_OUT for h in hyps)
        else:
            results = beam_search(model, chunk, settings)
            assert all(len(h[0].tokens) == N_OUT for h in results)
    return time.perf_counter() - start


def ct2_translators() -> dict[bool, object]:
    """CTranslate2 translators of the fp32 model, keyed by int8 (False: fp32 weights); {} without the package."""
    try:
        import ctranslate2
    except ImportError:
        return {}
    from tformer_cli.export.ctranslate2 import build_spec, write_model

    torch.manual_seed(0)  # the tformer model above, before casting and packing
    model = build_model(
        "seq2seq",
        vocab_size=VOCAB,
        d_model=512,
        n_heads=8,
        n_layers=6,
        d_ff=2048,
        dropout=0.0,
        share_all_embeddings=True,
    ).eval()
    cfg = ModelConfig(d_model=512, n_heads=8, n_layers=6, d_ff=2048, dropout=0.0, share_all_embeddings=True)
    folder = Path(tempfile.mkdtemp(prefix="ct2_bench."))
    translators = {}
    for int8 in (False, True):
        spec = build_spec(model, cfg, PIECES)
        spec.config.add_source_eos = False  # the sources below are the same 25 tokens every system reads
        (folder / str(int8)).mkdir()
        write_model(spec, folder / str(int8), "int8" if int8 else None)
        translators[int8] = ctranslate2.Translator(
            str(folder / str(int8)), device="cpu", intra_threads=torch.get_num_threads()
        )
    shutil.rmtree(folder)  # loaded: the files are no longer needed
    return translators


def run_ct2(translator, src: torch.Tensor, beam: int, batch: int) -> float:
    from tformer_cli.decoding.ctranslate2 import BOS, PAD, RAW_SCORES

    sources = [[PIECES[i] for i in row] for row in src.tolist()]
    start = time.perf_counter()
    for i in range(0, len(sources), batch):
        results = translator.translate_batch(
            sources[i : i + batch],
            beam_size=beam,
            length_penalty=RAW_SCORES if beam > 1 else 0.0,
            min_decoding_length=N_OUT,
            max_decoding_length=N_OUT,
            suppress_sequences=[[PAD], [BOS]],
            return_scores=True,
        )
        assert all(len(r.hypotheses[0]) == N_OUT for r in results)
    return time.perf_counter() - start


def hf_model():
    try:
        from transformers import MarianConfig, MarianMTModel
    except ImportError:
        return None
    torch.manual_seed(0)
    cfg = MarianConfig(
        vocab_size=VOCAB,
        d_model=512,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
        pad_token_id=0,
        eos_token_id=3,
        decoder_start_token_id=2,
        max_position_embeddings=512,
    )
    return MarianMTModel(cfg).eval()


@torch.inference_mode()
def run_hf(model, src: torch.Tensor, beam: int, batch: int) -> float:
    start = time.perf_counter()
    for i in range(0, src.size(0), batch):
        beam_options = {"early_stopping": True} if beam > 1 else {}  # greedy has no such option (and warns)
        out = model.generate(
            src[i : i + batch],
            num_beams=beam,
            do_sample=False,
            min_new_tokens=N_OUT,
            max_new_tokens=N_OUT,
            **beam_options,
        )
        assert out.size(1) >= N_OUT
    return time.perf_counter() - start


def lm_rows() -> tuple[str, list[str]]:
    from tformer_cli.decoding.search import generate

    lm = bench_lm()
    pack_linears(lm)  # as load_for_decoding does for `tformer generate`
    lm_bf16 = bench_lm()
    cast_weights(lm_bf16, torch.bfloat16)  # `tformer generate ... decode.precision=bf16`
    pack_linears(lm_bf16)
    prompt = torch.randint(4, VOCAB, (1, 8))
    runs: dict[bool, list[tuple[float, list[float]]]] = {False: [], True: []}  # bf16 -> (tokens/s, marks)
    for model in (lm, lm_bf16):
        generate(model, prompt, SearchSettings(max_new_tokens=16))  # warm-up (the first call packs the weights)
    for _ in range(ROUNDS):  # interleaved, median of ROUNDS
        for bf16, model in ((False, lm), (True, lm_bf16)):
            marks: list[float] = []
            start = time.perf_counter()
            generate(
                model,
                prompt,
                SearchSettings(max_new_tokens=512),
                on_token=lambda _, marks=marks: marks.append(time.perf_counter()),
            )
            runs[bf16].append((512 / (time.perf_counter() - start), marks))
    (cached, marks), (cached_bf16, _) = (sorted(runs[bf16])[ROUNDS // 2] for bf16 in (False, True))
    start = time.perf_counter()
    generate(lm, prompt, SearchSettings(max_new_tokens=128, use_cache=False))
    uncached = 128 / (time.perf_counter() - start)
    tokens = torch.randint(4, VOCAB, (1, 520))
    per_token = []
    for n in (128, 256, 384, 512):
        with torch.inference_mode():  # without the cache, token n costs one pass over the whole prefix
            lm(tokens[:, : n + 7])
            start = time.perf_counter()
            for _ in range(3):
                lm(tokens[:, : n + 7])
            recompute = (time.perf_counter() - start) / 3
        per_token.append(f"| {n} | {(marks[n - 1] - marks[n - 65]) / 64 * 1e3:.1f} | {recompute * 1e3:.1f} |")
    summary = (
        f"LM, batch 1, greedy (cached rows: median of {ROUNDS} interleaved runs): with the cache "
        f"**{cached:.0f} new tokens/s** over 512 tokens; without it "
        f"{uncached:.0f} tokens/s over only 128 tokens (it slows as the prefix grows): "
        f"**{cached / uncached:.1f}x**. With bf16 weights and the cache: {cached_bf16:.0f} new tokens/s."
    )
    return summary, per_token


CT2 = "CTranslate2"


def main() -> None:
    models = {False: seq2seq_model(), True: seq2seq_model(torch.bfloat16)}  # keyed by bf16
    torch.manual_seed(1)
    src = torch.randint(4, VOCAB, (N_SENT, SRC_LEN))
    hf = hf_model()
    hf_models = {} if hf is None else {False: hf, True: copy.deepcopy(hf).to(torch.bfloat16)}
    ct2 = ct2_translators()
    rows, results = [], {}
    configs = [  # (system, beam, batch, cache (None: Hugging Face or CTranslate2), sentences, bf16 / int8)
        ("tformer", 4, 32, True, N_SENT, False),
        ("tformer", 1, 32, True, N_SENT, False),
        ("tformer", 4, 32, True, N_SENT, True),
        ("tformer", 1, 32, True, N_SENT, True),
        ("tformer", 4, 1, True, ONE_AT_A_TIME, False),
        ("tformer", 1, 1, True, ONE_AT_A_TIME, False),
        ("plain loop, no cache", 4, 32, False, ONE_AT_A_TIME * 2, False),
        ("plain loop, no cache", 1, 32, False, ONE_AT_A_TIME * 2, False),
    ]
    if hf is not None:
        configs += [
            ("Hugging Face generate", beam, 32, None, N_SENT, bf16) for bf16 in (False, True) for beam in (4, 1)
        ]
    if ct2:
        configs += [(CT2, beam, 32, None, N_SENT, int8) for int8 in (False, True) for beam in (4, 1)]
    for bf16 in (False, True):  # warm-up
        run_tformer(models[bf16], src[:2], 4, 2, True)
        if hf is not None:
            run_hf(hf_models[bf16], src[:2], 4, 2)
        if ct2:
            run_ct2(ct2[bf16], src[:2], 4, 2)
    timings: dict[tuple, list[float]] = {}
    for round_ in range(ROUNDS):
        for config in configs:
            name, beam, batch, cache, n, bf16 = config
            if round_ > 0 and (batch == 1 or cache is False):
                continue  # the slow one-at-a-time and no-cache rows run once
            if name == CT2:
                seconds = run_ct2(ct2[bf16], src[:n], beam, batch)
            elif cache is None:
                seconds = run_hf(hf_models[bf16], src[:n], beam, batch)
            else:
                seconds = run_tformer(models[bf16], src[:n], beam, batch, cache)
            timings.setdefault(config, []).append(seconds)
            print(
                f"round {round_ + 1}: {name} beam {beam} batch {batch} bf16 {bf16}: {n * N_OUT / seconds:,.0f} tokens/s"
            )
    for config in configs:
        name, beam, batch, cache, n, bf16 = config
        seconds = statistics.median(timings[config])
        results[(name, beam, batch, bf16)] = n * N_OUT / seconds
        precision = ("int8 weights" if name == CT2 else "bf16 weights") if bf16 else "fp32"
        rows.append(
            f"| {name} | {precision} | {beam} | {batch} | {n} | {n / seconds:.2f} | {n * N_OUT / seconds:,.0f} |"
        )
    lm_summary, per_token = lm_rows()
    ct2_note = ""
    if ct2:
        import ctranslate2

        ct2_note = (
            f" CTranslate2 {ctranslate2.__version__}, {torch.get_num_threads()} threads: the tformer model "
            "exported with `tformer export --format ctranslate2` (int8 weights: `--quantization int8`), "
            "decoded with `tformer translate --engine ctranslate2`'s settings (with which its translations of a "
            "trained model are tformer's, token for token: tests/integration/test_ctranslate2_cli.py)."
        )
    ratios = ""
    if hf is not None:
        hf_name = "Hugging Face generate"
        parts = []
        for bf16 in (False, True):
            beam_ratio = results[("tformer", 4, 32, bf16)] / results[(hf_name, 4, 32, bf16)]
            greedy_ratio = results[("tformer", 1, 32, bf16)] / results[(hf_name, 1, 32, bf16)]
            parts.append(
                f"{'bf16' if bf16 else 'fp32'} vs {'bf16' if bf16 else 'fp32'}: beam 4 **{beam_ratio:.2f}x**, "
                f"greedy **{greedy_ratio:.2f}x**"
            )
        ratios = "\ntformer / Hugging Face, batched, same precision: " + "; ".join(parts) + ".\n"
    if ct2:
        parts = []
        for bf16, int8 in ((False, False), (False, True), (True, True)):
            beam_ratio = results[("tformer", 4, 32, bf16)] / results[(CT2, 4, 32, int8)]
            greedy_ratio = results[("tformer", 1, 32, bf16)] / results[(CT2, 1, 32, int8)]
            parts.append(
                f"tformer {'bf16' if bf16 else 'fp32'} vs CTranslate2 {'int8' if int8 else 'fp32'}: "
                f"beam 4 **{beam_ratio:.2f}x**, greedy **{greedy_ratio:.2f}x**"
            )
        ratios += "\ntformer / CTranslate2, batched: " + "; ".join(parts) + ".\n"
    body = f"""## Decoding speed (`bench/decode_speed.py`)

```bash
python bench/decode_speed.py
```

Machine: {machine()}.

WMT14-base shape (6+6 layers, d_model 512, 8 heads, d_ff 2048, vocabulary 8000), random weights, source
sentences of {SRC_LEN} tokens, exactly {N_OUT} output tokens per sentence for every system.

Batched rows: median of {ROUNDS} interleaved rounds; one-at-a-time and no-cache rows: one run.{ct2_note}

| system | precision | beam | batch | sentences | sentences/s | tokens/s |
|---|---|---:|---:|---:|---:|---:|
{chr(10).join(rows)}
{ratios}
{lm_summary} Time per token as the text grows (fp32; the median run): with the cache, averaged over the
64 tokens before each length (the growth is the attention reading more cached keys); without it, one pass over the
prefix (mean of 3):

| tokens generated | ms per token, cache | ms per token, no cache |
|---:|---:|---:|
{chr(10).join(per_token)}
"""
    print(body)
    write_section("decode", body)


if __name__ == "__main__":
    main()
