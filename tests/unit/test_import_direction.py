"""The package's imports point one way (docs/architecture.md, "The rooms, from the ground up").

Every file's imports of tformer_cli are read from its source (module level and inside functions alike), then:
no two files reach each other through imports (a circle), nor two rooms (a folder of the package counted as one:
run/ and outputs.py, decoding/ and export/), kinds.py imports nothing of tformer's, model/ reaches
neither data, training, decoding nor the CLI, data/ reaches neither training nor decoding, train/ and decoding/
do not import each other, nothing outside train/ but `tformer train` imports train/, and that by its __init__'s names
only (training and `tformer eval` meet in validation.py, below both), and only the entry points import cli.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[2] / "tformer_cli"


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path = PACKAGE) -> set[str]:
    """The tformer_cli modules `path` imports (a `from tformer_cli.x import name` names tformer_cli.x.name when
    that is a module, else tformer_cli.x)."""
    modules = {module_name(p, root) for p in root.rglob("*.py")}
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names)
    return {name for name in found if name in modules and name != me}


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports (a package's __init__ is left out as a
    target: it only hands names on)."""
    graph = {module_name(p, root): imports_of(p, root) for p in sorted(root.rglob("*.py"))}
    faces = {module_name(p, root) for p in root.rglob("__init__.py")}
    return {name: targets - faces for name, targets in graph.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def rooms(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph with each folder of the package folded into one node (tformer_cli.run.load -> tformer_cli.run)."""

    def room(name: str) -> str:
        return ".".join(name.split(".")[:2])

    folded: dict[str, set[str]] = {}
    for source, targets in graph.items():
        folded.setdefault(room(source), set()).update(room(t) for t in targets if room(t) != room(source))
    return folded


def reaching(graph: dict[str, set[str]], prefix: str, forbidden: tuple[str, ...]) -> list[str]:
    """`source -> target` for each import from a module under `prefix` into one under a `forbidden` prefix."""
    return sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        if source == prefix or source.startswith(prefix + ".")
        for target in targets
        if any(target == f or target.startswith(f + ".") for f in forbidden)
    )


GRAPH = import_graph()


def test_the_graph_is_read() -> None:
    """The reader finds the imports it must (else every check below would pass on an empty graph)."""
    assert "tformer_cli.kinds" in GRAPH["tformer_cli.schema"]
    assert "tformer_cli.train.tasks" in GRAPH["tformer_cli.train.loop"]
    assert "tformer_cli.model.spec" in GRAPH["tformer_cli.model.build"]  # a relative or absolute import


def test_no_circle() -> None:
    assert circles(GRAPH) == []


def test_no_circle_between_rooms() -> None:
    """A folder reached back by a module it imports (by way of another file of the folder) is a circle too: the
    folder cannot be read as one floor above or below that module."""
    assert circles(rooms(GRAPH)) == []


@pytest.mark.parametrize(
    ("prefix", "forbidden"),
    [
        ("tformer_cli.kinds", ("tformer_cli",)),
        ("tformer_cli.model", ("tformer_cli.data", "tformer_cli.train", "tformer_cli.decoding", "tformer_cli.cli")),
        ("tformer_cli.data", ("tformer_cli.train", "tformer_cli.decoding", "tformer_cli.run", "tformer_cli.cli")),
        ("tformer_cli.train", ("tformer_cli.decoding", "tformer_cli.cli", "tformer_cli.evaluate", "tformer_cli.sweep")),
        ("tformer_cli.decoding", ("tformer_cli.train", "tformer_cli.cli", "tformer_cli.evaluate")),
    ],
)
def test_one_way(prefix: str, forbidden: tuple[str, ...]) -> None:
    assert reaching(GRAPH, prefix, forbidden) == []


def test_training_has_one_door() -> None:
    """Outside train/, training is reached through tformer_cli/train/__init__.py's names only (no module of the
    folder), and only by `tformer train`; `tformer eval` scores what training scores through validation.py, and
    `check` says what would waste a run through waste.py, floors below both."""
    raw = {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}
    outside = {source: targets for source, targets in raw.items() if not source.startswith("tformer_cli.train")}
    into_the_folder = sorted(
        f"{source} -> {t}" for source, targets in outside.items() for t in targets if t.startswith("tformer_cli.train.")
    )
    assert into_the_folder == []
    importers = {source for source, targets in outside.items() if "tformer_cli.train" in targets}
    assert importers == {"tformer_cli.commands.train"}


def test_only_the_entry_points_import_the_cli() -> None:
    importers = {source for source, targets in GRAPH.items() if "tformer_cli.cli" in targets}
    assert importers <= {"tformer_cli.__main__"}


def test_a_circle_and_a_wrong_way_are_found(tmp_path: Path) -> None:
    """The checks fail on a package that breaks them (a made-up one, with relative imports)."""
    root = tmp_path / "tformer_cli"
    (root / "model").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "model" / "__init__.py").write_text("")
    (root / "a.py").write_text("from tformer_cli import b\n")
    (root / "b.py").write_text("def f():\n    from . import a\n")
    (root / "model" / "m.py").write_text("from ..a import x\n")
    graph = import_graph(root)
    assert circles(graph) == [["tformer_cli.a", "tformer_cli.b"]]
    assert reaching(graph, "tformer_cli.model", ("tformer_cli.a",)) == ["tformer_cli.model.m -> tformer_cli.a"]
    (root / "model" / "n.py").write_text("")
    (root / "c.py").write_text("from tformer_cli.model import n\n")
    (root / "model" / "m.py").write_text("from tformer_cli import c\n")  # m -> c -> n: no circle of files
    graph = import_graph(root)
    assert ["tformer_cli.c", "tformer_cli.model"] in circles(rooms(graph))
    assert circles(graph) == [["tformer_cli.a", "tformer_cli.b"]]  # the files alone make no new circle
