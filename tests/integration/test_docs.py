"""docs/ against the code: every setting documented with its default, links that resolve, the
submit script as the code runs it, no pointers to notes users do not have, and every code block
of README.md and docs/ run as written (tests/support/docs_runner.py) or validated."""

from __future__ import annotations

import base64
import json
import random
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic import BaseModel
from support.docs_runner import RUN, Block, blocks
from support.hosts_support import loopback_namespace_unavailable

from worker.backend import keys
from worker.backend.connection import redis_errors
from worker.backend.embedded import EmbeddedRedis
from worker.backend.queues import EVALUATE_TASK, task_message
from worker.backend.scripts import source
from worker.config import (
    BrokerConfig,
    CompactionConfig,
    HttpConfig,
    LLMConfig,
    ProxyConfig,
    RedisConfig,
    ToolConfig,
    TranscriptRetention,
    WebhooksConfig,
    WorkerConfig,
    settings_from_mapping,
)
from worker.errors import CompactorError
from worker.wire.history import range_digest
from worker.wire.models import CONVERSATION_ID_PATTERN

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
DOCS = REPO_ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
SECTIONS: dict[str, type[BaseModel]] = {
    "[compaction]": CompactionConfig,
    "[conversation.tools.NAME]": ToolConfig,
    "[llm]": LLMConfig,
    "[redis]": RedisConfig,
    "[broker]": BrokerConfig,
    "[transcripts]": TranscriptRetention,
    "[worker]": WorkerConfig,
    "[http]": HttpConfig,
    "[proxy]": ProxyConfig,
    "[webhooks]": WebhooksConfig,
}


def section_rows(text: str, heading: str) -> dict[str, str]:
    """setting -> its default cell, from the table under ``## `heading` `` (before any
    sub-heading)."""
    start = text.index(f"## `{heading}`\n") + 1
    end = text.find("\n#", start)
    body = text[start : end if end != -1 else len(text)]
    rows = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        match = re.fullmatch(r"`([a-z_]+)`", cells[0]) if line.startswith("|") else None
        if match and len(cells) >= 3:
            rows.setdefault(match.group(1), cells[1])
    return rows


def shown_default(value: Any) -> str:
    """A default as the page writes it: TOML values, ``"none"`` for None, ``unset`` for hints."""
    if value is None:
        return '`"none"`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (str, Path)):
        return f'`"{value}"`'
    if isinstance(value, list | dict):
        return f"`{json.dumps(value, separators=(', ', ': '))}`"
    return f"`{value}`"


@pytest.mark.parametrize("heading", SECTIONS)
def test_every_setting_is_documented_with_its_default(heading: str) -> None:
    rows = section_rows((DOCS / "configuration.md").read_text(), heading)
    model = SECTIONS[heading]
    assert sorted(rows) == sorted(model.model_fields), heading
    for name, field in model.model_fields.items():
        default = field.get_default(call_default_factory=True)
        if model is ToolConfig:
            assert rows[name] == "unset"
        elif name == "url":
            assert rows[name] == '`"none"`'  # a SecretStr, unset
        else:
            assert rows[name] == shown_default(default), f"{heading} {name}"


def test_every_key_is_documented() -> None:
    text = (DOCS / "redis-protocol.md").read_text()
    names = [n for n in dir(keys) if callable(getattr(keys, n)) and not n.startswith("_")]
    for name in names:
        args = {
            "published": ("<conv>", "<event_id>"),
            "webhooks": ("<tenant>",),
            "tenant_conversations": ("<tenant>",),
            "ui_session": ("<digest>",),
            "idle_conversations": ("<tenant>",),
            "idle_busy": ("<tenant>",),
        }
        key = getattr(keys, name)(*args.get(name, ("<conv>",)))
        assert f"| `{key}` |" in text, key
    for key in (keys.RECENT, keys.PENDING, keys.METRICS, keys.IDLE_TENANTS):
        assert f"| `{key}` |" in text, key


def test_the_submit_script_is_the_one_the_code_runs() -> None:
    text = (DOCS / "redis-protocol.md").read_text()
    block = re.search(r"```lua\n(.*?)```", text, re.S)
    assert block is not None
    documented = "\n".join(line.strip() for line in block.group(1).splitlines())
    submit = source("submit")
    assert documented.strip() == "\n".join(line.strip() for line in submit.splitlines()).strip()


@pytest.mark.parametrize("page", ["snapshot.md", "redis-protocol.md"])
def test_the_conversation_id_pattern_is_the_one_the_code_checks(page: str) -> None:
    text = (DOCS / page).read_text()
    patterns = re.findall(r"`(\^\[A-Za-z0-9.*?\$)`", text)
    assert patterns == [CONVERSATION_ID_PATTERN]
    assert "not starting with `.` or `-`" in text


def test_the_documented_task_message_has_the_headers_and_body_the_client_sends() -> None:
    text = (DOCS / "redis-protocol.md").read_text()
    section = text[text.index("<!-- protocol-submit -->") : text.index("<!-- /protocol-submit -->")]
    block = re.search(r"```json\n(.*?)```", section, re.S)
    assert block is not None
    documented = json.loads(block.group(1))
    args = json.loads(base64.b64decode(documented["body"]))[0]
    body, headers, _ = task_message(EVALUATE_TASK, args)
    assert json.loads(base64.b64decode(documented["body"])) == body
    assert list(documented["headers"]) == list(headers)
    same = {k: v for k, v in headers.items() if k not in ("id", "root_id", "origin")}
    assert {k: documented["headers"][k] for k in same} == same
    assert documented["headers"]["id"] == documented["headers"]["root_id"]
    assert documented["properties"]["correlation_id"] == documented["headers"]["id"]


def test_the_range_digest_example_is_what_the_code_computes() -> None:
    text = (DOCS / "events.md").read_text()
    example = '`[{"content":"héllo","id":"m1","role":"user"}]`, whose digest is\n'
    digest = range_digest([{"role": "user", "content": "héllo", "id": "m1"}])
    assert f"{example}`{digest}`" in text


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    text = page.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path_part, _, anchor = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        assert path.exists(), f"{page.name}: {target}"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
            assert anchor in {_anchor(h) for h in headings}, f"{page.name}: {target}"


def test_no_pointers_to_notes_users_do_not_have() -> None:
    pointer = re.compile(r"DESIGN\.md|\(issue [0-9]|seed's|RFD")
    for path in [REPO_ROOT / "README.md", *DOCS.rglob("*.md"), *DOCS.rglob("*.json")]:
        assert not pointer.search(path.read_text()), path


# --- code blocks ------------------------------------------------------------------------------

MARKDOWN = [REPO_ROOT / "README.md", *PAGES]
BLOCKS = [b for page in MARKDOWN for b in blocks(page)]
#: What a fence may hold: programs (run), data (validated), and text that is neither.
#: (typescript blocks, of docs/typescript.md, are run by
#: tests/integration/test_typescript_client.py.)
LANGUAGES = {"python", "sh", "json", "toml", "text", "lua", "sql", "typescript"}
RUN_PAGES = sorted({b.page for b in BLOCKS if b.runs})


def test_every_block_says_what_it_holds() -> None:
    assert [b.where for b in BLOCKS if b.lang not in LANGUAGES] == []


def test_blocks_not_run_are_few_and_say_why() -> None:
    """Every python and sh block runs, except the few that cannot: each says why."""
    not_run = [b for b in BLOCKS if b.lang in RUN and not b.runs]
    assert all(b.not_run_reason for b in not_run)
    assert len(not_run) <= 4, [f"{b.where}: {b.not_run_reason}" for b in not_run]
    assert [b.where for b in BLOCKS if b.background and b.lang != "sh"] == []
    assert [b.where for b in BLOCKS if b.directive and not (b.not_run_reason or b.background)] == []


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "json"], ids=lambda b: b.where)
def test_json_blocks_are_json(block: Block) -> None:
    text = block.text.strip()
    json.loads("{" + text + "}" if text.startswith('"') else text)  # a field: inside an object


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "toml"], ids=lambda b: b.where)
def test_toml_blocks_are_settings_the_service_accepts(block: Block) -> None:
    settings_from_mapping(tomllib.loads(block.text))


def extras() -> set[str]:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    return set(pyproject["project"]["optional-dependencies"])


def test_install_commands_name_extras_that_exist() -> None:
    texts = [p.read_text() for p in MARKDOWN + sorted((REPO_ROOT / "examples").glob("*.py"))]
    named = {
        extra
        for text in texts
        for group in re.findall(r"pip install [^\n`]*?\[([\w,-]+)\]", text)
        for extra in group.split(",")
    }
    assert named, "no install command found"
    assert named <= extras(), named - extras()
    assert not re.search(r"pip install '?compaction-worker", "\n".join(texts))  # not on an index


def test_the_readme_lists_every_extra() -> None:
    text = (REPO_ROOT / "README.md").read_text()
    table = text[text.index("| extra |") :].split("\n\n")[0]
    listed = set(re.findall(r"^\| `([\w-]+)` \| ", table, re.M))
    assert listed == extras()


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES)
def test_every_block_of_a_page_runs_as_written(page: str, subprocesses: None) -> None:
    """The page's blocks, in order, in a scratch checkout, in a network namespace with only
    loopback (tests/support/docs_runner.py says what each page gets)."""
    reason = loopback_namespace_unavailable()
    if reason:
        pytest.skip(reason)
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("COMPACTOR_")}
    proc = subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--net",
            sys.executable,
            str(REPO_ROOT / "tests" / "support" / "docs_runner.py"),
            page,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-4000:]


def error_table() -> dict[str, tuple[str, str]]:
    """The README's table of CLI failures: `error` -> (commands, exit code)."""
    text = (REPO_ROOT / "README.md").read_text()
    table = text[text.index("| failure | commands | `error` | exit |") :].split("\n\n")[0]
    rows = {}
    for line in table.splitlines()[2:]:
        _failure, commands, error, code = (c.strip() for c in line.strip("|").split("|"))
        rows[error.split()[0].strip("`")] = (commands, code)
    return rows


def test_the_error_table_has_a_row_for_each_redis_error_code() -> None:
    """Every code ``redis_errors`` converts redis-py's errors into."""
    codes = set()
    for error in (redis.exceptions.ConnectionError(), redis.exceptions.ResponseError("OOM")):
        with pytest.raises(CompactorError) as caught, redis_errors("testing"):
            raise error
        codes.add(caught.value.code)
    assert codes == {"redis_unavailable", "redis_error"}
    assert codes <= set(error_table())


def test_a_command_redis_refuses_ends_as_the_error_table_says(tmp_path: Path, run_cli: Any) -> None:
    """A real Redis out of memory under ``noeviction`` refuses the submit script: the CLI
    says ``redis_error`` and exits 1."""
    snapshot = tmp_path / "big.json"
    noise = base64.b64encode(random.Random(7).randbytes(3 * 1024 * 1024)).decode()
    messages = [{"id": "m1", "role": "user", "content": noise}]
    snapshot.write_text(
        json.dumps({"conversation_id": "c-big", "revision": 1, "messages": messages})
    )
    with EmbeddedRedis(directory=tmp_path / "redis", extra_args=("--maxmemory", "2mb")) as url:
        result = run_cli("submit", snapshot, env={"COMPACTOR_REDIS_URL": url})
    commands, code = error_table()["redis_error"]
    assert "`submit`" in commands
    assert result.code == int(code), result.stderr
    assert json.loads(result.stderr.splitlines()[-1])["error"] == "redis_error"
