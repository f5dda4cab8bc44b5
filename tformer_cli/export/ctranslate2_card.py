"""The README.md of a CTranslate2 export: the `translate_batch` call that gives `tformer translate`'s output.

The call is the one `tformer translate --engine ctranslate2` makes (decoding/ctranslate2.py explains
each argument), written out with the recipe's `decode:` settings, then tformer's ranking of the
hypotheses it returns. It is given as Python that runs as written (the tests run it).
"""

from __future__ import annotations

from tformer_cli.run import Run
from tformer_cli.schema import DecodeConfig

# a length penalty that changes no score (length ** 1e-30 == 1.0f) but keeps the stopping rule; the README's call
# and the engine (decoding/ctranslate2.py) both use it
RAW_SCORES = 1e-30


def ctranslate2_card(run: Run, quantization: str | None) -> str:
    """Markdown: what the folder holds and the Python that translates as `tformer translate` does.

    Args:
        run: the exported run; its `decode:` settings and model.max_len are written into the call.
        quantization: the weights' type (None: float32).
    """
    decode = run.config.decode
    approximate = (
        " (with its decoding controls, exactly only with greedy search: see below)"
        if (_controls(decode) and decode.beam > 1)
        else ""
    )
    return "\n".join(
        [
            f"# {run.config.run.name} (CTranslate2)",
            "",
            f"A tformer translation model exported with `tformer export --format ctranslate2` "
            f"({quantization or 'float32'} weights), from `{run.checkpoint.name}`. `spm.model` is its "
            "SentencePiece tokenizer; the model appends `</s>` to every source and starts the output from `<s>`.",
            "",
            "## Translate as `tformer translate` does",
            "",
            f"The recipe decodes with beam {decode.beam}, length penalty {decode.len_penalty} and output "
            f"limit {decode.max_len_a} * source length + {decode.max_len_b}, at most model.max_len "
            f"({run.config.model.max_len}) tokens{_controls_said(decode)}. This gives the lines "
            f"`tformer translate` writes{approximate}:",
            "",
            "```python",
            *snippet(decode, run.config.model.max_len),
            "```",
            "",
            *_differences(decode),
        ]
    )


def snippet(decode: DecodeConfig, max_len: int) -> list[str]:
    """Python lines defining `translate(lines) -> list[str]` for this folder (`DIR`; set it to the folder): sources
    cut to max_len tokens (`</s>` included) and outputs ended by max_len tokens, as `tformer translate` does."""

    search = [
        f"        beam_size={decode.beam},",
        f"        num_hypotheses={decode.beam},  # every finished hypothesis; tformer's ranking below",
        f"        length_penalty={RAW_SCORES},  # raw log-probabilities, and stop once beam hypotheses ended",
    ]
    if decode.beam == 1:
        search = ["        beam_size=1,", "        length_penalty=0.0,"]
    pick = (
        "    best = [r.hypotheses[0] for r in results]"
        if decode.beam == 1
        else (
            "    best = [max(zip(r.hypotheses, r.scores), key=lambda h: h[1] / ((5 + len(h[0])) / 6) ** "
            f"{decode.len_penalty})[0] for r in results]"
        )
    )
    return [
        "import ctranslate2",
        "import sentencepiece as spm",
        "",
        "sp = spm.SentencePieceProcessor(model_file=f'{DIR}/spm.model')",
        "translator = ctranslate2.Translator(DIR)",
        "",
        "",
        "def translate(lines: list[str]) -> list[str]:",
        "    real = [i for i, line in enumerate(lines) if line.strip()]  # an empty line gets an empty output",
        f"    sources = [sp.encode(lines[i], out_type=str)[: {max_len - 1}] for i in real]  # + </s>: model.max_len",
        "    if not sources:",
        "        return [''] * len(lines)",
        f"    limit = max(int({decode.max_len_a} * (len(s) + 1) + {decode.max_len_b}) for s in sources)  # + 1: </s>",
        "    results = translator.translate_batch(",
        "        sources,",
        *search,
        f"        max_decoding_length=min(limit, {max_len}),",
        *_control_lines(decode, max_len),
        "        max_input_length=0,  # sources are never truncated",
        "        suppress_sequences=[['<pad>'], ['<s>']],  # never generated",
        "        return_end_token=True,  # a hypothesis' length counts its </s>, as tformer's",
        "        return_scores=True,",
        "    )",
        pick,
        "    out = [''] * len(lines)",
        "    for i, tokens in zip(real, best):",
        "        out[i] = sp.decode([t for t in tokens if t != '</s>'])",
        "    return out",
    ]


def _controls(decode: DecodeConfig) -> list[tuple[str, str, float]]:
    """The decoding controls the recipe sets: (CTranslate2's argument, the recipe's key, the value)."""
    controls = (
        ("min_decoding_length", "decode.min_len", decode.min_len, 0),
        ("no_repeat_ngram_size", "decode.no_repeat_ngram", decode.no_repeat_ngram, 0),
        ("repetition_penalty", "decode.repetition_penalty", decode.repetition_penalty, 1.0),
    )
    return [(arg, key, value) for arg, key, value, off in controls if value != off]


def _controls_said(decode: DecodeConfig) -> str:
    return "".join(f", {key} {value}" for _, key, value in _controls(decode))


def _control_lines(decode: DecodeConfig, max_len: int) -> list[str]:
    """The call's arguments for the recipe's decoding controls (decoding/ctranslate2.py `_decode`)."""
    lines = []
    if decode.min_len > 0:  # CTranslate2 refuses a minimum above the maximum; tformer's limit wins
        lines.append(f"        min_decoding_length=min({decode.min_len}, limit, {max_len}),  # no </s> before that")
    else:
        lines.append("        min_decoding_length=0,")
    if decode.no_repeat_ngram > 0:
        lines.append(f"        no_repeat_ngram_size={decode.no_repeat_ngram},")
    if decode.repetition_penalty != 1.0:
        lines.append(f"        repetition_penalty={decode.repetition_penalty},")
    return lines


def _differences(decode: DecodeConfig) -> list[str]:
    ranking = (
        f"`length_penalty` of CTranslate2 divides by length ** alpha, tformer's by ((5 + length) / 6) ** "
        f"{decode.len_penalty} (GNMT): the call asks for raw log-probabilities and the last line ranks "
        "the hypotheses as tformer does. "
        if decode.beam > 1
        else ""
    )
    return [
        "## Where it can differ",
        "",
        ranking + "tformer's output limit is per sentence; one call has one `max_decoding_length`, the "
        "batch's largest, and tformer ends a hypothesis at its limit with `</s>` (CTranslate2 cuts it): a "
        "sentence whose translation reaches its own limit can differ (translate it alone). "
        "`suppress_sequences` takes `<pad>` and `<s>` out of the softmax, where tformer only never picks "
        "them: scores are higher by -log(1 - p(<pad>) - p(<s>)) per token, negligible for a trained model. "
        "For the n best, sort by the same key and keep the first n.",
        "",
        *_control_differences(decode),
    ]


def _control_differences(decode: DecodeConfig) -> list[str]:
    if not _controls(decode) or decode.beam == 1:
        return []
    keys = ", ".join(key for _, key, _ in _controls(decode))
    return [
        f"With beam search, {keys} can give other beams than `tformer translate`: CTranslate2 takes banned "
        "tokens out of the softmax and penalises logits, where tformer's beam search (as Hugging Face's) bans and "
        "penalises log-probabilities. With greedy search (`beam_size=1`) the tokens are tformer's; "
        "`tformer translate --engine ctranslate2` refuses these settings with beam search.",
        "",
    ]
