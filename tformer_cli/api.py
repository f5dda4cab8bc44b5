"""tformer from Python: load a trained run, then translate, generate, score and evaluate with it (docs/api.md).

    import tformer_cli as tformer

    model = tformer.load("runs/multi30k_en_de")          # a run folder (its best checkpoint) or a checkpoint file
    model.translate(["A man rides a bike."], beam=1)     # the recipe's decode settings, overridden by keyword
    tformer.evaluate_translations(hypotheses, references)  # BLEU, chrF and TER with sacreBLEU's signatures

The `tformer` commands translate, generate, score, eval, bleu and perplexity are this module's functions behind a
command line (tformer_cli/commands/): what a command prints is what these return. Errors are `TformerError`s with
the command's one-line message (`tformer_cli.errors`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tformer_cli.errors import TformerError
from tformer_cli.kinds import Command
from tformer_cli.run import Run, check_served, load_run
from tformer_cli.scoring import PairScore

__all__ = ["Model", "PairScore", "evaluate_translations", "load"]


def load(
    path: str | Path,
    *,
    device: str = "auto",
    average: int = 0,
    ensemble: Sequence[str | Path] = (),
    engine: Literal["native", "ctranslate2"] = "native",
    quantization: str | None = None,
    as_trained: bool = False,
    overrides: Sequence[str] = (),
    command: Command | None = None,
    **decode: Any,
) -> Model:
    """A trained run, ready to translate, generate, score or evaluate.

    Args:
        path: a run folder (its best checkpoint, else its latest) or a checkpoint file.
        device: auto (CUDA where there is one), cpu or cuda; a `run.device=` among `overrides` takes its place.
        average: > 0: the mean of the run's last N step checkpoints' weights.
        ensemble: more runs or checkpoints that translate with this one, as one model (the mean of their
            probabilities at each step); this run's decode settings apply.
        engine: native (tformer's search) or ctranslate2 (the same search in CTranslate2, on an export built into
            RUN/ctranslate2/ on first use; the `export` extra); ctranslate2 translates only.
        quantization: ctranslate2's weights: int8, int8_float16 or float16 (None: float32).
        as_trained: keep the weights as trained (no cast to decode.precision): `validate` scores them so (decode
            settings are then refused: validation takes none).
        overrides: `decode.key=value`, `run.threads=N` and `run.device=NAME` strings, as the command line takes them.
        command: refuse a run that this command does not serve at once (the commands' own order of checks);
            each method checks its own use anyway.
        **decode: decode settings by keyword (`beam=1`, `precision="bf16"`): the recipe's, overridden.

    Raises:
        CheckpointError: no usable checkpoint, or a tokenizer other than the one the model was trained with.
        ConfigError: an unknown or invalid setting (with a "did you mean").
        TformerError: an option that does not fit the others (an `ensemble` with `average`, `as_trained` or the
            ctranslate2 engine), or a run that `command` does not serve.
    """
    from tformer_cli.decoding.load import load_ensemble, load_for_decoding

    check_engine(engine, quantization)
    if ensemble and as_trained:
        raise TformerError("--ensemble translates --src with several models; a run's own split is scored with its own")
    if ensemble and (engine != "native" or average):
        raise TformerError(f"--ensemble: the native engine translates an ensemble, {ENSEMBLE_AS_GIVEN}")
    settings = [*overrides, *(f"decode.{key}={json.dumps(value)}" for key, value in decode.items())]
    if as_trained and (searched := [item for item in settings if item.startswith("decode.")]):
        raise TformerError(
            f"{searched[0]}: the run's own split is scored as training scored it, with no decode setting"
        )
    if as_trained:  # the weights as trained, as training validated them
        return Model(load_run(Path(path), settings, device=device, average=average, cast=False))
    if engine == "ctranslate2":  # fp32 weights on the CPU, to export them; the engine on the device asked for
        from tformer_cli.decoding import ctranslate2

        run = load_run(Path(path), settings, device="cpu", average=average, cast=False)
        asked = run.config.run.device if any(item.startswith("run.device=") for item in overrides) else device
        run.model.cpu()  # a run.device override placed it: the export reads the CPU weights
        check_served(run, "translate")
        translator = ctranslate2.load_engine(run, quantization, asked, _to_stderr)
        return Model(run, translator, ctranslate2.translate_lines)
    if ensemble:
        run = load_ensemble([Path(path), *map(Path, ensemble)], settings, device, command or "translate")
    else:
        run = load_for_decoding(Path(path), settings, device, average, command)
    return Model(run)


ENSEMBLE_AS_GIVEN = (  # what --ensemble does with --average, to eval and translate alike
    "of the weights as given (to ensemble averaged weights, write them with `tformer average` and give the files)"
)


def check_engine(engine: str, quantization: str | None) -> None:
    """Refuse an engine other than native and ctranslate2, and a quantization for the native one.

    Raises:
        TformerError: naming the option.
    """
    if engine not in ("native", "ctranslate2"):
        raise TformerError(f"--engine {engine}: choose native or ctranslate2")
    if quantization is not None and engine != "ctranslate2":
        raise TformerError("--quantization applies to --engine ctranslate2 (the native engine takes decode.precision)")


@dataclass(frozen=True)
class Model:
    """A loaded run (`load`): its model, recipe and tokenizer (`run`), and what it can do.

    Each method takes decode settings by keyword (`beam=4`, `len_penalty=1.0`, `temperature=0.8`), over the
    recipe's; the precision is chosen when loading (`load(..., precision="bf16")`).
    """

    run: Run
    engine: Any = None  # what translates: the run's model (None), or a CTranslate2 translator
    translate_with: Callable[..., Any] | None = None  # the engine's translate_lines (None: tformer's)

    @property
    def kind(self) -> str:
        """model.kind: seq2seq, lm, lstm or classifier."""
        return self.run.kind

    def translate(self, lines: Iterable[str], **decode: Any) -> list[str]:
        """The translation of each line (detokenized text), with the run's decode settings over which `decode`.

        decode.nbest N > 1 gives N lines per input, `index<TAB>score<TAB>text` (the command's output).
        """
        return list(self.translate_iter(lines, **decode))

    def translate_iter(
        self,
        lines: Iterable[str],
        *,
        interactive: bool = False,
        on_done: Callable[[int], None] | None = None,
        **decode: Any,
    ) -> Iterator[str]:
        """`translate`, yielding each output line as it is ready.

        Args:
            interactive: translate each line as soon as it is read (stdin); else all together, in batches.
            on_done: told after each batch how many more lines are translated (progress).
        """
        from tformer_cli.decoding.translate import translate_stream

        check_served(self.run, "translate")
        run = self._with(decode)
        engine = self.engine if self.engine is not None else run.model
        assert run.tokenizer is not None  # a run that translates (check_served) has its tokenizer
        yield from translate_stream(
            engine,
            run.tokenizer,
            lines,
            run.config.decode,
            interactive,
            self.translate_with,
            run.config.model.max_len,  # longer lines are cut, with a warning
            on_done=on_done,
        )

    def generate(self, prompt: str = "", *, on_text: Callable[[str], None] | None = None, **decode: Any) -> str:
        """The prompt and its continuation (decode.samples N > 1: N of them, separated by a line of dashes).

        Args:
            on_text: given the prompt, then each new piece of text as it is produced (the command prints them).
        """
        from tformer_cli.decoding.stream import stream_generation

        check_served(self.run, "generate")
        run = self._with(decode)
        write = on_text or (lambda piece: None)
        assert run.tokenizer is not None  # a run that generates (check_served) has its tokenizer
        return stream_generation(run.model, run.tokenizer, prompt, run.config.decode, write, run.config.model.max_len)

    def score(
        self,
        sources: Iterable[str],
        references: Iterable[str],
        *,
        names: tuple[str | Path, str | Path] = ("sources", "references"),
    ) -> Iterator[PairScore]:
        """log p(reference | source) of each pair, with the tokens scored (teacher forcing, fp32 sums).

        Args:
            names: what the errors call the two inputs (their files).
        """
        from tformer_cli.scoring import score_pairs

        check_served(self.run, "score")
        yield from score_pairs(self.run, sources, references, names=(Path(names[0]), Path(names[1])))

    def evaluate(
        self,
        sources: Sequence[str] | str | Path,
        references: Sequence[str] | str | Path,
        *,
        test_set: str = "unnamed",
        **decode: Any,
    ) -> dict[str, Any]:
        """Translate `sources` and score them against `references` (lists of lines, or files): BLEU, chrF and TER
        with their signatures, and the decode settings. In a run folder the scores and the translations are saved
        beside it (`eval_<test set>_<checkpoint>_<search>.json` and .hyp), as `tformer eval` saves them."""
        from tformer_cli.evaluate import translate_and_score

        check_served(self.run, "eval --src")
        inputs = tuple(Path(x) for x in (sources, references) if isinstance(x, (str, Path)))
        inputs += self.run.ensemble
        names = (_name(sources, "the sources"), _name(references, "the references"))
        return translate_and_score(self._with(decode), _lines(sources), _lines(references), test_set, inputs, names)

    def perplexity(
        self, text: str | Path, *, window: int = 0, stride: int = 0, first_tokens: int = 0
    ) -> dict[str, Any]:
        """A language model's perplexity per token and per word, and bits per byte, of the text file `text`.

        Args:
            window: tokens per window (0: data.block_size, the length it trained on).
            stride: 0: non-overlapping blocks; else windows slide by `stride`, each scoring its last `stride` tokens.
            first_tokens: score only the first N tokens of the text (0: all).
        """
        from tformer_cli.evaluate import score_text

        check_served(self.run, "perplexity")
        return score_text(self.run, Path(text), _lines(text), stride, window, first_tokens)

    def validate(self, split: str = "valid") -> dict[str, Any]:
        """The run's own validation split scored as training scored it (load with `as_trained=True`)."""
        from tformer_cli.evaluate import evaluate_checkpoint

        return evaluate_checkpoint(self.run, split)

    def _with(self, decode: dict[str, Any]) -> Run:
        """The run with `decode` laid over its decode settings (checked as the recipe's are)."""
        if not decode:
            return self.run
        from tformer_cli.config import config_from_dict, config_to_dict

        if "precision" in decode:
            raise TformerError("decode precision is chosen when loading: tformer.load(path, precision=...)")
        overrides = [f"decode.{key}={json.dumps(value)}" for key, value in decode.items()]
        config = config_from_dict(config_to_dict(self.run.config), str(self.run.checkpoint), overrides, ("decode.",))
        return dataclasses.replace(self.run, config=config)


def evaluate_translations(
    hypotheses: Sequence[str] | str | Path, references: Sequence[str] | str | Path, test_set: str = "unnamed"
) -> dict[str, Any]:
    """sacreBLEU's BLEU, chrF and TER of detokenized hypotheses against raw references (lists of lines, or files),
    each with its signature; `reference_looks_tokenized` warns of a Moses-tokenized reference.

    Raises:
        DataError: line counts that differ, no lines, or a known test set (`newstest2014-full`) of another size.
    """
    from tformer_cli.evaluate import evaluate_translation

    names = (_name(hypotheses, "the hypotheses"), _name(references, "the references"))
    return evaluate_translation(_lines(hypotheses), _lines(references), test_set, names)


def _name(given: Sequence[str] | str | Path, otherwise: str) -> str:
    """A file's name as given, for errors; `otherwise` for a list of lines."""
    return str(given) if isinstance(given, (str, Path)) else otherwise


def _lines(given: Sequence[str] | str | Path) -> list[str]:
    """A list of lines as given, or the lines of a file (UTF-8, read strictly: a bad byte names its line)."""
    if isinstance(given, (str, Path)):
        from tformer_cli.data.text import read_lines

        return list(read_lines(Path(given)))
    return list(given)


def _to_stderr(line: str) -> None:
    import sys

    print(line, file=sys.stderr)
