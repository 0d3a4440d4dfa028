"""The command line as a process (DESIGN.md §4): exit codes, one JSON event per line on stdout,
one JSON error line on stderr (never a traceback), transcripts written only for completed
compactions, secrets never printed. Each command runs ``worker.cli.main`` (what ``python -m
worker`` runs) in this process, in a temp directory with a clean ``COMPACTOR_*`` environment
(``conftest.InProcessCliRunner``); the mapping of every command's failures to exit codes runs
real ``python -m worker`` processes."""

from __future__ import annotations

import copy
import hashlib
import json
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from worker.client import apply_compaction
from worker.transcripts.filesystem import FileStore
from worker.wire.events import parse_event

if TYPE_CHECKING:
    from conftest import CliResult, CliRunner

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
FORMATS = ["openai", "anthropic"]


@pytest.fixture
def run_cli(run_cli_in_process: CliRunner) -> CliRunner:
    """These tests are about what the commands do, not the interpreter's start: in process."""
    return run_cli_in_process


@pytest.fixture
def run_cli_as_process(tmp_path: Path, subprocesses: None) -> CliRunner:
    """``python -m worker`` as a user runs it (conftest's ``run_cli``)."""
    from conftest import CliRunner

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return CliRunner(cwd)


def fixture(fmt: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads((FIXTURES / f"snapshot_{fmt}.json").read_text())
    return value


def save(runner: CliRunner, value: Any, name: str = "snapshot.json") -> Path:
    path = runner.cwd / name
    path.write_text(value if isinstance(value, str) else json.dumps(value), encoding="utf-8")
    return path


def stdout_events(result: CliResult) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def no_traceback(result: CliResult) -> None:
    assert "Traceback" not in result.stderr, result.stderr


def written_files(runner: CliRunner) -> list[Path]:
    root = runner.cwd / "transcripts"
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def completed(runner: CliRunner, snapshot: dict[str, Any], *args: str) -> dict[str, Any]:
    """Run ``compact`` and return its single ``compaction.completed`` event."""
    result = runner("compact", save(runner, snapshot), *args)
    no_traceback(result)
    assert result.code == 0, result.stderr
    events = stdout_events(result)
    for e in events:
        parse_event(e)  # every printed event has the contract's shape
    done = [e for e in events if e["type"] == "compaction.completed"]
    assert len(done) == 1, events
    assert events[-1] is done[0]
    return done[0]


# --- compact ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_compact_over_threshold(run_cli: CliRunner, fmt: str) -> None:
    snapshot = fixture(fmt)
    messages = snapshot["messages"]
    before = copy.deepcopy(messages)
    event = completed(run_cli, snapshot)
    assert event["conversation_id"] == snapshot["conversation_id"]
    assert event["revision"] == snapshot["revision"]
    trigger = event["trigger"]
    assert trigger["threshold_tokens"] == 750  # 1000 * 75 // 100
    assert trigger["projected_tokens"] > trigger["threshold_tokens"]
    comp = event["compaction"]
    start, end = comp["start"], comp["end"]
    assert 0 <= start < end <= len(messages)
    assert messages[start]["id"] == comp["first_id"]
    assert messages[end - 1]["id"] == comp["last_id"]
    assert comp["tokens_after"] < comp["tokens_before"]
    # The transcript: on disk, private, and exactly what the event says.
    ref = comp["transcript"]
    path = run_cli.cwd / ref["uri"]
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == ref["sha256"]
    assert len(data) == ref["bytes"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(data)["messages"] == messages  # the full pre-compaction history
    assert written_files(run_cli) == [path]
    # apply_compaction of the printed event: pure, and exactly the described splice.
    applied = apply_compaction(messages, event)
    assert applied == messages[:start] + comp["replacement"] + messages[end:]
    assert messages == before
    # Messages the agent appended after submitting the snapshot survive.
    later = [
        {"id": "late-1", "role": "user", "content": "one more thing"},
        {"id": "late-2", "role": "assistant", "content": "sure"},
    ]
    grown = apply_compaction(messages + later, event)
    assert grown == messages[:start] + comp["replacement"] + messages[end:] + later


@pytest.mark.parametrize("fmt", FORMATS)
def test_compact_under_threshold_is_skipped(run_cli: CliRunner, fmt: str) -> None:
    snapshot = fixture(fmt)
    snapshot["model"]["context_window"] = 1_047_576
    result = run_cli("compact", save(run_cli, snapshot))
    no_traceback(result)
    assert result.code == 0, result.stderr
    events = stdout_events(result)
    assert [e["type"] for e in events] == ["compaction.skipped"]
    parse_event(events[0])
    assert events[0]["trigger"]["threshold_tokens"] == 785_682
    assert written_files(run_cli) == []


def test_trigger_off_by_snapshot_override_is_skipped(run_cli: CliRunner) -> None:
    snapshot = fixture("openai") | {"config": {"auto_compact_trigger": "off"}}
    result = run_cli("compact", save(run_cli, snapshot))
    assert result.code == 0, result.stderr
    events = stdout_events(result)
    assert [e["type"] for e in events] == ["compaction.skipped"]
    # Off is a None threshold; the printed event must still be a valid CompactionEvent.
    assert events[0]["trigger"].get("threshold_tokens") is None
    parse_event(events[0])
    assert written_files(run_cli) == []


def test_unknown_window_event_applies(run_cli: CliRunner) -> None:
    """No context window: the absolute threshold decides, and the printed event (with its
    null ``context_window``) is still one the agent can apply."""
    snapshot = fixture("openai")
    snapshot["model"] = {"name": "gpt-4.1"}
    snapshot["config"] = {"auto_compact_threshold_tokens": 600}
    result = run_cli("compact", save(run_cli, snapshot))
    no_traceback(result)
    assert result.code == 0, result.stderr
    event = stdout_events(result)[-1]
    assert event["type"] == "compaction.completed"
    assert event["trigger"]["threshold_tokens"] == 600
    assert event["trigger"].get("context_window") is None
    comp = event["compaction"]
    applied = apply_compaction(snapshot["messages"], event)
    messages = snapshot["messages"]
    assert applied == messages[: comp["start"]] + comp["replacement"] + messages[comp["end"] :]


def pending_call_snapshot(fmt: str, *, parallel: bool) -> tuple[dict[str, Any], int]:
    """The fixture with a final assistant turn whose tool call(s) still wait for results."""
    snapshot = fixture(fmt)
    messages = snapshot["messages"]
    if fmt == "openai":
        calls = [
            {
                "id": "call_lint",
                "type": "function",
                "function": {"name": "run_lint", "arguments": '{"path": "src"}'},
            }
        ]
        if parallel:
            calls.append(
                {
                    "id": "call_type",
                    "type": "function",
                    "function": {"name": "run_mypy", "arguments": '{"path": "src"}'},
                }
            )
        messages += [
            {"id": "m90", "role": "user", "content": "Run the linters too."},
            {"id": "m91", "role": "assistant", "content": None, "tool_calls": calls},
        ]
        if parallel:
            messages.append(
                {
                    "id": "m92",
                    "role": "tool",
                    "tool_call_id": "call_lint",
                    "content": "All checks passed.",
                }
            )
    else:
        blocks = [
            {"type": "tool_use", "id": "toolu_lint", "name": "run_lint", "input": {"path": "src"}}
        ]
        if parallel:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": "toolu_type",
                    "name": "run_mypy",
                    "input": {"path": "src"},
                }
            )
        messages += [
            {"id": "a90", "role": "user", "content": "Run the linters too."},
            {"id": "a91", "role": "assistant", "content": blocks},
        ]
        if parallel:
            messages.append(
                {
                    "id": "a92",
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_lint",
                            "content": "All checks passed.",
                        }
                    ],
                }
            )
    pending_index = next(i for i, m in enumerate(messages) if m["id"] in ("m91", "a91"))
    return snapshot, pending_index


@pytest.mark.parametrize(
    ("fmt", "parallel"),
    [("openai", True), ("anthropic", False)],
    ids=["openai-one-of-two-answered", "anthropic-one-call"],
)
def test_unanswered_tool_call_stays_out_of_the_range(
    run_cli: CliRunner, fmt: str, parallel: bool
) -> None:
    snapshot, pending = pending_call_snapshot(fmt, parallel=parallel)
    event = completed(run_cli, snapshot)
    comp = event["compaction"]
    assert comp["end"] <= pending
    applied = apply_compaction(snapshot["messages"], event)
    tail = snapshot["messages"][pending:]
    assert applied[-len(tail) :] == tail


def test_config_file_transcript_dir_and_tool_hints(run_cli: CliRunner) -> None:
    elsewhere = run_cli.cwd / "store" / "t"
    config = save(
        run_cli,
        f"""
[compaction]
transcript_dir = "{elsewhere}"

[conversation.tools."*"]
compaction = "strip"

[conversation.tools.grep]
compaction = "omit"

[conversation.tools.read_file]
compaction = "strip-responses"
""",
        "c.toml",
    )
    event = completed(run_cli, fixture("openai"), "--config", str(config))
    comp = event["compaction"]
    assert Path(comp["transcript"]["uri"]).parent == elsewhere / "fixture-openai-1"
    assert written_files(run_cli) == []
    # RFD D17: hints resolved at creation and frozen into the event.
    assert comp["tool_calls"] == {"policy": "strip", "request": True, "response": True}
    assert comp["tool_overrides"] == {
        "grep": {"policy": "omit", "request": False, "response": False},
        "read_file": {"policy": "strip", "request": False, "response": True},
    }


def test_rerun_is_idempotent_and_retention_runs_after_each_write(run_cli: CliRunner) -> None:
    config = save(run_cli, "[compaction]\nmax_persisted_transcripts = 1\n", "c.toml")
    snapshot = fixture("anthropic")
    first = completed(run_cli, snapshot, "--config", str(config))
    again = completed(run_cli, snapshot, "--config", str(config))  # a redelivered task
    assert first["event_id"] == again["event_id"]
    assert first["compaction"]["transcript"] == again["compaction"]["transcript"]
    assert written_files(run_cli) == [run_cli.cwd / first["compaction"]["transcript"]["uri"]]
    newer = completed(run_cli, snapshot | {"revision": 8}, "--config", str(config))
    assert written_files(run_cli) == [run_cli.cwd / newer["compaction"]["transcript"]["uri"]]


def test_an_edited_snapshot_under_the_same_revision_is_a_conflict(run_cli: CliRunner) -> None:
    """Not ``storage_unavailable``: storage is fine; the first transcript of that revision stays."""
    snapshot = fixture("openai")
    first = completed(run_cli, snapshot)
    edited = json.loads(json.dumps(snapshot))
    index = first["compaction"]["start"] + 1
    edited["messages"][index]["content"] = "an edited message inside the compacted range"
    result = run_cli("compact", save(run_cli, edited))
    no_traceback(result)
    assert result.code == 1, result.stderr
    events = stdout_events(result)
    assert events[-1]["type"] == "compaction.failed"
    assert events[-1]["error"]["code"] == "transcript_conflict"
    assert "new revision" in events[-1]["error"]["message"]
    kept = run_cli.cwd / first["compaction"]["transcript"]["uri"]
    digest = __import__("hashlib").sha256(kept.read_bytes()).hexdigest()
    assert digest == first["compaction"]["transcript"]["sha256"]


def test_unwritable_transcript_dir_fails_without_a_completed_event(run_cli: CliRunner) -> None:
    blocker = save(run_cli, "a regular file, not a directory", "blocker")
    config = save(run_cli, f'[compaction]\ntranscript_dir = "{blocker}"\n', "c.toml")
    result = run_cli("compact", save(run_cli, fixture("openai")), "--config", config)
    no_traceback(result)
    assert result.code == 1, result.stderr
    events = stdout_events(result)
    assert [e["type"] for e in events] == ["compaction.failed"]
    parse_event(events[0])
    assert events[0]["error"]["code"] == "storage_unavailable"
    assert blocker.read_text() == "a regular file, not a directory"


# --- rejected input -----------------------------------------------------------------------------


def bad_inputs() -> dict[str, tuple[Any, dict[str, Any]]]:
    """name -> (file content or None for a missing file, what the error line must say)."""
    base = fixture("openai")
    unknown_role = copy.deepcopy(base)
    unknown_role["messages"][1]["role"] = "narrator"
    orphan = copy.deepcopy(base)
    orphan["messages"].insert(2, {"role": "tool", "tool_call_id": "call_ghost", "content": "x"})
    return {
        "malformed-json": (
            '{"conversation_id": "c", "revision": 1, "messages": [',
            {"reason": "malformed JSON"},
        ),
        "unknown-role": (unknown_role, {"field": "messages[1].role"}),
        "tool-result-without-call": (orphan, {"field": "messages[2]", "reason": "call_ghost"}),
        "path-traversal-id": (
            base | {"conversation_id": "../../etc"},
            {"field": "conversation_id"},
        ),
        "fractional-revision": (base | {"revision": 1.5}, {"field": "revision"}),
        "string-revision": (base | {"revision": "17"}, {"field": "revision"}),
        "negative-revision": (base | {"revision": -1}, {"field": "revision"}),
        "lone-surrogate": (
            json.dumps(base).replace("skipped", "skip\\udc80ped"),
            {"reason": "surrogate"},
        ),
        "operator-only-override": (
            base | {"config": {"transcript_dir": "/etc"}},
            {"field": "config.transcript_dir"},
        ),
        "missing-file": (None, {"error": "usage", "message": "does-not-exist.json"}),
    }


BAD = bad_inputs()


def assert_rejected(runner: CliRunner, result: CliResult, expect: dict[str, Any]) -> None:
    no_traceback(result)
    assert result.code == 2, (result.code, result.stderr)
    assert result.stdout == ""
    last = result.stderr.strip().splitlines()[-1]
    error = json.loads(last)
    assert "field" in error or "error" in error
    for key, part in expect.items():
        assert part in str(error.get(key)), (key, error)
    if "field" in error:
        assert error.get("reason"), error
    assert written_files(runner) == []


@pytest.mark.parametrize("name", BAD)
def test_bad_input_is_rejected(run_cli: CliRunner, name: str) -> None:
    raw, expect = BAD[name]
    path = run_cli.cwd / "does-not-exist.json" if raw is None else save(run_cli, raw)
    assert_rejected(run_cli, run_cli("compact", path), expect)


def test_invalid_utf8_is_rejected(run_cli: CliRunner) -> None:
    path = run_cli.cwd / "latin1.json"
    path.write_bytes(json.dumps(fixture("openai")).encode().replace(b"Thanks", b"Th\xe4nks"))
    assert_rejected(run_cli, run_cli("compact", path), {"reason": "UTF-8"})


def test_deep_nesting_is_rejected(run_cli: CliRunner) -> None:
    text = json.dumps(fixture("openai")).replace(
        '"revision": 7', '"revision": 7, "x": ' + "[" * 10_000 + "]" * 10_000
    )
    assert_rejected(run_cli, run_cli("compact", save(run_cli, text)), {"reason": "nested"})


@pytest.mark.slow
def test_fifty_megabytes_is_rejected(run_cli: CliRunner) -> None:
    path = run_cli.cwd / "huge.json"
    head = json.dumps(fixture("openai"))[:-1]  # without the closing brace
    with path.open("w", encoding="utf-8") as f:
        f.write(head + ', "padding": "')
        chunk = "0123456789abcdef" * 65_536  # 1 MiB
        for _ in range(50):
            f.write(chunk)
        f.write('"}')
    assert path.stat().st_size > 50 * 1024 * 1024
    assert_rejected(run_cli, run_cli("compact", path), {"reason": "limit"})


@pytest.mark.parametrize(
    ("env", "toml", "key"),
    [
        ({"COMPACTOR_MODE": "cloud"}, None, "compaction.mode"),
        (
            {},
            '[conversation.tools.grep]\ncompaction = "squash"\n',
            "conversation.tools.grep.compaction",
        ),
        ({}, "[compaction\n", "c.toml"),
    ],
    ids=["env", "hint", "bad-toml"],
)
def test_bad_configuration_is_rejected(
    run_cli: CliRunner, env: dict[str, str], toml: str | None, key: str
) -> None:
    args = ["compact", str(save(run_cli, fixture("openai")))]
    if toml is not None:
        args += ["--config", str(save(run_cli, toml, "c.toml"))]
    result = run_cli(*args, env=env)
    no_traceback(result)
    assert result.code == 2, result.stderr
    error = json.loads(result.stderr.strip().splitlines()[-1])
    assert key in error["key"]
    assert written_files(run_cli) == []


# --- config show --------------------------------------------------------------------------------


def test_config_show_masks_secrets(run_cli: CliRunner) -> None:
    redis_pw = "r3dis-pw-7f1d9a"
    api_key = "sk-planted-0b5e2c88"
    result = run_cli(
        "config",
        "show",
        env={
            "COMPACTOR_REDIS_URL": f"redis://worker:{redis_pw}@broker:6379/0",
            "OPENAI_API_KEY": api_key,
        },
    )
    no_traceback(result)
    assert result.code == 0, result.stderr
    shown = json.loads(result.stdout)
    assert redis_pw not in result.stdout + result.stderr
    assert api_key not in result.stdout + result.stderr
    assert shown["redis"]["url"] == "redis://worker:***@broker:6379/0"
    assert shown["llm"]["api_key_env"] == "OPENAI_API_KEY"
    assert shown["compaction"]["auto_compact_threshold_tokens"] == 50_000
    assert shown["compaction"]["mode"] == "local_only"


def test_config_show_never_prints_a_key_from_a_custom_variable(run_cli: CliRunner) -> None:
    secret = "sk-custom-var-93c1f0aa"
    config = save(
        run_cli, '[llm]\napi_key_env = "TEAM_LLM_KEY"\nprovider = "anthropic"\n', "c.toml"
    )
    result = run_cli("config", "show", "--config", config, env={"TEAM_LLM_KEY": secret})
    assert result.code == 0, result.stderr
    assert secret not in result.stdout + result.stderr
    shown = json.loads(result.stdout)
    assert shown["llm"]["api_key_env"] == "TEAM_LLM_KEY"
    assert shown["llm"]["provider"] == "anthropic"
    assert "set" in str(shown["llm"].get("api_key"))


def test_config_show_reads_the_default_file_and_compactor_config(run_cli: CliRunner) -> None:
    (run_cli.cwd / "config").mkdir()
    save(run_cli, "[compaction]\nsummary_max_output_tokens = 1234\n", "config/compactor.toml")
    other = save(run_cli, "[compaction]\nsummary_max_output_tokens = 4321\n", "other.toml")
    default = run_cli("config", "show")
    named = run_cli("config", "show", env={"COMPACTOR_CONFIG": str(other)})
    assert default.code == named.code == 0
    assert json.loads(default.stdout)["compaction"]["summary_max_output_tokens"] == 1234
    assert json.loads(named.stdout)["compaction"]["summary_max_output_tokens"] == 4321


# --- prune --------------------------------------------------------------------------------------


def test_prune_dry_run_then_prune(run_cli: CliRunner) -> None:
    store = FileStore(run_cli.cwd / "transcripts")
    paths = [
        Path(store.write("c-1", r, hashlib.sha256(bytes([r])).hexdigest()[:32], b"{}").uri)
        for r in range(5)
    ]
    config = save(run_cli, "[compaction]\nmax_persisted_transcripts = 2\n", "c.toml")
    dry = run_cli("prune", "--dry-run", "--config", config)
    no_traceback(dry)
    assert dry.code == 0, dry.stderr
    would = {Path(p).name for p in json.loads(dry.stdout)["would_remove"]}
    assert would == {p.name for p in paths[:3]}
    assert all(p.exists() for p in paths)  # nothing removed by a dry run
    real = run_cli("prune", "--config", config)
    assert real.code == 0, real.stderr
    assert {Path(p).name for p in json.loads(real.stdout)["removed"]} == would
    assert [p.exists() for p in paths] == [False, False, False, True, True]


# --- one failure, one code, in every command ----------------------------------------------------

SNAPSHOT_COMMANDS = {
    "compact": lambda path: ["compact", path],
    "submit": lambda path: ["submit", path],
}
FILE_COMMANDS = SNAPSHOT_COMMANDS | {
    "compress": lambda path: ["compress", "bash", path],
    "decompress": lambda path: ["decompress", "bash", path],
}
REDIS_COMMANDS = {
    "submit": lambda path: ["submit", path],
    "events": lambda _path: ["events", "c-1"],
    "status": lambda _path: ["status"],
    "metrics": lambda _path: ["metrics"],
}
CONFIG_COMMANDS = (
    SNAPSHOT_COMMANDS
    | REDIS_COMMANDS
    | {
        "config-show": lambda _path: ["config", "show"],
        "prune": lambda _path: ["prune", "--dry-run"],
    }
)
TEXT_COMMANDS = {k: FILE_COMMANDS[k] for k in ("compress", "decompress")}
WRONG_PASSWORD = "wr0ng-pw-5b7e1c"
RIGHT_PASSWORD = "right-pw-3c9a"
CORRUPT_LONG_LISTING = (  # the ls -l form's header, then a first line without its date
    "[ls -l, single-spaced; a row without owner group or date has those of the first line]\n"
    "root root\n-rw-r--r-- 1 5 x"
)

# failure -> (the commands that meet it, exit code, the JSON error line's ``error``, its ``key``)
FAILURES: dict[str, tuple[dict[str, Any], int, str, str | None]] = {
    "missing-file": (FILE_COMMANDS, 2, "usage", None),
    "directory-as-file": (FILE_COMMANDS, 2, "usage", None),
    "bad-snapshot": (SNAPSHOT_COMMANDS, 2, "invalid_snapshot", None),
    "not-utf8": (TEXT_COMMANDS, 2, "invalid_input", None),
    "corrupt-compressed-form": (
        {"decompress": FILE_COMMANDS["decompress"]},
        2,
        "compression_invalid",
        None,
    ),
    "bad-config": (CONFIG_COMMANDS, 2, "invalid_config", "compaction.mode"),
    "redis-closed-port": (REDIS_COMMANDS, 1, "redis_unavailable", None),
    "redis-wrong-password": (REDIS_COMMANDS, 2, "invalid_config", "redis.url"),
    "redis-url-not-redis": (CONFIG_COMMANDS, 2, "invalid_config", "redis.url"),
    "bad-log-level": (CONFIG_COMMANDS, 2, "invalid_config", "COMPACTOR_LOG_LEVEL"),
}
CASES = [(f, c) for f, (commands, *_) in FAILURES.items() for c in commands]


@pytest.fixture(scope="module")
def protected_redis(tmp_path_factory: pytest.TempPathFactory, subprocesses: None) -> Any:
    """A Redis that wants a password; yields its URL with a wrong one."""
    from worker.backend.embedded import EmbeddedRedis

    server = EmbeddedRedis(directory=tmp_path_factory.mktemp("redis"), password=RIGHT_PASSWORD)
    url = server.start()
    try:
        yield url.replace(RIGHT_PASSWORD, WRONG_PASSWORD)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def closed_port_url(sockets: None) -> str:
    """A loopback port nothing listens on (chosen free, and not used)."""
    from worker.backend.embedded import free_port

    return f"redis://127.0.0.1:{free_port()}/0"


@pytest.mark.parametrize(("failure", "command"), CASES, ids=[f"{c}-{f}" for f, c in CASES])
def test_every_command_maps_a_failure_to_the_same_code(
    run_cli_as_process: CliRunner, failure: str, command: str, request: pytest.FixtureRequest
) -> None:
    run_cli = run_cli_as_process  # the exit code is the process's
    commands, code, error, key = FAILURES[failure]
    good = str(save(run_cli, fixture("openai")))
    env = {"COMPACTOR_REDIS_URL": request.getfixturevalue("closed_port_url")}
    path = good
    if failure == "missing-file":
        path = str(run_cli.cwd / "does-not-exist.json")
    elif failure == "directory-as-file":
        path = str(run_cli.cwd)
    elif failure == "bad-snapshot":
        path = str(save(run_cli, '{"conversation_id": "c-1", "revision": 1, "messages": ['))
    elif failure == "not-utf8":
        path = str(run_cli.cwd / "latin1.txt")
        Path(path).write_bytes(b"caf\xe9 au lait\n")
    elif failure == "corrupt-compressed-form":
        path = str(save(run_cli, CORRUPT_LONG_LISTING, "corrupt.txt"))
    elif failure == "bad-config":
        env["COMPACTOR_MODE"] = "cloud"
    elif failure == "redis-wrong-password":
        env["COMPACTOR_REDIS_URL"] = request.getfixturevalue("protected_redis")
    elif failure == "redis-url-not-redis":
        env["COMPACTOR_REDIS_URL"] = f"http://user:{WRONG_PASSWORD}@127.0.0.1:1/0"
    elif failure == "bad-log-level":
        env["COMPACTOR_LOG_LEVEL"] = "loud"
    result = run_cli(*commands[command](path), env=env)
    no_traceback(result)
    assert result.code == code, (result.code, result.stderr)
    line = json.loads(result.stderr.strip().splitlines()[-1])
    assert line["error"] == error, line
    if key is not None:
        assert line["key"] == key, line
    assert WRONG_PASSWORD not in result.stdout + result.stderr
    assert written_files(run_cli) == []


def test_a_refused_password_from_the_broker_ping_is_the_same_error(protected_redis: str) -> None:
    """``status`` pings the workers through kombu, which wraps redis-py's AuthenticationError in
    its own OperationalError: converted where it enters, into the same ``redis.url`` error."""
    from worker.config import Settings, with_redis_url
    from worker.errors import ConfigError
    from worker.runtime.celery_app import make_app
    from worker.runtime.fleet import ping

    app = make_app(with_redis_url(Settings(), protected_redis))
    # kombu retries a refused password like any connection error (for ~6 s); the wrapping
    # checked here is the same on the first attempt.
    transport = app.conf.broker_transport_options
    app.conf.broker_transport_options = {**transport, "max_retries": 0}
    try:
        with pytest.raises(ConfigError) as caught:
            ping(app, timeout_s=0.5)
    finally:
        app.close()
    assert caught.value.key == "redis.url"
    assert WRONG_PASSWORD not in str(caught.value)


def test_a_refused_password_is_not_retried(protected_redis: str) -> None:
    """A wrong password is not transient: redis-py counts AuthenticationError as a
    ConnectionError, which ``connect()`` retries with backoff (~5 s), so the client must stop at
    the first refusal. Redis' ACL log counts the refused attempts."""
    import redis

    from worker.backend.connection import connect, redis_errors
    from worker.errors import ConfigError

    admin = redis.Redis.from_url(protected_redis.replace(WRONG_PASSWORD, RIGHT_PASSWORD))
    try:
        admin.acl_log_reset()
        client = connect(protected_redis)
        with pytest.raises(ConfigError) as caught, redis_errors("pinging"):
            client.ping()
        client.close()
        assert caught.value.key == "redis.url"
        refused = [entry for entry in admin.acl_log() if entry["reason"] == "auth"]
        assert sum(entry["count"] for entry in refused) == 1, refused
    finally:
        admin.close()


def test_an_unknown_compactor_variable_is_warned_about_on_stderr(run_cli: CliRunner) -> None:
    """A misspelled setting is not silently ignored: one JSON warning line on stderr names it
    and the setting it is closest to; stdout is unchanged."""
    misspelled = "COMPACTOR_" + "TRANSCRIPT_DIRR"  # built: not a name the repository uses
    result = run_cli("config", "show", env={misspelled: "/elsewhere"})
    assert result.code == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["compaction"]["transcript_dir"] == "transcripts"  # ignored, as it says
    (warning,) = [json.loads(line) for line in result.stderr.splitlines()]
    assert warning["level"] == "warning" and warning["logger"] == "worker.config", warning
    assert misspelled in warning["message"]
    assert "did you mean COMPACTOR_TRANSCRIPT_DIR?" in warning["message"]
    assert "/elsewhere" not in result.stderr
    quiet = run_cli("config", "show", env={"COMPACTOR_TEST_REDIS_URL": "redis://h:1/0"})
    assert quiet.code == 0 and quiet.stderr == "", quiet.stderr


# --- show: did you mean -------------------------------------------------------------------------


def test_show_suggests_the_ids_an_unknown_conversation_may_mean(
    redis_url: str, run_cli_in_process: CliRunner
) -> None:
    """``compactor show c-1`` when only ``acme:c-1`` exists (a session helper's or ``compactor
    serve``'s id): the error names the ids it may mean, tenant by tenant, never a traceback."""
    from worker.client import Client
    from worker.config import Settings, with_redis_url

    client = Client(with_redis_url(Settings(), redis_url))
    try:
        message = {"role": "user", "content": "hello"}
        for conversation_id in ("acme:c-1", "globex:c-1", "acme:report-7", "plain-1"):
            client.submit(
                {"conversation_id": conversation_id, "revision": 1, "messages": [message]}
            )
    finally:
        client.close()
    env = {"COMPACTOR_REDIS_URL": redis_url}

    def refused(conversation_id: str) -> str:
        result = run_cli_in_process("show", conversation_id, env=env)
        assert result.code == 2, result
        error = json.loads(result.stderr.splitlines()[-1])
        assert error["error"] == "usage", error
        return str(error["message"])

    bare = refused("c-1")  # the id without its tenant prefix
    assert "did you mean acme:c-1, globex:c-1?" in bare and "TENANT:ID" in bare
    assert "acme:report-7" in refused("globex:report-7")  # another tenant's
    assert "did you mean plain-1?" in refused("acme:plain-1")  # one stored without a prefix
    assert "did you mean acme:report-7?" in refused("acme:report-8")  # a near miss
    assert "no conversation of a tenant has an id like it" in refused("zzz-unrelated")
