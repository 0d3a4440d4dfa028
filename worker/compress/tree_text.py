"""``ls -R`` listings as an indented tree: one line per directory, subdirectories by name.

``ls -R`` prints a block per directory: a ``PATH:`` heading, one entry per line, a blank line
before the next block, and every heading spelled out in full. Here each block is one line,
``PATH: entry entry ...`` (entries packed as in :mod:`ls_text`), and a heading inside one still
open above it is written as its last name only, indented one space per level: a line indented by
N spaces is that name inside the last heading indented by N - 1. The model reads the nesting as a
tree, the way ``tree`` shows it, and the long repeated path prefixes are gone.

Only texts without a single space are written this way, so neither spaces between entries nor
indentation can be misread, and only up to :data:`MAX_CHARS`: the form shares no text with its
original, so judging it exactly means tokenizing both nearly whole.
"""

from __future__ import annotations

from worker.compress.limits import ExpansionBudget
from worker.compress.textform import Encoded, TextForm
from worker.errors import CompressionError

NAME = "listing-tree"
HEADER = (
    '[ls -R as a tree: "DIR: a b" = DIR holding a and b; '
    "a DIR indented N spaces is inside the last DIR indented N-1]\n"
)
MAX_CHARS = 256 * 1024  # about 25 ms of tokenizing to judge it; ~100 ms at 1 MB


def decode(payload: str, budget: ExpansionBudget | None = None) -> str:
    budget = budget or ExpansionBudget(NAME)
    open_dirs: list[str] = []  # the headings from the outermost to the current one
    blocks: list[str] = []
    for line in payload.split("\n"):
        name = line.lstrip(" ")
        depth = len(line) - len(name)
        first, space, entries = name.partition(" ")
        if first.endswith(":"):
            first = _open(open_dirs, depth, first[:-1]) + ":"
        elif depth:
            raise CompressionError(f"{NAME}: an indented line that is not a heading")
        budget.spend(len(first) + len(entries) + 2)
        blocks.append(first + "\n" + entries.replace(" ", "\n") if space else first)
    return "\n\n".join(blocks)


def _open(open_dirs: list[str], depth: int, name: str) -> str:
    """The full path of a heading ``depth`` levels in, which becomes the innermost open one."""
    if depth > len(open_dirs):
        raise CompressionError(f"{NAME}: a heading nested deeper than the one above it")
    path = f"{open_dirs[depth - 1]}/{name}" if depth else name
    del open_dirs[depth:]
    open_dirs.append(path)
    return path


def encode(text: str) -> Encoded | None:
    if " " in text or len(text) > MAX_CHARS:
        return None
    open_dirs: list[str] = []
    lines: list[str] = []
    nested = False
    for block in text.split("\n\n"):
        first, *entries = block.split("\n")
        if first.endswith(":"):
            path = first[:-1]
            depth = _depth_inside(open_dirs, path)
            name = path[len(open_dirs[depth - 1]) + 1 :] if depth else path
            _open(open_dirs, depth, name)
            first = " " * depth + name + ":"
            nested = nested or depth > 0
        elif not first and entries:
            return None  # the block's entries would read back as an indented heading
        lines.append(" ".join([first, *entries]))
    if not nested:
        return None  # no heading shortened: listing-packed says the same with a shorter header
    payload = "\n".join(lines)
    # Nothing here is the same run in both texts: two whole pieces count fastest.
    return Encoded(payload, [payload], [text])


def _depth_inside(open_dirs: list[str], path: str) -> int:
    """How many open headings ``path`` sits under, as a direct child of the innermost of them
    that it is a child of; 0 when it is no child of any."""
    for depth in range(len(open_dirs), 0, -1):
        parent = open_dirs[depth - 1] + "/"
        if len(path) > len(parent) and path.startswith(parent) and "/" not in path[len(parent) :]:
            return depth
    return 0


def applies(text: str) -> bool:
    """Blocks with headings, and no space anywhere (three scans in C)."""
    return ":\n" in text and "\n\n" in text and " " not in text


FORM = TextForm(NAME, HEADER, applies, encode, decode)
