"""Same behaviour, measured: an earlier commit and this working tree train and decode bit for bit alike.

    python bench/same_behaviour.py --before HEAD [--out DIR]              # a commit against the working tree
    python bench/same_behaviour.py --save DIR [--commit C | --tree PATH]  # one side (default: the working tree)
    python bench/same_behaviour.py --compare DIR1 DIR2                    # two saved sides (a before-state saved once)
    ... --rename model.out_proj.weight=model.lm_head.weight               # a checkpoint value renamed, none changed

For a restructuring (code moved, renamed, merged) that must change nothing. Each side runs in one fresh process
(PYTHONPATH = that side's code, `tformer_cli` asserted to come from it; its own recipes/) that writes tiny corpora and
runs the CLI in-process (`python -m tformer_cli`'s entry point, as a user would call it) on one thread, fp32,
run.deterministic=true:
- classifier: recipes/tiny_classifier.yaml, 24 updates across an epoch's end, validation every 8.
- dropout: the same with model.dropout, attn_dropout and activation_dropout 0.1 (the RNG's path).
- update_freq_patience: train.update_freq=2, train.patience=2 (validation loss every 4 updates) at a learning rate
  that stalls: it must stop before its 60 updates (it stops at 28).
- resume: dropout 0.1, a constant schedule; 24 updates straight, and 12 then the same command with 24 in a new
  process (a resume mid-epoch); the resumed run must equal the straight one on each side (metrics, model,
  optimizer, RNG states and position), and each must equal the other side's.
- translation_bleu: recipes/wmt14_base.yaml made tiny (prepare: joint BPE of 60 on 360 made-up pairs; dropout 0.1,
  6 epochs, greedy BLEU on 20 validation lines picking best.pt), then `tformer translate` of its 40 validation
  lines, beam 4 and greedy, on the dynamic path and on the fixed-shape one (decode.static=always).
- lm: recipes/wikitext2_lm.yaml made tiny (prepare: unigram of 40), then `tformer generate` greedy and sampled.
- lstm_lm: recipes/wikitext2_lstm.yaml made tiny on the same prepared data, then `tformer generate` greedy.
- decode_outputs: bench/decode_outputs.py (this tree's script, run on each side's code): 52 search configurations.
What is compared, per file: metrics.jsonl record by record and every other JSON file, without wall-clock fields
(time, elapsed, eta, seconds, *_per_s) and, in checkpoints/index.json, the checkpoints' sha256 (they hold the
seconds trained); every tensor of every checkpoint (torch.equal: model, optimizer, RNG states) and every other value
in it (config, position, metrics; not position.seconds); config.yaml, the prepared data and the decoded outputs
byte for byte; the set of files. train.log, curves.png and .lock are not compared (times, a picture).
With --rename OLD=NEW (repeatable), a checkpoint value named OLD on the first side (a name as the differences print it)
is compared with the one named NEW on the second, and each scenario's line says in how many checkpoint files.
Prints one line per scenario, `same` or the first difference (the metrics record and key, the tensor and its
largest absolute difference), and exits 1 when anything differs or a side failed. Speed is bench/cpu_ab.py's
(`--speed` runs it after a `--before` comparison).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# scenario -> the files and folders of a side's result folder it owns
SCENARIOS: dict[str, list[str]] = {
    "classifier": ["runs/classifier"],
    "dropout": ["runs/dropout"],
    "update_freq_patience": ["runs/patience"],
    "resume": ["runs/resume_straight", "runs/resume_resumed"],
    "translation_bleu": [
        "data/mt", "runs/translation", "outputs/translation_beam.txt", "outputs/translation_greedy.txt",
        "outputs/translation_beam_static.txt", "outputs/translation_greedy_static.txt",
    ],
    "lm": ["data/lm", "runs/lm", "outputs/lm_greedy.txt", "outputs/lm_sampled.txt"],
    "lstm_lm": ["runs/lstm", "outputs/lstm_greedy.txt"],
    "decode_outputs": ["decode_outputs.json"],
}  # fmt: skip
# fields that measure the clock, not the computation
VOLATILE = re.compile(r"^(time|elapsed|eta|seconds|wall|.*_per_s|.*_seconds|.*_time)$")
IGNORED = {"train.log", "curves.png", ".lock"}
RESUME_N = 24

# --------------------------------------------------------------------------- one side: run the scenarios

COMMON = ["run.threads=1", "run.deterministic=true", "train.precision=fp32"]
CLASSIFIER = ["recipes/tiny_classifier.yaml", *COMMON, "run.out_dir=runs", "train.log_every=4"]
WORDS = "the house cat dog is red blue green small big a on in with and of to we you they".split()
GERMAN = "das haus katze hund ist rot blau gruen klein gross ein auf in mit und von zu wir ihr sie".split()
TINY = ["model.d_model=32", "model.n_heads=4", "model.n_layers=1", "model.d_ff=64"]


def _cli(args: list[str], log: Path) -> None:
    """`python -m tformer_cli ARGS` in this process, its stdout and stderr (file descriptors 1 and 2) into `log`."""
    import runpy

    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    code: object = 0
    with open(log, "a") as f:
        f.write(f"$ tformer {' '.join(args)}\n")
        f.flush()
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        sys.argv = ["tformer", *args]
        _seed_global_generators()
        try:
            runpy.run_module("tformer_cli", run_name="__main__", alter_sys=False)
        except SystemExit as e:
            code = e.code
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    if code not in (0, None):
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise RuntimeError(f"tformer {' '.join(args[:2])} exited with {code}:\n{tail}")


def _seed_global_generators() -> None:
    """Python's and NumPy's global generators, which a run saves in its checkpoints and restores on a resume but
    does not seed (it draws from torch's, seeded by run.seed): seeded here before each command, so that the saved
    states are the same on both sides, and a change that starts drawing from them shows."""
    import numpy

    random.seed(0)
    numpy.random.seed(0)


def _last_step(run: Path) -> int:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return max(r.get("step", 0) for r in records)


def _classifier(log: Path, checks: dict) -> None:
    base = [*CLASSIFIER, f"train.max_updates={RESUME_N}", "train.valid_every=8"]
    _cli(["train", *base, "run.name=classifier"], log)
    drop = ["model.dropout=0.1", "model.attn_dropout=0.1", "model.activation_dropout=0.1"]
    _cli(["train", *base, "run.name=dropout", *drop], log)


def _patience(log: Path, checks: dict) -> None:
    args = [*CLASSIFIER, "run.name=patience", "train.update_freq=2", "train.patience=2", "train.valid_every=4"]
    args += ["train.max_updates=60", "train.epochs=20", "train.lr=0.02", "train.schedule=constant"]
    args += ["train.best_metric=loss"]
    _cli(["train", *args], log)
    last = _last_step(Path("runs/patience"))
    checks["update_freq_patience"] = (last < 60, f"stopped early at update {last} of 60")


def _resume(log: Path, checks: dict) -> None:
    args = [*CLASSIFIER, "model.dropout=0.1", "train.schedule=constant", "train.warmup_steps=5"]
    args += [f"train.valid_every={RESUME_N // 2}"]
    _cli(["train", *args, "run.name=resume_straight", f"train.max_updates={RESUME_N}"], log)
    _cli(["train", *args, "run.name=resume_resumed", f"train.max_updates={RESUME_N // 2}"], log)
    resume = ["train", *args, "run.name=resume_resumed", f"train.max_updates={RESUME_N}"]
    with open(log, "a") as f:  # a new process, as a user resumes (PYTHONPATH: this side's code)
        f.write(f"$ tformer {' '.join(resume)}  # in a new process\n")
        f.flush()
        done = subprocess.run([sys.executable, "-m", "tformer_cli", *resume], stdout=f, stderr=f)
    if done.returncode:
        raise RuntimeError(f"the resume exited with {done.returncode}; see {log}")


def _translation(log: Path, checks: dict) -> None:
    rng = random.Random(0)
    german = dict(zip(WORDS, GERMAN, strict=True))
    src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(400)]
    corpora = Path("corpora")
    corpora.mkdir(exist_ok=True)
    for split, lines in (("train", src[:360]), ("valid", src[360:])):
        (corpora / f"mt_{split}.en").write_text("\n".join(lines) + "\n")
        (corpora / f"mt_{split}.de").write_text("\n".join(" ".join(german[w] for w in s.split()) for s in lines) + "\n")
    data = [
        "data.train=corpora/mt_train", "data.valid=corpora/mt_valid", "data.dir=data/mt", "tokenizer.vocab_size=60",
        "data.workers=1", "run.out_dir=runs", "run.name=translation",
    ]  # fmt: skip
    _cli(["prepare", "recipes/wmt14_base.yaml", *data], log)
    train = [*TINY, "model.dropout=0.1", "train.schedule=constant", "train.lr=3e-3", "train.warmup_steps=10"]
    train += ["train.max_tokens=400", "train.epochs=6", "train.best_metric=bleu", "train.valid_bleu_lines=20"]
    train += ["train.keep_last=3", "train.update_freq=1", "train.max_updates=null", "train.valid_every=0"]
    train += ["train.clip_norm=1.0", "train.log_every=4"]
    _cli(["train", "recipes/wmt14_base.yaml", *data, *COMMON, *train], log)
    for name, decode in (("beam", "decode.beam=4"), ("greedy", "decode.beam=1")):
        for path, static in (("", "decode.static=never"), ("_static", "decode.static=always")):
            out = f"outputs/translation_{name}{path}.txt"
            _cli(["translate", "runs/translation", "-i", "corpora/mt_valid.en", "-o", out, decode, static], log)


def _lm(log: Path, checks: dict) -> None:
    rng = random.Random(1)
    text = "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(500)) + "\n"
    corpora = Path("corpora")
    corpora.mkdir(exist_ok=True)
    (corpora / "lm_train.txt").write_text(text)
    (corpora / "lm_valid.txt").write_text(text[:3000].rsplit("\n", 1)[0] + "\n")
    data = ["data.train=corpora/lm_train.txt", "data.valid=corpora/lm_valid.txt", "data.dir=data/lm"]
    data += ["tokenizer.vocab_size=40", "data.block_size=32", "data.workers=1", "run.out_dir=runs"]
    _cli(["prepare", "recipes/wikitext2_lm.yaml", *data], log)
    train = [*COMMON, "train.batch_size=8", "train.epochs=2", "train.warmup_steps=5", "train.max_updates=20"]
    train += ["train.valid_every=10", "train.log_every=4"]
    _cli(["train", "recipes/wikitext2_lm.yaml", *data, *train, *TINY, "run.name=lm"], log)
    prompt = ["--prompt", "the house is", "decode.max_new_tokens=16"]
    _cli_stdout(["generate", "runs/lm", *prompt], log, "outputs/lm_greedy.txt")
    sampled = ["decode.temperature=0.9", "decode.top_k=10", "decode.top_p=0.9", "decode.seed=3"]
    _cli_stdout(["generate", "runs/lm", *prompt, *sampled], log, "outputs/lm_sampled.txt")


def _lstm(log: Path, checks: dict) -> None:
    data = ["data.train=corpora/lm_train.txt", "data.valid=corpora/lm_valid.txt", "data.dir=data/lm"]
    data += ["tokenizer.vocab_size=40", "data.block_size=32", "data.workers=1", "run.out_dir=runs"]
    train = [*COMMON, "train.batch_size=8", "train.epochs=2", "train.warmup_steps=5", "train.max_updates=12"]
    train += ["train.valid_every=6", "train.log_every=4", "model.d_model=32", "model.n_layers=1"]
    _cli(["train", "recipes/wikitext2_lstm.yaml", *data, *train, "model.dropout=0.1", "run.name=lstm"], log)
    _cli_stdout(
        ["generate", "runs/lstm", "--prompt", "the cat", "decode.max_new_tokens=16"], log, "outputs/lstm_greedy.txt"
    )


def _cli_stdout(args: list[str], log: Path, out: str) -> None:
    """A command whose stdout is the result (generate): run with stdout into `out`, stderr into the log."""
    part = Path(out + ".log")
    _cli(args, part)
    text = part.read_text()
    part.unlink()
    with open(log, "a") as f:
        f.write(text)
    # the command line echoed first, then what the command printed (its stderr is progress only)
    Path(out).write_text(text.split("\n", 1)[1])


STEPS = [
    ("classifier+dropout", _classifier),
    ("update_freq_patience", _patience),
    ("resume", _resume),
    ("translation_bleu", _translation),
    ("lm", _lm),
    ("lstm_lm", _lstm),
]


def run_side(tree: Path, out: Path) -> None:
    """The child process: every scenario with `tree`'s code, into `out` (the current directory)."""
    import tformer_cli

    assert str(Path(tformer_cli.__file__).resolve()).startswith(str(tree.resolve())), tformer_cli.__file__
    import torch

    checks: dict = {}  # scenario -> (whether it did what it is there for, what it did)
    seconds: dict = {}
    for folder in ("outputs", "logs"):
        Path(folder).mkdir(exist_ok=True)
    for name, step in STEPS:
        start = time.perf_counter()
        step(Path("logs") / f"{name}.log", checks)
        seconds[name] = round(time.perf_counter() - start, 1)
        print(f"  {name}: {seconds[name]} s", file=sys.stderr, flush=True)
    side = {"tree": str(tree), "torch": torch.__version__, "seconds": seconds, "checks": checks}
    Path("side.json").write_text(json.dumps(side, indent=1) + "\n")


def _commit_of(tree: Path) -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "tformer_cli", "recipes"], cwd=tree,
                           capture_output=True, text=True)  # fmt: skip
    return head.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")


def save_side(tree: Path, out: Path, label: str, commit: str | None = None) -> float:
    """Run every scenario with `tree`'s code into `out` (made empty first); returns the seconds it took."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / "recipes").symlink_to(tree / "recipes", target_is_directory=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "PYTHONHASHSEED": "0",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    env.pop("TFORMER_DATA", None)
    start = time.perf_counter()
    print(f"{label}: {tree} -> {out}", file=sys.stderr, flush=True)
    child = [sys.executable, str(Path(__file__).resolve()), "--_side", str(tree)]
    done = subprocess.run(child, cwd=out, env=env)
    (out / "recipes").unlink()
    if done.returncode != 0:
        (out / "FAILED").write_text(f"the scenarios exited with {done.returncode}; see {out}/logs\n")
    decoded = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "decode_outputs.py"), str(tree)], cwd=out, env=env,
        capture_output=True, text=True,
    )  # fmt: skip
    if decoded.returncode == 0:
        (out / "decode_outputs.json").write_text(decoded.stdout)
    else:
        (out / "logs").mkdir(exist_ok=True)
        (out / "logs" / "decode_outputs.log").write_text(decoded.stderr)
    seconds = time.perf_counter() - start
    side = json.loads((out / "side.json").read_text()) if (out / "side.json").exists() else {}
    side.update(commit=commit or _commit_of(tree), total_seconds=round(seconds, 1))
    (out / "side.json").write_text(json.dumps(side, indent=1) + "\n")
    return seconds


# --------------------------------------------------------------------------- comparing two saved sides


def _flatten(value, prefix: str = "") -> dict:
    """Nested dicts, lists and tuples -> {"a.b.0": leaf}."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return {prefix: value}
    out: dict = {}
    for key, item in items:
        out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _volatile(path: str) -> bool:
    return any(VOLATILE.match(part) for part in path.split("."))


def _records(path: Path) -> list[dict]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [{k: v for k, v in json.loads(line).items() if not VOLATILE.match(k)} for line in lines]


def _describe(record: dict) -> str:
    return " ".join(f"{k}={record[k]}" for k in ("split", "step", "epoch") if k in record)


def diff_metrics(a: Path, b: Path) -> str | None:
    """The first differing record of two metrics.jsonl files, wall-clock fields aside; None when the same."""
    ra, rb = _records(a), _records(b)
    for i, (x, y) in enumerate(zip(ra, rb, strict=False)):
        if x != y:
            keys = sorted(set(x) | set(y), key=str)
            key = next(k for k in keys if x.get(k, "<absent>") != y.get(k, "<absent>"))
            return f"record {i + 1} ({_describe(x)}) {key}: {x.get(key, '<absent>')!r} vs {y.get(key, '<absent>')!r}"
    if len(ra) != len(rb):
        extra = ra[len(rb)] if len(ra) > len(rb) else rb[len(ra)]
        return f"{len(ra)} records vs {len(rb)}; the first extra: {_describe(extra)}"
    return None


def diff_json(a: Path, b: Path, also_ignore: tuple[str, ...] = ()) -> str | None:
    fa, fb = (_flatten(json.loads(p.read_text())) for p in (a, b))
    keep = lambda k: not _volatile(k) and not any(part in also_ignore for part in k.split("."))  # noqa: E731
    differ = [k for k in sorted(set(fa) | set(fb)) if keep(k) and fa.get(k, "<absent>") != fb.get(k, "<absent>")]
    if not differ:
        return None
    key = differ[0]
    more = f" ({len(differ)} values differ)" if len(differ) > 1 else ""
    return f"{key}: {fa.get(key, '<absent>')!r} vs {fb.get(key, '<absent>')!r}{more}"


class Renames:
    """--rename OLD=NEW: checkpoint values named OLD (flattened: model.out_proj.weight) on the first side take the
    name NEW before the comparison; `applied` counts the checkpoint files each rename applied to."""

    def __init__(self, pairs: list[tuple[str, str]] | None = None) -> None:
        self.names = dict(pairs or [])
        self.applied = dict.fromkeys(self.names, 0)

    def apply(self, flat: dict) -> dict:
        for old in self.names.keys() & flat.keys():
            self.applied[old] += 1
        return {self.names.get(k, k): v for k, v in flat.items()}

    def said(self, before: dict[str, int]) -> str:
        """What was renamed since `before` (a copy of `applied`), for a scenario's line ('' when nothing)."""
        done = [f"{old} read as {self.names[old]} in {n - before[old]} checkpoints"
                for old, n in self.applied.items() if n > before[old]]  # fmt: skip
        return "; ".join(done)


def _rename_pair(text: str) -> tuple[str, str]:
    old, sep, new = text.partition("=")
    if not (sep and old and new):
        raise argparse.ArgumentTypeError(f"--rename takes OLD=NEW, got {text!r}")
    return old, new


def diff_state(a: dict, b: dict, only: tuple[str, ...] = (), renames: Renames | None = None) -> str | None:
    """Two checkpoints' contents: every tensor with torch.equal, every other value with ==, clock fields aside;
    `renames` renames the first's values first.

    Returns the first difference (a tensor's name and largest absolute difference, and how many differ) or None."""
    import torch

    fa, fb = _flatten(a), _flatten(b)
    fa = renames.apply(fa) if renames is not None else fa
    keys = [k for k in sorted(set(fa) | set(fb)) if not _volatile(k) and (not only or k.split(".")[0] in only)]
    tensors, values = [], []  # the differences, tensors first in the report
    for key in keys:
        if key not in fa or key not in fb:
            values.append(f"{key}: only in the {'first' if key in fa else 'second'}")
            continue
        x, y = fa[key], fb[key]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape:
                tensors.append(f"tensor {key}: {x.dtype} {tuple(x.shape)} vs {y.dtype} {tuple(y.shape)}")
            elif not torch.equal(x, y):
                if x.is_floating_point() or x.is_complex():
                    gap = (x.double() - y.double()).abs().max().item()
                else:
                    gap = (x.long() - y.long()).abs().max().item()
                tensors.append(f"tensor {key} differs, max abs difference {gap:.3g}")
        elif type(x) is not type(y) or x != y:
            if not (isinstance(x, float) and isinstance(y, float) and x != x and y != y):  # NaN == NaN here
                values.append(f"{key}: {x!r} vs {y!r}")
    differ = tensors + values
    if not differ:
        return None
    counts = f"{len(tensors)} tensors and {len(values)} other values differ"
    return differ[0] + (f" ({counts})" if len(differ) > 1 else "")


def _load(path: Path) -> dict:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def diff_text(a: Path, b: Path) -> str | None:
    x, y = a.read_bytes(), b.read_bytes()
    if x == y:
        return None
    try:
        la, lb = x.decode().splitlines(), y.decode().splitlines()
    except UnicodeDecodeError:
        return f"{len(x)} vs {len(y)} bytes, the contents differ"
    for i, (s, t) in enumerate(zip(la, lb, strict=False)):
        if s != t:
            return f"line {i + 1}: {s[:100]!r} vs {t[:100]!r}"
    return f"{len(la)} lines vs {len(lb)}"


def diff_file(a: Path, b: Path, renames: Renames | None = None) -> str | None:
    if a.suffix == ".jsonl":
        return diff_metrics(a, b)
    if a.suffix == ".pt":
        return diff_state(_load(a), _load(b), renames=renames)
    if a.suffix == ".json":
        return diff_json(a, b, ("sha256",) if a.name == "index.json" and a.parent.name == "checkpoints" else ())
    return diff_text(a, b)


def _files(path: Path) -> set[str]:
    if path.is_file():
        return {""}
    return {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and p.name not in IGNORED}


def diff_paths(a: Path, b: Path, renames: Renames | None = None) -> str | None:
    """A file or a folder of one side against the other's: the set of files, then each file; None when the same."""
    if not a.exists() or not b.exists():
        return (
            f"{a.name} missing on the {'first' if not a.exists() else 'second'} side"
            if a.exists() != b.exists()
            else f"{a.name} missing on both sides"
        )
    fa, fb = _files(a), _files(b)
    if fa != fb:
        only = sorted(fa - fb)[:3], sorted(fb - fa)[:3]
        return f"{a.name}: other files (only in the first: {only[0]}, only in the second: {only[1]})"
    # the first difference of each kind: the metrics, the checkpoints, the rest (a change shows in the first two)
    kinds = {".jsonl": 0, ".pt": 1}
    found: dict[int, str] = {}
    for rel in sorted(fa, key=lambda r: (kinds.get(Path(r).suffix, 2), r)):
        kind = kinds.get(Path(rel).suffix, 2)
        if kind not in found:
            what = diff_file(a / rel if rel else a, b / rel if rel else b, renames)
            if what:
                found[kind] = f"{Path(a.name) / rel if rel else a.name}: {what}"
    return "; ".join(found[k] for k in sorted(found)) or None


def _latest(run: Path) -> Path:
    index = json.loads((run / "checkpoints" / "index.json").read_text())
    return run / "checkpoints" / index["latest"]


def diff_resume(side: Path) -> str | None:
    """On one side: the run stopped at N/2 and resumed against the straight run (metrics; the last checkpoint's
    model, optimizer, RNG and position)."""
    straight, resumed = side / "runs" / "resume_straight", side / "runs" / "resume_resumed"
    found = diff_metrics(straight / "metrics.jsonl", resumed / "metrics.jsonl")
    if found:
        return f"metrics.jsonl {found}"
    return diff_state(_load(_latest(straight)), _load(_latest(resumed)), ("model", "optimizer", "rng", "position"))


def compare(before: Path, after: Path, out=None, renames: Renames | None = None) -> bool:
    """One line per scenario (on `out`, default stdout); True when everything is the same."""
    out = out or sys.stdout
    renames = renames or Renames()
    ok = True
    for flag in (before / "FAILED", after / "FAILED"):
        if flag.exists():
            print(f"{'a side':<22} FAILED: {flag.read_text().strip()}", file=out)
            ok = False
    checks = {
        label: json.loads((side / "side.json").read_text()).get("checks", {}) if (side / "side.json").exists() else {}
        for label, side in (("before", before), ("after", after))
    }
    for name, paths in SCENARIOS.items():
        problems, differing, applied = [], [], dict(renames.applied)
        for rel in paths:
            try:
                found = diff_paths(before / rel, after / rel, renames)
            except Exception as e:  # an unreadable file is a difference, said as such
                found = f"{rel}: could not compare ({type(e).__name__}: {e})"
            if found:
                differing.append(rel)
                if len(differing) == 1:
                    problems.append(found)
        if len(differing) > 1:
            problems.append(f"also different: {', '.join(differing[1:])}")
        if name == "resume":
            for label, side in (("before", before), ("after", after)):
                try:
                    found = diff_resume(side)
                except Exception as e:
                    found = f"could not compare ({type(e).__name__}: {e})"
                if found:
                    problems.append(f"{label}: resumed != straight: {found}")
        for label in ("before", "after"):
            if name in checks[label] and not checks[label][name][0]:
                problems.append(f"{label}: not what the scenario is for: {checks[label][name][1]}")
        if problems:
            ok = False
            print(f"{name:<22} DIFFERS: {'; '.join(problems)}", file=out)
        else:
            said = {label: checks[label].get(name, (True, ""))[1] for label in checks}
            extra = "resumed = straight on both sides" if name == "resume" else said["after"]
            if said["before"] != said["after"]:
                extra = f"before: {said['before']}; after: {said['after']}"
            extra = "; ".join(part for part in (extra, renames.said(applied)) if part)
            print(f"{name:<22} same{f' ({extra})' if extra else ''}", file=out)
    for old, n in renames.applied.items():
        if not n:
            print(f"{'--rename':<22} {old}={renames.names[old]}: no checkpoint of the first side has {old}", file=out)
    return ok


# --------------------------------------------------------------------------- the command line


@contextlib.contextmanager
def exported(commit: str):
    """`git archive` of `commit` into a temporary folder (reads the repository only: no worktree, no index)."""
    with tempfile.TemporaryDirectory(prefix="same_behaviour_") as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        yield tree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--before", metavar="COMMIT", help="compare COMMIT's code with this working tree")
    mode.add_argument("--save", metavar="DIR", help="run one side (default: the working tree) into DIR")
    mode.add_argument("--compare", nargs=2, metavar=("DIR1", "DIR2"), help="compare two saved sides")
    mode.add_argument("--_side", help=argparse.SUPPRESS)
    parser.add_argument("--commit", help="with --save: that commit's code instead of the working tree")
    parser.add_argument("--tree", help="with --save: the code of this folder (another checkout, an export)")
    parser.add_argument("--out", help="with --before: keep both sides' results here (DIR/before, DIR/after)")
    parser.add_argument("--speed", action="store_true", help="with --before: then bench/cpu_ab.py --before COMMIT")
    parser.add_argument("--rename", action="append", type=_rename_pair, metavar="OLD=NEW",
                        help="with --before or --compare: the first side's checkpoint value OLD is the second's NEW "
                        "(flattened names: model.out_proj.weight); repeatable")  # fmt: skip
    args = parser.parse_args(argv)
    renames = Renames(args.rename)
    if args._side:
        run_side(Path(args._side), Path.cwd())
        return 0
    if args.compare:
        return 0 if compare(Path(args.compare[0]), Path(args.compare[1]), renames=renames) else 1
    if args.save:
        tree = Path(args.tree).resolve() if args.tree else ROOT
        with exported(args.commit) if args.commit else contextlib.nullcontext(tree) as tree:
            seconds = save_side(Path(tree), Path(args.save).resolve(), args.commit or str(tree), args.commit)
        print(f"saved in {args.save} ({seconds:.0f} s)")
        return 1 if (Path(args.save) / "FAILED").exists() else 0
    start = time.perf_counter()
    # the commit and the tree's state as they are when each side starts (others may commit meanwhile)
    commit = subprocess.run(["git", "rev-parse", "--short", f"{args.before}^{{commit}}"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    with contextlib.ExitStack() as stack:
        out = Path(args.out).resolve() if args.out else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        tree = stack.enter_context(exported(commit))
        before_seconds = save_side(tree, out / "before", f"before ({args.before} = {commit})", commit)
        now = _commit_of(ROOT)
        after_seconds = save_side(ROOT, out / "after", "after (the working tree)", now)
        total = time.perf_counter() - start
        print(f"\nbefore = {args.before} ({commit}), after = the working tree ({now}); "
              f"sides {before_seconds:.0f} s and {after_seconds:.0f} s, {total:.0f} s in all\n")  # fmt: skip
        ok = compare(out / "before", out / "after", renames=renames)
    if args.speed:
        subprocess.run([sys.executable, str(ROOT / "bench" / "cpu_ab.py"), "--before", commit], cwd=ROOT)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
