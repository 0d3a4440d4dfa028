"""The names users import, pinned: each public module's ``__all__`` is exactly the list below
(a new public name is a deliberate change to this file), every listed name resolves, every
other public attribute is an import, a module, an old name kept as another name of a listed
object, or one of the few internals pinned here; ``import worker`` stays cheap."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent.parent

FACES: dict[str, list[str]] = {
    "worker": [
        "AsyncCompactingSession",
        "BrokerUnavailable",
        "Client",
        "CompactingSession",
        "CompactionEvent",
        "CompactorError",
        "CompletedEvent",
        "ConfigError",
        "ElidedEvent",
        "EventMismatch",
        "FailedEvent",
        "InvalidSnapshot",
        "OtherEvent",
        "PermanentError",
        "RedisUnavailable",
        "RejectedEvent",
        "SkippedEvent",
        "StorageError",
        "TransientError",
        "__version__",
        "apply_compaction",
        "local_stack",
        "parse_event",
        "project",
    ],
    "worker.client": [
        "BrokerUnavailable",
        "Client",
        "CompactorError",
        "ConfigError",
        "EventMismatch",
        "InvalidRequest",
        "InvalidSnapshot",
        "NoSnapshot",
        "RedisUnavailable",
        "RequestResult",
        "StorageError",
        "SubmitResult",
        "apply_compaction",
        "parse_event",
        "project",
        "restore",
        "restore_conversation",
    ],
    "worker.session": [
        "COMPACT_DESCRIPTION",
        "COMPACT_TOOL_NAME",
        "RECALL_TOOL_NAME",
        "AsyncCompactingSession",
        "CompactTool",
        "CompactingSession",
        "RecallTool",
        "SessionStatus",
    ],
    "worker.local": ["LocalStack", "local_stack"],
    "worker.testing": [
        "Fault",
        "RecordedRequest",
        "StandinLLM",
        "anthropic_messages_errors",
        "openai_chat_errors",
        "standin_summary",
    ],
    "worker.testing.standin_llm": [
        "Fault",
        "RecordedRequest",
        "StandinLLM",
        "main",
        "standin_summary",
    ],
    "worker.testing.llm_schema": ["anthropic_messages_errors", "openai_chat_errors"],
    "worker.integrations": [],
    "worker.integrations.agent_framework": [
        "EXTRA_KEY",
        "CompactingContextProvider",
        "from_wire",
        "to_wire",
    ],
    "worker.integrations.google_adk": [
        "EXTRA_KEY",
        "CompactingEventsSummarizer",
        "from_wire",
        "to_wire",
    ],
    "worker.integrations.langchain": [
        "EXTRA_KEY",
        "CompactingMiddleware",
        "CompactingPreModelHook",
        "SessionSource",
        "from_wire",
        "to_wire",
    ],
    "worker.integrations.openai_agents": [
        "EXTRA_KEY",
        "CompactingAgentSession",
        "from_wire",
        "to_wire",
    ],
}

# Names of earlier releases, still working as other names of the same objects.
OLD_NAMES: dict[str, dict[str, str]] = {
    "worker.integrations.agent_framework": {"to_openai": "to_wire", "from_openai": "from_wire"},
    "worker.integrations.langchain": {
        "CompactionMiddleware": "CompactingMiddleware",
        "CompactionHook": "CompactingPreModelHook",
        "EXTENSION": "EXTRA_KEY",
    },
    "worker.integrations.openai_agents": {
        "items_to_chat": "to_wire",
        "chat_to_items": "from_wire",
        "ITEMS_KEY": "EXTRA_KEY",
    },
}

# Module-level names that look public but are not part of the face: each module's logger, and
# the session's tunables. A name may leave this list (the module no longer has it); a new one
# joins it only deliberately.
INTERNAL: dict[str, set[str]] = {
    "worker.client": {"log", "checked_edit"},  # checked_edit: shared with worker.api.review
    "worker.session": {
        "log",
        "STATE_VERSION",
        "BACKOFF_START_S",
        "BACKOFF_MAX_S",
        "INBOX_SIZE",
        "TRANSCRIPTS_KEPT",
    },
    "worker.integrations.agent_framework": {"log"},
    "worker.integrations.google_adk": {"log"},
    "worker.integrations.langchain": {"log"},
    "worker.integrations.openai_agents": {"log"},
}


def bindings(module: ModuleType) -> tuple[set[str], set[str]]:
    """(names the module's own top-level statements define, names its imports bind), read
    from its source: an import under ``if TYPE_CHECKING`` counts as an import."""
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    defined: set[str] = set()
    imported: set[str] = set()
    statements = list(tree.body)
    while statements:
        node = statements.pop()
        if isinstance(node, ast.If | ast.Try):
            statements += [*node.body, *node.orelse]
        elif isinstance(node, ast.Import | ast.ImportFrom):
            imported.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined.update(t.id for t in targets if isinstance(t, ast.Name))
    return defined, imported


@pytest.mark.parametrize("name", sorted(FACES))
def test_each_public_module_lists_exactly_its_supported_names(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__all__ == FACES[name]


@pytest.mark.parametrize("name", sorted(FACES))
def test_every_listed_name_resolves_and_a_star_import_gives_exactly_them(name: str) -> None:
    module = importlib.import_module(name)
    for attribute in module.__all__:
        assert getattr(module, attribute) is not None, f"{name}.{attribute}"
        assert attribute in dir(module)
    namespace: dict[str, object] = {}
    exec(f"from {name} import *", namespace)
    assert sorted(set(namespace) - {"__builtins__"}) == sorted(module.__all__)


@pytest.mark.parametrize("name", sorted(FACES))
def test_every_other_public_name_is_an_import_a_module_an_old_name_or_pinned(name: str) -> None:
    module = importlib.import_module(name)
    for attribute in module.__all__:
        getattr(module, attribute)  # a lazy name lands in the module's namespace
    defined, imported = bindings(module)
    public = {n for n in {*vars(module), *defined, *dir(module)} if not n.startswith("_")}
    unlisted = {
        n
        for n in public - set(module.__all__) - set(OLD_NAMES.get(name, {}))
        if n not in imported and not isinstance(getattr(module, n, None), ModuleType)
    }
    assert unlisted <= INTERNAL.get(name, set()), (
        f"{name}: public but not in __all__: {sorted(unlisted - INTERNAL.get(name, set()))} "
        "(add it to __all__ and FACES, or make it private)"
    )


RENAMES = [(module, old, new) for module, names in OLD_NAMES.items() for old, new in names.items()]


@pytest.mark.parametrize(("name", "old", "new"), RENAMES)
def test_an_old_name_still_works_as_the_new_one(name: str, old: str, new: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {name} import {old}, {new}", namespace)
    assert namespace[old] is namespace[new]
    module = importlib.import_module(name)
    assert old not in module.__all__ and new in module.__all__
    assert module.__doc__ is not None and f"``{old}``" in module.__doc__  # documented as old
    assert f"`{old}`" in (REPO / "docs" / "integrations.md").read_text(encoding="utf-8")


def test_the_short_names_are_the_modules_own_objects() -> None:
    import worker

    for home in ("worker.client", "worker.session", "worker.local"):
        module = importlib.import_module(home)
        for attribute in set(worker.__all__) & set(module.__all__):
            assert getattr(worker, attribute) is getattr(module, attribute), attribute
    assert worker.__version__ == importlib.metadata.version("compaction-worker")


def test_the_integrations_read_alike() -> None:
    """Each adapter module offers a Compacting* class, to_wire / from_wire and EXTRA_KEY."""
    for name in FACES:
        if not name.startswith("worker.integrations."):
            continue
        names = FACES[name]
        assert {"EXTRA_KEY", "to_wire", "from_wire"} <= set(names), name
        assert any(n.startswith("Compacting") for n in names), name


PROBE = """
import json, sys

def loaded():
    return sorted(m for m in sys.modules if m.split(".")[0] in HEAVY or m.startswith("worker"))

HEAVY = {"celery", "kombu", "redis", "starlette", "uvicorn", "httpx", "langchain", "agents",
         "agent_framework", "boto3", "psycopg"}
steps = {}
import worker
steps["import worker"] = loaded()
from worker import CompactorError, CompletedEvent, apply_compaction, parse_event
steps["pure names"] = loaded()
worker.Client, worker.CompactingSession, worker.local_stack
steps["agent names"] = loaded()
import worker.testing
steps["import worker.testing"] = loaded()
worker.testing.StandinLLM
steps["StandinLLM"] = loaded()
worker.app
steps["worker.app"] = loaded()
print(json.dumps(steps))
"""


def test_import_worker_imports_nothing_until_a_name_is_used(subprocesses: None) -> None:
    run = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, cwd=REPO
    )
    steps = json.loads(run.stdout)

    def roots(step: str) -> set[str]:
        return {m.split(".")[0] for m in steps[step] if not m.startswith("worker")}

    assert steps["import worker"] == ["worker"]
    assert roots("pure names") == set()  # events, errors, apply_compaction: no Redis client
    assert "worker.client" not in steps["pure names"]
    assert roots("agent names") == {"redis"}  # Client talks to Redis, and imports no Celery
    assert "worker.testing.standin_llm" not in steps["import worker.testing"]
    assert "worker.testing.standin_llm" in steps["StandinLLM"]
    assert "celery" in roots("worker.app")  # ``celery -A worker`` still finds its app
