"""The README.md (model card) of an export: what was trained, on what data, and what it scored."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tformer_cli.config import relevant_dict
from tformer_cli.data.manifest import read_manifest
from tformer_cli.errors import DataError
from tformer_cli.export.hf_generation import control_settings
from tformer_cli.kinds import DATA_KINDS
from tformer_cli.run import Run
from tformer_cli.run.layout import DATA_MANIFEST
from tformer_cli.schema import DecodeConfig
from tformer_cli.version import __version__

_CLASSES = {
    "marian": "MarianMTModel",
    "pegasus": "PegasusForConditionalGeneration",
    "llama": "LlamaForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}


def model_card(run: Run, architecture: str, tokenizer_differs_on: list[str]) -> str:
    """Markdown: the recipe, the data's sha256s, the run's eval results, and how to use the model."""
    cls = _CLASSES[architecture]
    auto = "AutoModelForCausalLM" if run.kind == "lm" else "AutoModelForSeq2SeqLM"
    lines = [
        "---",
        "library_name: transformers",
        f"pipeline_tag: {'text-generation' if run.kind == 'lm' else 'translation'}",
        "tags: [tformer]",
        "---",
        f"# {run.config.run.name}",
        "",
        f"Trained with tformer {__version__} (`tformer train`), exported with `tformer export --format hf` as "
        f"`{cls}`: the same logits as tformer's model, within float32 rounding.",
        "",
        f"Checkpoint: `{run.checkpoint.name}`" + (f", the average of the last {run.average}" if run.average else ""),
        "",
        "## Use",
        "",
        "```python",
        f"from transformers import AutoTokenizer, {auto}",
        "tok = AutoTokenizer.from_pretrained(DIR)",
        f"model = {auto}.from_pretrained(DIR)"
        + ("  # trust_remote_code=True: tformer's search exactly (below)" if run.kind == "seq2seq" else ""),
        'ids = tok(["'
        + ("Hello world" if run.kind == "lm" else "A sentence to translate.")
        + '"], return_tensors="pt")',
        f"out = model.generate(**ids)  # {_search(run)}, from generation_config.json",
        "print(tok.batch_decode(out, skip_special_tokens=True))",
        "```",
        "",
        _NOTES[architecture],
        "",
        *(_seq2seq_search(run.config.decode, run.config.model.max_len) if run.kind == "seq2seq" else []),
        *_tokenizer_caveat(tokenizer_differs_on),
        "## Evaluation (what `tformer eval` measured for this run)",
        "",
        *_evaluations(run.run_dir),
        "",
        "## Data",
        "",
        *_data(run),
        "",
        "## Recipe",
        "",
        "The sections this model's kinds use (the checkpoint holds every key), files and folders by name.",
        "",
        "```yaml",
        yaml.safe_dump(_named(relevant_dict(run.config)), sort_keys=False).rstrip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def _search(run: Run) -> str:
    d = run.config.decode
    if run.kind == "lm":
        sampled = f"sampling at temperature {d.temperature}" if d.temperature > 0 and d.top_k != 1 else "greedy"
        samples = f", {d.samples} samples" if d.samples > 1 else ""
        return f"tformer generate's search: {sampled}{samples}, up to {d.max_new_tokens} new tokens{_controls(d)}"
    search = "greedy" if d.beam == 1 else f"beam {d.beam}, alpha {d.len_penalty}"
    return f"tformer translate's search: {search}{_controls(d)}"


def _controls(d: DecodeConfig) -> str:
    """The decoding controls the recipe sets, under generate's names (export/hf_generation.py `control_settings`)."""
    return "".join(f", {name} {value}" for name, value in control_settings(d).items())


def _seq2seq_search(d: DecodeConfig, max_len: int) -> list[str]:
    """How `generate` with the exported settings relates to `tformer translate` (export/hf_generation.py)."""
    exact = (
        "so `generate(**ids)` gives `tformer translate`'s translations"
        if d.beam == 1 or d.len_penalty == 0
        else f"but ranks the finished beams by log-probability / length ** {d.len_penalty}, where tformer divides "
        f"by ((5 + length) / 6) ** {d.len_penalty} (GNMT): no Hugging Face `length_penalty` equals it, and "
        "beam outputs can differ where hypotheses of different lengths compete (`length_penalty=0.0` equals "
        "tformer's `decode.len_penalty=0`; for outputs of about L tokens, alpha * L / (5 + L) ranks closest)"
    )
    exactly = (
        "For tformer's search exactly (its length penalty and each sentence's own length limit), load the model "
        "with `from_pretrained(DIR, trust_remote_code=True)`: `generate` is then `custom_generate/generate.py`, "
        "which searches with Hugging Face's beam search and ranks as tformer does (read it first: it is code)."
    )
    return [
        exactly,
        "",
        "`generation_config.json` holds the recipe's `decode:` search (beam, `early_stopping=True`: done once "
        f"beam hypotheses have ended, as tformer; `<pad>` and `<s>` never generated), {exact}. "
        f"tformer's output limit is per sentence, {d.max_len_a} * source length + {d.max_len_b}, at most "
        f"model.max_len ({max_len}); the file's `max_new_tokens` is that of the longest source. For one "
        f"sentence, `max_new_tokens=min(int({d.max_len_a} * ids['input_ids'].shape[1] + {d.max_len_b}), "
        f"{max_len})` is tformer's, and faster (Hugging Face's beam search works on buffers of "
        "`max_new_tokens`); a translation that reaches it can still differ (Hugging Face scores the "
        "forced `</s>` 0). tformer cuts a longer source to its first model.max_len tokens, `</s>` included: "
        "`tok(lines, truncation=True)`.",
        "",
    ]


_SEQ2SEQ = (
    "The tokenizer appends `</s>` to each source sentence, as tformer does; decoding starts from `<s>`, "
    "which is never generated."
)
_NOTES = {
    "marian": "The model dimension is permuted (the sinusoidal table's sin and cos halves are laid out as "
    "Marian lays them out), which changes no output. " + _SEQ2SEQ,
    "pegasus": "The model dimension is permuted (the sinusoidal table's sin and cos halves are laid out as "
    "Pegasus lays them out), which changes no output. " + _SEQ2SEQ,
    "llama": "The tokenizer puts `</s>` before a text: tformer trains on a stream of lines, each after the "
    "previous line's `</s>`. The input embedding holds tformer's sqrt(d_model) scale.",
    "gpt_neox": "The tokenizer puts `</s>` before a text: tformer trains on a stream of lines, each after the "
    "previous line's `</s>`. The input embedding holds tformer's sqrt(d_model) scale.",
    "gpt2": "The tokenizer puts `</s>` before a text: tformer trains on a stream of lines, each after the "
    "previous line's `</s>`. The input embedding holds tformer's sqrt(d_model) scale; positions beyond "
    "`n_positions` (the recipe's model.max_len) are not available.",
}


def _tokenizer_caveat(names: list[str]) -> list[str]:
    if not names:
        return []
    spelled = ", ".join(f"`{n}`" for n in names)
    return [
        f"Tokenizer: the text {spelled} (the names of special pieces, written out) is encoded differently from "
        "tformer's SentencePiece model, because some of its characters are not in the vocabulary; every other "
        "text gets the same ids.",
        "",
    ]


def _evaluations(run_dir: Path | None) -> list[str]:
    files = sorted(run_dir.glob("eval_*.json")) if run_dir is not None else []
    if not files:
        return ["No `tformer eval` results were found in the run directory."]
    rows = ["| file | result |", "|---|---|"]
    for path in files:
        try:
            result = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        shown = {k: v for k, v in result.items() if isinstance(v, int | float | str) and len(str(v)) < 80}
        rows.append(f"| {path.name} | " + ", ".join(f"{k}: {v}" for k, v in shown.items()) + " |")
    return rows


def _data(run: Run) -> list[str]:
    """The inputs `tformer prepare` read, by file name with their sha256, from the data manifest the run keeps
    (a run made before keeps none: the data folder's)."""
    d = run.config.data
    if DATA_KINDS[d.kind].generated:
        return [f"Generated {d.kind} data (data.{d.kind}.seed {getattr(d, d.kind).seed})."]
    kept = run.run_dir / DATA_MANIFEST if run.run_dir is not None else None
    try:
        manifest = _read_json(kept) if kept is not None and kept.is_file() else read_manifest(Path(d.dir))
    except DataError:
        manifest = None
    if manifest is None:
        return ["The data manifest was not found (not in the run, nor in its data folder); the recipe names the data."]
    rows = ["| split | file | sha256 |", "|---|---|---|"]
    for split, files in manifest.get("inputs", {}).items():
        if isinstance(files, dict):
            rows += [f"| {split} | {Path(name).name} | `{digest}` |" for name, digest in files.items()]
        else:
            rows.append(f"| {split} | {files} | |")
    rows += ["", f"Tokenizer sha256: `{run.tokenizer_fingerprint}`"]
    return rows


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


# the recipe's keys that name local files or folders: a card shows their names, not where they were on one machine
_LOCAL_PATHS = {"run": ("out_dir",), "data": ("dir", "train", "valid", "test"), "train": ("init_from",)}


def _named(tree: dict) -> dict:
    """The recipe with each local path cut to its last part (a file's name, a folder's name)."""
    shown = {section: dict(values) if isinstance(values, dict) else values for section, values in tree.items()}
    for section, keys in _LOCAL_PATHS.items():
        for key in keys:
            value = shown.get(section, {}).get(key)
            if isinstance(value, str):
                shown[section][key] = Path(value).name
            elif isinstance(value, list | tuple):
                shown[section][key] = [Path(v).name if isinstance(v, str) else v for v in value]
    return shown
