"""The files a range of messages really used: created, edited, deleted, read, listed or run.

A path counts only where a tool call used it as a file: a file tool's path argument, or an
operand of a shell command in the position where that command takes a file (``cat F``,
``sed -i S F``, ``grep P F``, ``> F``, ``python F``, ``pytest F::test``, ...). Scripts and patterns
(``sed 's/a/b/'``, ``grep 'qs.alias'``), code (``python -c``, heredoc bodies), module names
(``python -m django.conf``), options and words of unknown programs are not files, and a path the
call's output says does not exist (``No such file or directory``, ``cannot access``, ``can't
open file``) is dropped. Each path is normalized once (``./a//b/`` -> ``a/b``). The rules are
documented in docs/summaries.md.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

FileKind = Literal["created", "edited", "deleted", "read", "listed", "ran", "used"]
CHANGE_KINDS: tuple[FileKind, ...] = ("created", "edited", "deleted")
MAX_COMMAND_CHARS = 20_000  # longer commands are scripts: only their first part is read

_SHELL_TOOLS = {
    "bash",
    "sh",
    "shell",
    "zsh",
    "terminal",
    "run_shell_command",
    "execute_bash",
    "execute_command",
    "run_command",
    "exec_command",
    "local_shell",
    "container.exec",
}
_PATH_KEYS = (
    "path",
    "file_path",
    "filepath",
    "filename",
    "file",
    "target_file",
    "notebook_path",
    "source",
    "destination",
)
_PATH_LIST_KEYS = ("paths", "files", "file_paths")
_ALL_PATH_KEYS = frozenset(_PATH_KEYS + _PATH_LIST_KEYS)
_WRITE_REDIRECTS = {">", ">>", ">|", "&>", "&>>"}  # ">&" duplicates a descriptor
_SLASHES = re.compile(r"/{2,}")
_PATH_CHARS = re.compile(r"[\w@%+,.~/\-]+")
_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9_]{0,9}$")
_FILE_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,5}$")  # not a dotted name like a.test_x
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][\w\-]*)\1")
_MISSING = re.compile(
    r"No such file or directory|cannot access|can't open file|cannot open|"
    r"does not exist|not found|cannot stat"
)
_SYNTAX_ERRORS = ("syntax error", "unexpected EOF while looking for matching")
_SYNTAX_ERROR = re.compile(
    r"^(?:bash|sh|zsh)?:?.{0,40}(?:" + "|".join(_SYNTAX_ERRORS) + ")",
    re.MULTILINE,
)
_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=")
_PATCH_FILE = re.compile(r"^\*\*\* (Add|Update|Delete) File: (.+)$", re.MULTILINE)
_PATCH_MOVE = re.compile(r"^\*\*\* Move to: (.+)$", re.MULTILINE)
# The line breaks of str.splitlines() (lines_holding cuts the lines it would give).
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_LINE_BREAK = re.compile(f"[{LINE_BREAKS}]")
# From a position to just past the last line break before the end given to match().
_TO_LAST_BREAK = re.compile(f".*[{LINE_BREAKS}]", re.DOTALL)

_READERS = {
    "cat",
    "head",
    "tail",
    "nl",
    "less",
    "more",
    "wc",
    "file",
    "stat",
    "md5sum",
    "sha256sum",
    "sort",
    "uniq",
    "diff",
    "cmp",
    "bat",
    "od",
    "xxd",
    "hexdump",
    "strings",
    "source",
    ".",
    "black",
    "flake8",
    "ruff",
    "mypy",
    "pylint",
    "isort",
    "git-diff",
}
_LISTERS = {"ls", "tree", "du", "dir"}
_DELETERS = {"rm", "rmdir", "unlink"}
_CREATORS = {"touch", "mkdir"}
_WRAPPERS = {"sudo", "env", "time", "nohup", "command", "exec", "xargs", "timeout", "nice"}
# Programs whose words are text, code or package names, never files.
_NO_FILES = {"echo", "printf", "pip", "pip3", "conda", "apt-get", "apt", "export", "cd", "which"}
# Bare words that are programs, not files, wherever a broken quote leaves them.
_PROGRAM_NAMES = {"sed", "grep", "awk", "cat", "python", "python3", "bash", "sh", "tr", "cut"}
_PYTHONS = re.compile(r"python(\d+(\.\d+)?)?$|pypy3?$")
# Options that take a value in the next word, per program (grep's -e and sed's -e are patterns).
_VALUE_OPTIONS = {
    "head": {"-n", "-c"},
    "tail": {"-n", "-c"},
    "grep": {"-m", "-A", "-B", "-C", "--include", "--exclude", "--exclude-dir", "-d", "-D"},
    "sed": {"-l"},
    "awk": {"-F", "-v"},
    "nl": {"-b", "-w", "-s", "-v", "-i", "-n"},
    "pytest": {"-k", "-m", "-p", "-o", "-W", "-n", "--tb", "--rootdir", "-c", "--maxfail"},
    "ls": {"-I", "--ignore", "-w"},
    "sort": {"-k", "-t", "-o"},
    "diff": {"-U", "-C"},
    "xargs": {"-I", "-n", "-P", "-d"},
    "timeout": {"-s", "-k"},
}


@dataclass(frozen=True)
class FileUse:
    path: str
    kind: FileKind
    index: int  # message index of the call


@dataclass
class FileRecord:
    """One path with every way the range used it, in order of first use."""

    path: str
    kinds: list[FileKind] = field(default_factory=list)
    first_index: int = 0
    last_change: int = -1  # message index of the newest change, -1 if never changed

    @property
    def changed(self) -> bool:
        return any(k in CHANGE_KINDS for k in self.kinds)


def normalize_path(path: str) -> str:
    """The one spelling of a path: no ``./`` prefixes or ``/./``, no doubled or trailing ``/``."""
    p = path.strip()
    if p.startswith("file://"):
        p = p[len("file://") :]
    if "//" in p:
        p = _SLASHES.sub("/", p)
    while "/./" in p:
        p = p.replace("/./", "/")
    while p.startswith("./"):
        p = p[2:]
    if len(p) > 1:
        p = p.rstrip("/")
    if p.endswith("/.") and len(p) > 2:
        p = p[:-2]
    return p


def plausible_path(word: str, *, strict: bool = False) -> bool:
    """A word that can be a path. ``strict`` (words of programs we do not know): it also has
    a directory separator or a file extension, and no part of it looks like a unit or a ratio."""
    if not word or len(word) > 400 or word in (".", "..", "-", "/", "~"):
        return False
    if _PATH_CHARS.fullmatch(word) is None or word.startswith("-"):
        return False
    if word.startswith("/dev/") or word.startswith("/proc/"):
        return False
    if not any(c.isalpha() for c in word):
        return False
    if not strict:
        return True
    name = word.rstrip("/").rsplit("/", 1)[-1]
    if word.endswith("/") and name and not name[0].isdigit():
        return True  # a directory, said so
    if "/" in word.strip("/"):
        return all(part and not part[0].isdigit() for part in word.strip("/").split("/"))
    return bool(_EXTENSION.search(name)) and not name[0].isdigit() and name[0] != "."


def _strip_heredocs(command: str) -> str:
    """The command without the bodies of its here-documents (they are file contents)."""
    if "<<" not in command:
        return command
    lines = command.split("\n")
    out: list[str] = []
    ends: list[tuple[str, bool]] = []
    for line in lines:
        if ends:
            delimiter, tabs = ends[0]
            if (line.lstrip("\t") if tabs else line).strip() == delimiter:
                ends.pop(0)
            continue
        out.append(line)
        for match in _HEREDOC.finditer(line):
            ends.append((match.group(2), match.group(0).startswith("<<-")))
    return "\n".join(out)


def _strip_comment_lines(command: str) -> str:
    if "#" not in command:
        return command
    return "\n".join(line for line in command.split("\n") if not line.lstrip().startswith("#"))


# One piece of shell text: blanks, an operator, a quoted string, an escape, or plain characters.
_PIECE = re.compile(
    r"(?P<blank>[ \t\r]+)"
    r"|(?P<op>&&|\|\||;;|\|&|&>>?|[;&|()\n]|\d?(?:>>|>\||>&|>)|<<-?|<)"
    r"|'(?P<single>[^']*)'"
    r'|"(?P<double>(?:[^"\\]|\\.)*)"'
    r"|\\(?P<escaped>.)"
    r"|(?P<plain>[^ \t\r;&|()<>\n'\"\\]+)"
    r"|(?P<bad>.)",
    re.DOTALL,
)
_DOUBLE_ESCAPE = re.compile(r'\\([$`"\\\n])')


def _words(command: str) -> list[tuple[str, bool]]:
    """Shell words (quotes removed) and operators of ``command``: (text, is_operator). An
    unclosed quote gives no words: the shell refuses such a command too."""
    out: list[tuple[str, bool]] = []
    word: list[str] = []
    in_word = False
    for match in _PIECE.finditer(command):
        kind = match.lastgroup
        if kind == "bad":
            return []
        if kind in ("blank", "op"):
            if in_word:
                out.append(("".join(word), False))
                word, in_word = [], False
            if kind == "op":
                out.append((match.group("op"), True))
            continue
        in_word = True
        if kind == "double":
            word.append(_DOUBLE_ESCAPE.sub(r"\1", match.group("double")))
        else:
            word.append(match.group(kind or "plain"))
    if in_word:
        out.append(("".join(word), False))
    return out


def _simple_commands(
    words: list[tuple[str, bool]],
) -> Iterator[tuple[list[str], list[tuple[str, str]]]]:
    """Each simple command's words and its redirections (operator, target)."""
    current: list[str] = []
    redirects: list[tuple[str, str]] = []
    pending: str | None = None
    for word, is_op in words:
        if pending is not None and not is_op:
            redirects.append((pending, word))
            pending = None
            continue
        pending = None
        if is_op and ("<" in word or ">" in word):
            pending = word.lstrip("0123456789")
            continue
        if is_op:
            if current or redirects:
                yield current, redirects
            current, redirects = [], []
            continue
        current.append(word)
    if current or redirects:
        yield current, redirects


def _program(words: list[str]) -> tuple[str, list[str]]:
    """The program (its base name) and its arguments, past assignments and wrappers."""
    i = 0
    while i < len(words):
        word = words[i]
        if _ASSIGNMENT.match(word):
            i += 1
            continue
        name = word.rsplit("/", 1)[-1]
        if name in _WRAPPERS:
            i += 1
            options = _VALUE_OPTIONS.get(name, set())
            while i < len(words) and words[i].startswith("-"):
                i += 2 if words[i] in options else 1
            if name == "timeout" and i < len(words):
                i += 1  # the duration
            continue
        return word, words[i + 1 :]
    return "", []


def _operands(name: str, args: list[str]) -> list[str]:
    """Arguments that are not options or option values."""
    options = _VALUE_OPTIONS.get(name, set())
    out: list[str] = []
    skip = False
    only_operands = False
    for arg in args:
        if skip:
            skip = False
            continue
        if only_operands:
            out.append(arg)
        elif arg == "--":
            only_operands = True
        elif arg.startswith("-") and len(arg) > 1:
            # "-A" takes the next word, and so does a run of short flags ending in one ("-nC").
            skip = arg in options or (
                not arg.startswith("--") and len(arg) > 2 and f"-{arg[-1]}" in options
            )
        else:
            out.append(arg)
    return out


def shell_file_uses(command: str, output: str = "") -> list[tuple[str, FileKind]]:
    """(path, kind) for every file a shell command uses, in order, not yet normalized.

    An operand of a program this module does not know counts (as ``used``) only when it has a
    directory separator or a file extension and the call's ``output`` shows it."""
    parse = _parse_cached if len(command) <= _CACHED_COMMAND_CHARS else _parse
    shown = output[:SHOWN_CHARS]
    return [(p, k) for p, k in parse(command) if k != "used" or p.rstrip("/") in shown]


_CACHED_COMMAND_CHARS = 4000


def _parse(command: str) -> tuple[tuple[str, FileKind], ...]:
    """Every use of ``command`` (``used`` ones still to be checked against the output)."""
    text = _strip_heredocs(command[:MAX_COMMAND_CHARS]).replace("\\\n", " ")  # continuations
    text = _strip_comment_lines(text)
    uses: list[tuple[str, FileKind]] = []
    for words, redirects in _simple_commands(_words(text)):
        for op, target in redirects:
            if op in _WRITE_REDIRECTS and target != "&1" and plausible_path(target):
                uses.append((target, "created" if op in (">", ">|", "&>") else "edited"))
            elif op == "<" and plausible_path(target):
                uses.append((target, "read"))
        program, args = _program(words)
        if program:
            uses.extend(_command_uses(program, args))
    return tuple((p, k) for p, k in uses if p.rsplit("/", 1)[-1] not in _PROGRAM_NAMES or "/" in p)


# The same commands come back in every snapshot of a conversation (and in the digest and the
# fact check of one compaction): parsing each once keeps extraction cheap.
_parse_cached = functools.lru_cache(maxsize=4096)(_parse)


def _command_uses(program: str, args: list[str]) -> list[tuple[str, FileKind]]:
    name = program.rsplit("/", 1)[-1]
    uses: list[tuple[str, FileKind]] = []
    system = program.startswith(("/usr/", "/bin/", "/sbin/", "/opt/", "/nix/"))
    if "/" in program and not system and plausible_path(program, strict=True):
        uses.append((program, "ran"))  # ./tests/runtests.py, bin/test
    operands = _operands(name, args)

    def paths(words: list[str], kind: FileKind, *, strict: bool = False) -> None:
        uses.extend((w, kind) for w in words if plausible_path(w, strict=strict))

    if name in _READERS:
        paths(operands, "read")
    elif name in _LISTERS:
        paths(operands, "listed")
    elif name in _DELETERS:
        paths(operands, "deleted")
    elif name in _CREATORS:
        paths(operands, "created")
    elif name == "tee":
        paths(operands, "edited" if "-a" in args else "created")
    elif name in ("cp", "mv", "ln", "install"):
        if len(operands) >= 2:
            paths(operands[:-1], "deleted" if name == "mv" else "read")
            paths(operands[-1:], "created")
    elif name == "find":
        roots = []
        for arg in args:
            if arg.startswith(("-", "(", "!")):
                break
            roots.append(arg)
        paths(roots, "listed")
    elif name in ("grep", "egrep", "fgrep", "rg", "ag", "ack"):
        explicit = any(a in ("-e", "-f", "--regexp", "--file") or a.startswith("-e") for a in args)
        rest = _operands("grep", [a for a in args if a not in ("-e", "-f")] if explicit else args)
        paths(rest if explicit else rest[1:], "read")
    elif name == "sed":
        in_place = any(a == "-i" or a.startswith(("-i", "--in-place")) for a in args)
        explicit = any(a in ("-e", "-f", "--expression") for a in args)
        rest = _operands("sed", _without_values(args, {"-e", "-f", "--expression"}))
        paths(rest if explicit else rest[1:], "edited" if in_place else "read", strict=True)
    elif name in ("awk", "gawk"):
        explicit = "-f" in args
        rest = _operands("awk", _without_values(args, {"-f"}))
        paths(rest if explicit else rest[1:], "read", strict=True)
    elif _PYTHONS.match(name):
        uses.extend(_python_uses(args))
    elif name in ("pytest", "py.test"):
        paths([o.split("::", 1)[0] for o in operands], "ran")
    elif name == "git":
        uses.extend(_git_uses(args))
    elif name in ("patch",):
        pass  # the files are in the patch on stdin
    elif name in ("chmod", "chown"):
        paths(operands[1:], "edited")
    elif name not in _NO_FILES:  # kept only where the output shows it (shell_file_uses)
        named = [
            o
            for o in operands
            if plausible_path(o, strict=True) and ("/" in o or _FILE_EXTENSION.search(o))
        ]
        paths(named, "used")
    return uses


def _without_values(args: list[str], options: set[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in options:
            skip = True
        else:
            out.append(arg)
    return out


def _python_uses(args: list[str]) -> list[tuple[str, FileKind]]:
    for k, arg in enumerate(args):
        if arg in ("-c",) or arg.startswith("-c"):
            return []  # code, not a file
        if arg == "-m":
            module = args[k + 1] if k + 1 < len(args) else ""
            if module in ("pytest", "py.test"):
                rest = _operands("pytest", args[k + 2 :])
                return [
                    (o.split("::", 1)[0], "ran")
                    for o in rest
                    if plausible_path(o.split("::", 1)[0], strict=True)
                ]
            return []
        if arg.startswith("-"):
            continue
        return [(arg, "ran")] if plausible_path(arg, strict=True) else []
    return []


def _git_uses(args: list[str]) -> list[tuple[str, FileKind]]:
    sub = next((a for a in args if not a.startswith("-")), "")
    rest = _operands("git", args[args.index(sub) + 1 :]) if sub else []
    kinds: dict[str, FileKind] = {
        "diff": "read",
        "show": "read",
        "log": "read",
        "blame": "read",
        "add": "read",
        "checkout": "edited",
        "restore": "edited",
        "rm": "deleted",
        "mv": "created",
    }
    kind = kinds.get(sub)
    if kind is None:
        return []
    return [(w, kind) for w in rest if plausible_path(w, strict=True) and ".." not in w]


_MISSING_WORDS = ("No such file", "cannot", "can't", "does not exist", "not found")
SHOWN_CHARS = 200_000  # how much of an output is searched for a path it shows or says missing
MAX_MISSING_LINES = 500


def _missing_lines(output: str) -> list[str]:
    """The lines of an output that say something does not exist (searched once a call)."""
    head = output[:SHOWN_CHARS]
    if not any(word in head for word in _MISSING_WORDS):
        return []  # the common case: finding substrings is faster than the search
    missing = lines_holding(head, _MISSING)
    return list(itertools.islice(missing, MAX_MISSING_LINES))


def lines_holding(text: str, pattern: re.Pattern[str]) -> Iterator[str]:
    """The lines of ``text`` (as str.splitlines() cuts them) that hold a match of ``pattern``, in
    order; a match must not begin with a line break.

    One search of the whole text (at C speed) finds them: a Python step for every line of every
    output cost more than the rest of the facts. Each line is cut once and the text before it
    scanned once, so the time stays linear even in one enormous line."""
    done = 0  # the end of the last line given
    match = pattern.search(text)
    while match is not None:
        position = match.start()
        previous = _TO_LAST_BREAK.match(text, done, position)
        start = previous.end() if previous is not None else done
        after = _LINE_BREAK.search(text, position)
        done = after.start() if after is not None else len(text)
        yield text[start:done]
        match = pattern.search(text, done)


# What a listing may be piped through and still print only file names.
_LISTING_FILTERS = {"head", "tail", "grep", "sort", "wc", "cut", "less", "more", "cd", "pwd"}
_LISTER_WORD = re.compile(r"(?<![\w.-])(?:ls|tree|du|dir|find)(?![\w.-])")
_FIND_ACTIONS = {"-exec", "-execdir", "-ok", "-okdir", "-delete", "-fprint", "-fls"}


def only_lists(tool: str, arguments: str) -> bool:
    """Whether a call does nothing but list directories (``ls -R``, ``find . -name '*.py' |
    head``, a glob or list tool): what it prints are names of files, not code it read."""
    value = parse_arguments(arguments)
    if not _is_shell(tool.lower()):
        return _tool_kind(tool, value if isinstance(value, dict) else {}) == "listed"
    command = _shell_command(arguments, value)
    # Most commands name no lister at all: only the others are parsed.
    if command is None or "<<" in command or not _LISTER_WORD.search(command):
        return False
    listing = False
    for words, _ in _simple_commands(_words(command)):
        program, args = _program(words)
        program = program.rsplit("/", 1)[-1]
        if program in _LISTERS or (program == "find" and not _FIND_ACTIONS & set(args)):
            listing = True
        elif program not in _LISTING_FILTERS:
            return False
    return listing


def parse_arguments(arguments: str) -> Any:
    """A call's JSON arguments, parsed (None when they are not JSON): pass them to
    :func:`file_uses` when the caller reads them too, so that they are parsed once."""
    try:
        return json.loads(arguments) if arguments else {}
    except (ValueError, RecursionError):
        return None


def _tool_kind(tool: str, args: dict[str, Any]) -> FileKind:
    name = tool.lower()
    sub = str(args.get("command", "")).lower() if isinstance(args.get("command"), str) else ""
    if sub in ("create",):
        return "created"
    if sub in ("str_replace", "insert", "undo_edit", "edit", "write"):
        return "edited"
    if sub in ("view", "read"):
        return "read"
    for words, kind in (
        (("delete", "remove"), "deleted"),
        (("create", "write", "new_file", "save"), "created"),
        (("edit", "replace", "patch", "insert", "modify", "update", "apply"), "edited"),
        (("list", "ls", "glob", "find", "tree"), "listed"),
    ):
        if any(w in name for w in words):
            return kind  # type: ignore[return-value]
    return "read"


def call_file_uses(tool: str, arguments: str, output: str) -> list[tuple[str, FileKind]]:
    """(normalized path, kind) for the files one tool call used, without the ones its output
    reports missing (and none when the shell refused the command)."""
    return file_uses(tool, arguments, parse_arguments(arguments), output)


def file_uses(tool: str, arguments: str, value: Any, output: str) -> list[tuple[str, FileKind]]:
    """:func:`call_file_uses` with the arguments already parsed (``value``, as
    :func:`parse_arguments` gives it)."""
    raw = _raw_uses(tool, arguments, value, output)
    # Most calls use no file: the output is searched only for the calls that do.
    if not raw or _refused(output[:2000]):
        return []
    missing = _missing_lines(output)
    out: list[tuple[str, FileKind]] = []
    for path, kind in raw:
        if not plausible_path(path):
            continue
        if kind != "created" and any(path in line for line in missing):
            continue
        normal = normalize_path(path)
        if normal == path or (normal and plausible_path(normal)):  # most are normal already
            out.append((normal, kind))
    return out


def _refused(head: str) -> bool:
    """The shell's syntax error: looked for only where its words are (the pattern is slow)."""
    return any(words in head for words in _SYNTAX_ERRORS) and bool(_SYNTAX_ERROR.search(head))


def _raw_uses(tool: str, arguments: str, value: Any, output: str) -> list[tuple[str, FileKind]]:
    """The paths of a call's arguments and command, not yet checked against its output."""
    name = tool.lower()
    command = _shell_command(arguments, value)
    if isinstance(value, dict):
        raw = _argument_paths(tool, value)
        if command is not None and (_is_shell(name) or (command and " " in command)):
            raw.extend(shell_file_uses(command, output))
        patch = value.get("input", value.get("patch"))
        if isinstance(patch, str):
            raw.extend(_patch_uses(patch))
        return raw
    if command and name in _SHELL_TOOLS:
        return shell_file_uses(command, output)
    return []


def _is_shell(name: str) -> bool:
    """Whether a tool (its lower-cased name) runs the shell commands it is given."""
    return name in _SHELL_TOOLS or "shell" in name or "bash" in name


def _shell_command(arguments: str, value: Any) -> str | None:
    """The command a call's arguments hold: their ``command`` (or ``cmd``; an argv list as the
    shell would run it), a JSON string, or arguments that are no JSON at all."""
    if isinstance(value, dict):
        command = value.get("command", value.get("cmd"))
        if isinstance(command, list) and command and all(isinstance(c, str) for c in command):
            command = command[-1] if command[0] in ("bash", "sh", "zsh") else shlex.join(command)
        return command if isinstance(command, str) else None
    if isinstance(value, str):
        return value
    return arguments if value is None else None


def _argument_paths(tool: str, value: dict[str, Any]) -> list[tuple[str, FileKind]]:
    """The paths a file tool names in its arguments, with what the tool does to them."""
    if _ALL_PATH_KEYS.isdisjoint(value):
        return []  # a shell call
    paths = [
        item.strip()
        for key in _PATH_KEYS
        if isinstance(item := value.get(key), str) and plausible_path(item.strip())
    ]
    for key in _PATH_LIST_KEYS:
        items = value.get(key)
        if isinstance(items, list):
            paths.extend(i.strip() for i in items if isinstance(i, str))
    if not paths:
        return []
    kind = _tool_kind(tool, value)
    return [(path, kind) for path in paths]


def _patch_uses(patch: str) -> list[tuple[str, FileKind]]:
    kinds: dict[str, FileKind] = {"Add": "created", "Update": "edited", "Delete": "deleted"}
    uses = [(m.group(2).strip(), kinds[m.group(1)]) for m in _PATCH_FILE.finditer(patch)]
    uses.extend((m.group(1).strip(), "created") for m in _PATCH_MOVE.finditer(patch))
    return uses
