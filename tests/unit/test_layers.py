"""The package's layers (pyproject.toml, ``[tool.compactor.layers]``): every import runs down
or within a layer, siblings of a layer import nothing of each other, and no modules import each
other around a circle. Imports inside functions
and under ``TYPE_CHECKING`` count too: a lazy import is still a dependency."""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
PACKAGE = REPO / "worker"


def layers() -> list[list[str]]:
    with (REPO / "pyproject.toml").open("rb") as f:
        order: list[list[str]] = tomllib.load(f)["tool"]["compactor"]["layers"]["order"]
    return order


def siblings() -> list[list[str]]:
    """Groups of one layer whose members may not import one another (``siblings``)."""
    with (REPO / "pyproject.toml").open("rb") as f:
        groups: list[list[str]] = tomllib.load(f)["tool"]["compactor"]["layers"]["siblings"]
    return groups


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imported(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The package's modules ``name`` imports (a ``from X import y`` names module X.y when
    there is one, else X)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _ours(alias.name, known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield from _ours(full if full in known else base, known)


def _ours(name: str, known: dict[str, Path]) -> Iterator[str]:
    while name and name not in known:
        name = name.rpartition(".")[0]
    if name:
        yield name


def graph() -> dict[str, set[str]]:
    known = modules()
    return {
        name: {m for m in imported(name, path, known) if m != name} for name, path in known.items()
    }


def layer_of(name: str, order: list[list[str]]) -> int:
    best = None
    for index, members in enumerate(order):
        for member in members:
            if (name == member or name.startswith(member + ".")) and (
                best is None or len(member) > len(best[1])
            ):
                best = (index, member)
    assert best is not None, f"{name} is in no layer of [tool.compactor.layers]"
    return best[0]


def test_every_import_runs_down_or_within_its_layer() -> None:
    order = layers()
    upward = [
        f"{name} (layer {layer_of(name, order)}) imports {target} (layer {layer_of(target, order)})"
        for name, targets in sorted(graph().items())
        for target in sorted(targets)
        if layer_of(target, order) > layer_of(name, order)
    ]
    assert not upward, "\n".join(upward)


def _member(name: str, group: list[str]) -> str | None:
    return next((m for m in group if name == m or name.startswith(m + ".")), None)


def test_siblings_import_nothing_of_each_other() -> None:
    order = layers()
    crossings = []
    for group in siblings():
        assert len({layer_of(m, order) for m in group}) == 1, f"{group}: not one layer"
        for name, targets in sorted(graph().items()):
            mine = _member(name, group)
            for target in sorted(targets):
                theirs = _member(target, group)
                if mine and theirs and theirs != mine:
                    crossings.append(f"{name} imports {target}")
    assert not crossings, "\n".join(crossings)


def test_no_import_circle() -> None:
    edges = graph()
    # a package imports its own modules to re-export them; its modules may import siblings
    # through it only if it does not import them back, which the search below finds
    circles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(edges[node]):
            if state.get(target) == 1:
                circles.append(" -> ".join([*stack[stack.index(target) :], target]))
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not circles, "\n".join(circles)


def test_the_readme_layout_lists_the_layers_in_order() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    table = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    listed = [row.split("`")[1] for row in rows]
    expected = [m.removeprefix("worker.").replace(".", "/") for layer in layers() for m in layer]
    expected = [m for m in expected if m not in ("worker", "__main__")]
    assert [name.rstrip("/").removesuffix(".py") for name in listed] == expected
