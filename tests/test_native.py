"""The modules tools/native.py compiles with mypyc: never stale, and the same as their sources.

An extension module shadows its ``.py``, so an extension older than its source would run old
code under new tests: the manifest's digests must match the sources. And compiled code must
answer as the interpreted source does: each module's source is loaded again, interpreted,
beside the compiled one, and both are given the same inputs (hypothesis texts, and the corpus's
tool outputs when it is present)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.wire.models import Message, ToolCall

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "worker" / "_native.json"


def _native_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("native_tool", ROOT / "tools" / "native.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NATIVE = _native_tool()
MODULE_NAMES = [m.removesuffix(".py").replace("/", ".") for m in NATIVE.MODULES]


def _manifest() -> dict[str, Any]:
    if not MANIFEST.exists():
        return {"compiled": False, "sources": {}}
    loaded: dict[str, Any] = json.loads(MANIFEST.read_text())
    return loaded


def _is_extension(module: ModuleType) -> bool:
    return isinstance(getattr(module, "__loader__", None), importlib.machinery.ExtensionFileLoader)


def test_every_listed_module_exists_and_is_in_the_makefile() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "tools/native.py" in makefile
    for path in NATIVE.MODULES:
        assert (ROOT / path).is_file(), path


def test_no_extension_is_left_of_a_module_no_longer_listed() -> None:
    """A module taken off the list keeps no extension: its shim would load the group, which no
    longer holds it, and every import of the package would fail."""
    listed = {ROOT / m.removesuffix(".py") for m in NATIVE.MODULES}
    for path in NATIVE.built_files():
        module = path.parent / path.name.split(".")[0]
        assert module in listed or path.name.startswith("native__mypyc"), path


def test_a_rebuild_removes_the_extension_of_a_module_taken_off_the_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``built_files`` (what a build or --clean removes first) finds any extension under
    worker/, listed or not (here in a copy of the layout, not in the checkout)."""
    suffix = NATIVE.sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    leftover = tmp_path / "worker" / "wire" / "formats" / f"taken_off{suffix}"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"")
    (tmp_path / "worker" / "wire" / "formats" / "taken_off.py").write_text("")
    monkeypatch.setattr(NATIVE, "ROOT", tmp_path)
    monkeypatch.setattr(NATIVE, "MANIFEST", tmp_path / "worker" / "_native.json")
    assert NATIVE.built_files() == [leftover]
    NATIVE.clean()
    assert not leftover.exists()


@pytest.mark.parametrize("name", MODULE_NAMES)
def test_a_compiled_module_is_built_from_its_current_source(name: str) -> None:
    module = importlib.import_module(name)
    manifest = _manifest()
    path = name.replace(".", "/") + ".py"
    if not _is_extension(module):
        assert not manifest["compiled"] or path not in manifest["sources"], (
            f"{name} was compiled but runs interpreted: run `make native`"
        )
        return
    digest = hashlib.sha256((ROOT / path).read_bytes()).hexdigest()
    assert manifest["compiled"] and manifest["sources"].get(path) == digest, (
        f"{name} is an extension built from an older source: run `make native` "
        "(or `python tools/native.py --clean` to run it interpreted)"
    )


def _interpreted(name: str) -> ModuleType:
    """The module's source, loaded and run by the interpreter under a name of its own (it
    imports the other modules as they are installed, compiled or not)."""
    path = ROOT / (name.replace(".", "/") + ".py")
    alias = f"_interpreted_{name.replace('.', '_')}"
    if alias in sys.modules:
        return sys.modules[alias]
    loader = importlib.machinery.SourceFileLoader(alias, str(path))
    spec = importlib.util.spec_from_loader(alias, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module
    loader.exec_module(module)
    return module


def _both(name: str) -> tuple[ModuleType, ModuleType]:
    return importlib.import_module(name), _interpreted(name)


# Texts shaped like what a range holds: code, paths, calls, secrets, numbers, prose.
_PIECES = st.sampled_from(
    [
        "def configure(",
        "class QuerySet",
        "self.assertEqual(len(qs1.intersection(qs3",
        "django/db/models/query.py",
        "os.path.join(",
        "INSTALLED_APPS",
        "construct_instance",
        "_meta",
        "getValue",
        "tests/test_x.py::TestY::test_z",
        "export OPENAI_API_KEY=sk-abcdefghijklmnopqrstuvwxyz0123456789",
        "https://user:hunter2@example.com/x",
        "Authorization: Bearer abcdef0123456789abcdef",
        "ERROR: failed",
        "Traceback (most recent call last):",
        '  File "a/b.py", line 3, in f',
        "12345",
        "the quick brown fox",
        "--flag",
        "é ü 漢字",
        "\n",
        " ",
        "\t",
        "(",
        ".",
        "/",
    ]
)
_TEXTS = st.lists(st.one_of(_PIECES, st.text(max_size=12)), max_size=40).map("".join)


def _messages(texts: list[str]) -> list[Message]:
    out = []
    for k, text in enumerate(texts):
        if k % 3 == 0:
            call = ToolCall(id=f"c{k}", name="bash", arguments=json.dumps({"command": text}))
            out.append(
                Message(
                    id=f"a{k}", role="assistant", content=text, tool_calls=(call,), source_index=k
                )
            )
        elif k % 3 == 1:
            out.append(
                Message(
                    id=f"t{k}", role="tool", content=text, tool_call_id=f"c{k - 1}", source_index=k
                )
            )
        else:
            out.append(Message(id=f"u{k}", role="user", content=text, source_index=k))
    return out


def _fields(name: Any) -> tuple[str, int, int, int]:
    return (name.text, name.tier, name.count, name.last)  # a compiled dataclass has no __dict__


@settings(max_examples=60, deadline=None)
@given(st.lists(_TEXTS, min_size=1, max_size=6))
def test_compiled_and_interpreted_agree_on_a_range(texts: list[str]) -> None:
    messages = _messages(texts)
    compiled, interpreted = _both("worker.core.identifiers")
    assert [_fields(n) for n in compiled._code_names(messages)] == [
        _fields(n) for n in interpreted._code_names(messages)
    ]
    compiled, interpreted = _both("worker.core.redaction")
    for text in texts:
        ours, theirs = compiled.redact(text), interpreted.redact(text)
        assert (ours.text, dict(ours.counts)) == (theirs.text, dict(theirs.counts))
    compiled, interpreted = _both("worker.core.facts")
    assert repr(compiled._extract_facts(messages)) == repr(interpreted._extract_facts(messages))


@settings(max_examples=60, deadline=None)
@given(st.lists(_TEXTS, min_size=1, max_size=30).map("\n".join))
def test_compiled_and_interpreted_agree_on_a_tool_output(text: str) -> None:
    import worker.compress as compiled
    from worker.compress import tally

    interpreted_tally = _interpreted("worker.compress.tally")
    assert tally.runs(text.split("\n")) == interpreted_tally.runs(text.split("\n"))
    ours = tally.TokenTally().count([text])
    theirs = interpreted_tally.TokenTally().count([text])
    assert ours == theirs
    bounds, interpreted_bounds = _both("worker.tokens.bounds")
    assert bounds.segments(text) == interpreted_bounds.segments(text)
    compressed = compiled.compress_tool_result("bash", text, min_tokens=0)
    assert compiled.decompress_tool_result("bash", compressed) == text
