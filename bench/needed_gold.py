"""Gold facts for the needed-later benchmark: what the agent's own later messages use.

Written apart from the product: nothing here imports ``worker`` (in particular not
``worker.core.facts`` or ``worker.core.files``); it is regexes and ``shlex`` over the
OpenAI-format wire messages of a conversation. The rules (BENCHMARKS.md, "What the agent goes
on to use", repeats them with examples):

**Candidates** come from the conversation's future, the messages from the cut on:

- every *assistant* message: its text and its tool calls' arguments (decoded from JSON);
- the *final submitted diff* (the last message, when it holds ``diff --git a/X b/X`` headers):
  each ``X`` is a ``diff_file`` fact.

**Kinds**, and where each is taken from:

- ``path``: a word with a known file extension (``models.py``, ``django/forms/models.py``,
  ``/testbed/setup.cfg``), anywhere; a word with a ``/`` whose parts are all name characters
  (``django/db/models``) in a command's operand position or inside backticks. ``./`` in front,
  a ``/`` at the end and a ``:LINE`` after are dropped. Never a word holding ``://``, ``//`` or
  glob characters.
- ``test``: a name starting ``test_`` or ``Test`` + capital (``test_custom_model_separable``,
  ``TestQuerySet``); a pytest node id ``tests/x.py::TestA::test_b`` gives its path and each name.
- ``class``: a CamelCase name with at least two capitals and a lower-case letter (``QuerySet``,
  ``AdminSite``, ``Linear1D``), or any name after ``class``.
- ``constant``: UPPER_CASE with an underscore (``DEFAULT_AUTO_FIELD``).
- ``function``: a name with an underscore (``construct_instance``, ``_cstack``), a mixedCase
  name (``emptyPrinter``), or a plain name in code that is called (``render(``, unless on a
  standard-library module or a one- or two-letter alias: ``np.array(`` is not) or defined
  (``def render``).
- ``dotted``: ``a.b`` names (``models.Model``, ``django.db.models.query``) whose head is not a
  standard-library module, ``self``/``cls`` or a name of one or two characters (``np``, ``m``,
  ``e.g``), and that have three parts or a part with an underscore or a capital (so
  ``result.shape`` is not one; ``separable._cstack`` is).
- ``operand``: a plain word of a ``grep``/``rg`` pattern or of a pytest ``-k`` expression
  (``grep -rn "render" django`` gives ``render``).

"Code" is the text of commands' scripts (here-document bodies, ``python -c``, the script of
``sed``/``awk``/``perl``), fenced blocks and backticked spans of assistant text. In plain
assistant prose only names of a distinctive shape count (underscore, CamelCase, dotted, file
extension), never a plain word. ``echo``/``printf`` arguments are not read. A string escape
written out in a script (``\\n``, ``\\t``, ``\\r`` as two characters, as in ``python -c
"print('\\nTesting')"``) separates words: its letter is no part of the next one.

**Stop list** (never a fact): Python keywords and builtins, dunder names (``__init__``), the
attributes of Python's built-in types, of ``unittest`` and of ``unittest.TestCase``
(``append``, ``split``, ``TestCase``, ``assertEqual``), names shorter than three characters,
the names of common shell programs, plural acronyms in prose (``URLs``), a two-part dotted
name ending in one of those (``new_lines.append``), and the parts of a path
(``reproduce_issue.py`` is a path, not also a function ``reproduce_issue``).

**Gold** = candidates that occur in the compacted range (anywhere in it: text, arguments, tool
outputs) and occur neither in the carried system prompt and first task message nor in the
messages kept verbatim between the range and the cut (the protected tail): those are in every
method's history, so no method can lose them.

**Occurs** (one rule for "in the range", "in the prompt or tail" and "present in a compacted
history"), case-sensitive, as a whole token:

- names (every kind but paths): not preceded or followed by a letter, digit or ``_``. A dotted
  name may be preceded by ``.``: ``django.db.models.Model`` contains ``models.Model``, and
  ``forms.models.construct_instance`` contains ``construct_instance``;
- paths: not followed by a name character, ``/`` or ``-`` (nor by ``.`` and a name character),
  and not preceded by a name character, ``.`` or ``-``; a ``/`` may precede it. So the longer
  path ``/testbed/django/forms/models.py`` or ``./django/forms/models.py`` shows
  ``django/forms/models.py`` (it says strictly more), but the basename ``models.py`` alone
  does not show ``django/forms/models.py``, and ``django/forms/models.py`` does not show
  ``/testbed/django/forms/models.py``.
"""

from __future__ import annotations

import builtins
import json
import keyword
import re
import shlex
import sys
import unittest
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

KINDS = ("path", "diff_file", "test", "class", "function", "constant", "dotted", "operand")


def _words(text: str) -> list[str]:
    return text.split()


EXTENSIONS = _words(
    "py pyi pyx pxd c h cc cpp hpp js mjs ts jsx tsx css scss html htm xml json yaml yml toml "
    "ini cfg txt rst md in sh bat po mo csv tsv sql j2 jinja tpl tmpl rb go rs java kt svg "
    "png jpg gif pdf dot epub lock log out patch diff"
)

_BUILTIN_TYPES = (str, bytes, list, dict, set, frozenset, tuple, int, float, complex, object)
STOP_NAMES = frozenset(
    set(keyword.kwlist)
    | set(keyword.softkwlist)
    | set(dir(builtins))
    | {name for t in _BUILTIN_TYPES for name in dir(t)}
    | set(dir(unittest.TestCase))
    | set(dir(unittest))
    | {"self", "cls", "THOUGHT", "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}
    | set(
        _words(
            "ls cat sed awk grep egrep rg find head tail nl wc echo printf cd pwd git python "
            "python3 pip pytest rm cp mv mkdir touch diff sort uniq xargs tee chmod env sudo "
            "timeout bash sh true false export source which test"
        )
    )
)
STDLIB = frozenset(sys.stdlib_module_names)

_EXT = "|".join(EXTENSIONS)
# A file path: optional directories, a name, a known extension; whole (see "Occurs" above).
FILE_PATH_RE = re.compile(
    rf"(?<![\w.\-/])(?:\.{{1,2}}/|/)?(?:[\w.\-]+/)*[\w\-][\w.\-]*\.(?:{_EXT})(?![\w/\-])(?!\.\w)"
)
IDENT_RE = re.compile(r"(?<![\w])[A-Za-z_]\w*")
DOTTED_RE = re.compile(r"(?<![\w.])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?![\w])")
CALL_RE = re.compile(r"(?<![\w.])((?:[A-Za-z_]\w*\.)*)([A-Za-z_]\w*)\s*\(")
DEF_RE = re.compile(r"^[ \t]*(?:async[ \t]+)?(def|class)[ \t]+([A-Za-z_]\w*)[ \t]*[(:]", re.M)
NODE_ID_RE = re.compile(r"(?<![\w.\-/])((?:[\w.\-]+/)*[\w.\-]+\.py)((?:::[\w\[\]\-.]+)+)")
FENCE_RE = re.compile(r"```[\w+-]*\n?(.*?)(?:```|$)", re.S)
BACKTICK_RE = re.compile(r"`([^`\n]+)`")
HEREDOC_RE = re.compile(
    r"<<-?\s*(['\"]?)([A-Za-z_]\w*)\1([^\n]*)\n(.*?)(?:\n[ \t]*\2[ \t]*(?=\n|$)|$)", re.S
)
DIFF_FILE_RE = re.compile(r"^diff --git a/(\S+) b/(\S+)", re.M)
# A string escape as a script in a command holds it (two characters): ``print("\nTesting")``
# names no ``nTesting``.
ESCAPE_RE = re.compile(r"\\[ntr]")
PATHISH_RE = re.compile(r"[\w.\-]*(?:/[\w.\-]+)+/?")
SLASH_WORD_RE = re.compile(r"^/?(?:[\w.\-]+/)+[\w.\-]*$")
GLOB_CHARS = set("*?[]{}$<>|;&'\"`=,()\\")

SHELL_SCRIPT_PROGRAMS = {"sed", "awk", "gawk", "perl"}
GREP_PROGRAMS = {"grep", "egrep", "fgrep", "rg", "ag", "ack"}
TEXT_PROGRAMS = {"echo", "printf"}
WRAPPERS = {"sudo", "env", "time", "nohup", "xargs"}
# Options that take the next word as their value, per program family.
GREP_VALUE_OPTIONS = {"-A", "-B", "-C", "-m", "-f", "--include", "--exclude", "--exclude-dir"}
SED_VALUE_OPTIONS = {"-f", "-l"}
PYTEST_VALUE_OPTIONS = {"-p", "-c", "--tb", "-W", "--rootdir", "--ds", "-o", "-n", "--maxfail"}


@dataclass(frozen=True, order=True)
class Fact:
    text: str
    kind: str


# --- wire messages --------------------------------------------------------------------------


def content_text(message: dict[str, Any]) -> str:
    """The text of an OpenAI-format message's content (a string, or text parts)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def decoded_arguments(arguments: str) -> list[tuple[str, str]]:
    """(key, value) of every string in a tool call's JSON arguments; the raw text if not JSON."""
    try:
        value = json.loads(arguments)
    except (ValueError, TypeError):
        return [("", arguments)]
    out: list[tuple[str, str]] = []
    pending: list[tuple[str, Any]] = [("", value)]
    while pending:
        key, item = pending.pop()
        if isinstance(item, str):
            out.append((key, item))
        elif isinstance(item, dict):
            pending.extend((str(k), v) for k, v in item.items())
        elif isinstance(item, list):
            pending.extend((key, v) for v in item)
    return out[::-1]


def tool_calls(message: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, raw arguments) of an assistant message's tool calls."""
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        calls.append((str(fn.get("name", "")), str(fn.get("arguments", ""))))
    return calls


def message_text(message: dict[str, Any]) -> str:
    """Everything a model reads of a message, arguments decoded (so ``\\n`` is a newline)."""
    parts = [content_text(message)]
    for name, arguments in tool_calls(message):
        parts.append(name)
        parts.extend(value for _, value in decoded_arguments(arguments))
    return "\n".join(p for p in parts if p)


# --- names and paths -------------------------------------------------------------------------


def normalize_path(word: str) -> str:
    word = re.sub(r":\d+(?::\d+)?$", "", word)
    while word.startswith("./"):
        word = word[2:]
    return word.rstrip("/") if len(word) > 1 else word


def is_path_word(word: str) -> bool:
    """A command operand or backticked word that names a file or directory."""
    if not word or "//" in word or any(c in GLOB_CHARS for c in word) or word.startswith("-"):
        return False
    if FILE_PATH_RE.fullmatch(word):
        return True
    return bool(SLASH_WORD_RE.match(word)) and any(c.isalpha() for c in word)


def path_fact(word: str) -> Fact | None:
    word = normalize_path(word)
    if word in ("", ".", "..", "/") or not any(c.isalpha() for c in word):
        return None
    return Fact(word, "path") if is_path_word(word) else None


def name_kind(name: str, *, plain_ok: bool) -> str | None:
    """The kind of an identifier, or None when it is not a fact (stop list, plain word)."""
    if len(name) < 3 or name in STOP_NAMES or (name.startswith("__") and name.endswith("__")):
        return None
    core = name.lstrip("_")
    if not core or not core[0].isalpha():
        return None
    if re.fullmatch(r"[A-Z]{2,}s", core):
        return None  # a plural acronym in prose (``URLs``), not a name
    if core.startswith("test_") or re.match(r"Test[A-Z_]", core):
        return "test"
    if "_" in core and core.upper() == core:
        return "constant" if any(c.isalpha() for c in core) else None
    uppers = sum(c.isupper() for c in core)
    if core[0].isupper() and uppers >= 2 and any(c.islower() for c in core):
        return "class"
    if "_" in name or (core[0].islower() and uppers >= 1):
        return "function"
    return "function" if plain_ok else None


def name_fact(name: str, *, plain_ok: bool = False, kind: str | None = None) -> Fact | None:
    found = name_kind(name, plain_ok=plain_ok)
    if found is None:
        return None
    return Fact(name, kind if kind and found == "function" else found)


def dotted_fact(name: str) -> Fact | None:
    parts = name.split(".")
    head = parts[0]
    if parts[-1] in EXTENSIONS or head in STDLIB or head in ("self", "cls") or len(head) <= 2:
        return None
    if len(parts) == 2 and parts[1] in STOP_NAMES:
        return None  # a built-in method on a local (``new_lines.append``)
    distinctive = len(parts) >= 3 or any(
        "_" in p.strip("_") or (p[:1].isupper() and any(c.islower() for c in p)) for p in parts
    )
    return Fact(name, "dotted") if distinctive else None


def names_in(text: str) -> Iterator[Fact]:
    """Facts of a distinctive shape anywhere in ``text`` (prose or code): file paths, dotted
    names, and identifiers with an underscore or capitals. Plain words are never taken here."""
    text = ESCAPE_RE.sub(" ", text)
    for m in FILE_PATH_RE.finditer(text):
        fact = path_fact(m.group(0))
        if fact:
            yield fact
    # The parts of a path are not names of their own (``reproduce_issue.py`` is no function).
    text = PATHISH_RE.sub(" ", FILE_PATH_RE.sub(" ", text))
    for m in DOTTED_RE.finditer(text):
        fact = dotted_fact(m.group(0))
        if fact:
            yield fact
    for m in IDENT_RE.finditer(text):
        fact = name_fact(m.group(0))
        if fact:
            yield fact


def code_facts(code: str) -> Iterator[Fact]:
    """:func:`names_in`, plus plain names that code calls or defines, and pytest node ids."""
    yield from names_in(code)
    yield from node_id_facts(code)
    for m in CALL_RE.finditer(code):
        qualifier = m.group(1).split(".")[0]
        if qualifier and (qualifier in STDLIB or len(qualifier) <= 2):
            continue
        fact = name_fact(m.group(2), plain_ok=True)
        if fact:
            yield fact
    for m in DEF_RE.finditer(code):
        fact = name_fact(m.group(2), plain_ok=True)
        if fact and m.group(1) == "class" and fact.kind == "function":
            fact = Fact(fact.text, "class")  # ``class Model``: a plain name, but a class
        if fact:
            yield fact


def node_id_facts(text: str) -> Iterator[Fact]:
    """``path.py::Class::test[param]``: the path, and each name (its parameters dropped)."""
    for m in NODE_ID_RE.finditer(text):
        fact = path_fact(m.group(1))
        if fact:
            yield fact
        for part in m.group(2).split("::")[1:]:
            name = part.split("[")[0]
            found = name_fact(name, plain_ok=True)
            if found:
                yield found


def prose_facts(text: str) -> Iterator[Fact]:
    """Assistant text: fenced blocks and backticked spans are code (a backticked word with a
    ``/`` is a path); the rest gives only names of a distinctive shape."""
    rest = text
    for m in FENCE_RE.finditer(text):
        body = m.group(1)
        yield from code_facts(body)
        yield from shell_facts(body)
    rest = FENCE_RE.sub(" ", rest)
    for m in BACKTICK_RE.finditer(rest):
        span = m.group(1).strip()
        yield from code_facts(span)
        fact = path_fact(span) if " " not in span else None
        if fact:
            yield fact
    yield from names_in(BACKTICK_RE.sub(" ", rest))


# --- shell commands --------------------------------------------------------------------------


def split_heredocs(command: str) -> tuple[str, list[str]]:
    """The command with here-document bodies removed, and the bodies."""
    bodies: list[str] = []

    def cut(m: re.Match[str]) -> str:
        bodies.append(m.group(4))
        return f"<<{m.group(2)}{m.group(3)}\n"

    return HEREDOC_RE.sub(cut, command), bodies


def simple_commands(command: str) -> Iterator[list[str]]:
    """Words of each simple command (split at ``&&``, ``||``, ``|``, ``;``, newlines, parens);
    redirection targets stay as words after their operator."""
    for line in command.replace("\\\n", " ").split("\n"):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            words = list(lexer)
        except ValueError:  # unbalanced quotes: words as whitespace splits them
            words = line.split()
        current: list[str] = []
        for word in words:
            if word and set(word) <= set(";&|()"):
                if current:
                    yield current
                current = []
            else:
                current.append(word)
        if current:
            yield current


def shell_facts(command: str) -> Iterator[Fact]:
    body_free, bodies = split_heredocs(command)
    for body in bodies:
        yield from code_facts(body)
    for words in simple_commands(body_free):
        yield from command_facts(words)


def command_facts(words: list[str]) -> Iterator[Fact]:
    i = 0
    while i < len(words) and ("=" in words[i].split("/")[0] or words[i] in WRAPPERS):
        i += 1  # VAR=value and wrappers before the program
    if i < len(words) and words[i] == "timeout":
        i += 2
    if i >= len(words):
        return
    program = words[i].rsplit("/", 1)[-1]
    args = words[i + 1 :]
    if program in TEXT_PROGRAMS:
        return
    if program in ("python", "python3") or re.fullmatch(r"python3\.\d+", program):
        yield from python_facts(args)
    elif program in ("pytest", "py.test"):
        yield from pytest_facts(args)
    elif program in GREP_PROGRAMS:
        yield from grep_facts(args)
    elif program == "git" and args[:1] == ["grep"]:
        yield from grep_facts(args[1:])
    elif program in SHELL_SCRIPT_PROGRAMS:
        yield from script_program_facts(args)
    else:
        if is_path_word(words[i]):
            fact = path_fact(words[i])
            if fact:
                yield fact
        yield from operand_facts(args)


def operand_facts(words: Iterable[str]) -> Iterator[Fact]:
    """Plain operands: paths, and names of a distinctive shape (``admin_views.tests``)."""
    for word in words:
        if word in ("<", ">", ">>", "2") or (word.startswith("-") and "=" not in word):
            continue
        value = word.split("=", 1)[1] if word.startswith("-") else word
        fact = path_fact(value) if is_path_word(normalize_path(value)) else None
        if fact:
            yield fact
        else:
            yield from names_in(value)
            yield from node_id_facts(value)


def python_facts(args: list[str]) -> Iterator[Fact]:
    if "-c" in args:
        k = args.index("-c")
        if k + 1 < len(args):
            yield from code_facts(args[k + 1])
        yield from operand_facts(args[k + 2 :])
        return
    if "-m" in args:
        k = args.index("-m")
        module = args[k + 1] if k + 1 < len(args) else ""
        if module == "pytest":
            yield from pytest_facts(args[k + 2 :])
            return
        fact = dotted_fact(module) or name_fact(module)
        if fact:
            yield fact
        yield from operand_facts(args[k + 2 :])
        return
    yield from operand_facts(args)


def pytest_facts(args: list[str]) -> Iterator[Fact]:
    skip = False
    for k, word in enumerate(args):
        if skip:
            skip = False
            continue
        if word == "-k" and k + 1 < len(args):
            skip = True
            for name in IDENT_RE.findall(args[k + 1]):
                if name not in ("and", "or", "not"):
                    fact = name_fact(name, plain_ok=True, kind="operand")
                    if fact:
                        yield fact
            continue
        if word in PYTEST_VALUE_OPTIONS:
            skip = True
            continue
        if word.startswith("-"):
            continue
        if "::" in word:
            yield from node_id_facts(word)
        else:
            yield from operand_facts([word])


def grep_facts(args: list[str]) -> Iterator[Fact]:
    pattern: str | None = None
    operands: list[str] = []
    skip = False
    for k, word in enumerate(args):
        if skip:
            skip = False
            continue
        if word in ("-e", "--regexp") and k + 1 < len(args):
            pattern = args[k + 1]
            skip = True
        elif word in GREP_VALUE_OPTIONS:
            skip = True
        elif word.startswith("-"):
            continue
        elif pattern is None:
            pattern = word
        else:
            operands.append(word)
    if pattern:
        yield from pattern_facts(pattern)
    yield from operand_facts(operands)


def pattern_facts(pattern: str) -> Iterator[Fact]:
    """The names a search pattern looks for: distinctive ones by shape, plain words (three
    letters or more, regex escapes like ``\\s`` removed) as operands."""
    cleaned = re.sub(r"\\[A-Za-z]", " ", pattern)
    yield from code_facts(cleaned)
    for name in IDENT_RE.findall(cleaned):
        fact = name_fact(name, plain_ok=True, kind="operand")
        if fact:
            yield fact


def script_program_facts(args: list[str]) -> Iterator[Fact]:
    script: str | None = None
    operands: list[str] = []
    skip = False
    for k, word in enumerate(args):
        if skip:
            skip = False
            continue
        if word in ("-e", "--expression") and k + 1 < len(args):
            script = (script or "") + "\n" + args[k + 1]
            skip = True
        elif word in SED_VALUE_OPTIONS:
            skip = True
        elif word.startswith("-"):
            continue
        elif script is None:
            script = word
        else:
            operands.append(word)
    if script:
        yield from code_facts(script)
    yield from operand_facts(operands)


# --- a conversation's gold ---------------------------------------------------------------------


def later_candidates(future: list[dict[str, Any]]) -> dict[str, Fact]:
    """Candidate facts of the messages after the cut, by text (the first kind found wins, a
    file of the final diff is a ``diff_file`` whatever else it was)."""
    found: dict[str, Fact] = {}
    for message in future:
        if message.get("role") != "assistant":
            continue
        for fact in prose_facts(content_text(message)):
            found.setdefault(fact.text, fact)
        for name, arguments in tool_calls(message):
            for key, value in decoded_arguments(arguments):
                facts = (
                    shell_facts(value)
                    if key in ("command", "cmd", "") or name in ("bash", "shell")
                    else operand_facts([value])
                    if key in ("path", "file", "file_path", "filename")
                    else code_facts(value)
                )
                for fact in facts:
                    found.setdefault(fact.text, fact)
    for path in final_diff_files(future):
        found[path] = Fact(path, "diff_file")
    return found


def final_diff_files(future: list[dict[str, Any]]) -> list[str]:
    """The files of the submitted diff: the headers of the conversation's last message."""
    if not future:
        return []
    text = content_text(future[-1])
    return list(dict.fromkeys(m.group(2) for m in DIFF_FILE_RE.finditer(text)))


@lru_cache(maxsize=1 << 16)
def fact_pattern(text: str, kind: str) -> re.Pattern[str]:
    escaped = re.escape(text)
    if kind in ("path", "diff_file"):
        return re.compile(rf"(?:(?<=/)|(?<![\w.\-/])){escaped}(?![\w/\-])(?!\.\w)")
    return re.compile(rf"(?<![\w]){escaped}(?![\w])")


def occurs(fact: Fact, text: str) -> bool:
    """Whether ``fact`` occurs in ``text`` as a whole token (see the module docstring)."""
    return fact.text in text and fact_pattern(fact.text, fact.kind).search(text) is not None


def gold_facts(messages: list[dict[str, Any]], cut: int, start: int, end: int) -> list[Fact]:
    """The gold facts of a conversation cut before ``messages[cut]`` and compacted over
    ``messages[start:end]``: later candidates in the range, not in the system prompt and first
    task message, nor in ``messages[end:cut]``."""
    candidates = later_candidates(messages[cut:])
    in_range = "\n".join(message_text(m) for m in messages[start:end])
    prompt = "\n".join(message_text(m) for m in first_task(messages))
    tail = "\n".join(message_text(m) for m in messages[end:cut])
    return sorted(
        f
        for f in candidates.values()
        if occurs(f, in_range) and not occurs(f, prompt) and not occurs(f, tail)
    )


def first_task(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The leading system messages and the first user message after them."""
    k = 0
    while k < len(messages) and messages[k].get("role") in ("system", "developer"):
        k += 1
    head = messages[:k]
    if k < len(messages) and messages[k].get("role") == "user":
        head.append(messages[k])
    return head


def present(facts: Iterable[Fact], text: str) -> list[Fact]:
    return [f for f in facts if occurs(f, text)]


ORIGINS = ("call arguments", "assistant text", "user text", "tool output only")


def origins(facts: Iterable[Fact], ranged: list[dict[str, Any]]) -> dict[Fact, str]:
    """Where the range holds each fact, the first of :data:`ORIGINS` that has it: the agent's
    own calls, its text, a user message, else only what tools printed."""
    texts = [
        "\n".join(
            value for m in ranged for _, a in tool_calls(m) for _, value in decoded_arguments(a)
        ),
        "\n".join(content_text(m) for m in ranged if m.get("role") == "assistant"),
        "\n".join(content_text(m) for m in ranged if m.get("role") == "user"),
    ]
    return {
        f: next((o for o, t in zip(ORIGINS, texts, strict=False) if occurs(f, t)), ORIGINS[3])
        for f in facts
    }
