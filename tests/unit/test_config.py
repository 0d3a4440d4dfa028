"""Configuration (DESIGN.md §2): the seed's threshold table in every case, the defaults, TOML,
the environment, snapshot overrides, per-tool hints, errors that name the key, and the shipped
``config/compactor.toml`` documenting every setting at its default."""

from __future__ import annotations

import itertools
import logging
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from worker.config import (
    CompactionConfig,
    LLMConfig,
    ProjectedToolResultBudget,
    RedisConfig,
    Settings,
    ToolConfig,
    TranscriptRetention,
    config_path,
    load_settings,
    mask_url,
    redis_url,
    settings_from_mapping,
    shown_settings,
)
from worker.errors import ConfigError
from worker.wire.snapshots import parse_snapshot

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
SHIPPED = REPO_ROOT / "config" / "compactor.toml"

# --- the seed's table ---------------------------------------------------------------------------

TRIGGERS = ["off", "window_share_only", "thresholds"]
TOKENS = [None, 50_000]
PERCENTS = [None, 0, 75, 100, 150, 255]
WINDOWS = [None, 200_000]


def seed_threshold(
    trigger: str, tokens: int | None, percent: int | None, window: int | None
) -> int | None:
    """The seed's ``auto_compact_threshold``, written out independently of the code under test.

    Off: None always. WindowShareOnly: the share of a known window, None when the window or the
    percentage is unknown; tokens never consulted. Thresholds: None when tokens is None; else the
    share when window and percent are both set; else tokens. Percent above 100 counts as 100.
    """
    share = None if window is None or percent is None else window * min(percent, 100) // 100
    if trigger == "off":
        return None
    if trigger == "window_share_only":
        return share
    if tokens is None:
        return None
    return share if share is not None else tokens


def seed_enabled(trigger: str, tokens: int | None, percent: int | None) -> bool:
    """The seed's ``auto_compact_enabled``: whether compaction can fire for *some* window."""
    if trigger == "off":
        return False
    if trigger == "window_share_only":
        return percent is not None
    return tokens is not None


TABLE = list(itertools.product(TRIGGERS, TOKENS, PERCENTS, WINDOWS))


@pytest.mark.parametrize(
    ("trigger", "tokens", "percent", "window"),
    TABLE,
    ids=[f"{t}-tokens={k}-percent={p}-window={w}" for t, k, p, w in TABLE],
)
def test_threshold_table(
    trigger: str, tokens: int | None, percent: int | None, window: int | None
) -> None:
    config = CompactionConfig(
        auto_compact_trigger=trigger,
        auto_compact_threshold_tokens=tokens,
        auto_compact_threshold_percent=percent,
    )
    assert config.auto_compact_threshold(window) == seed_threshold(trigger, tokens, percent, window)


ENABLED = list(itertools.product(TRIGGERS, TOKENS, PERCENTS))


@pytest.mark.parametrize(
    ("trigger", "tokens", "percent"),
    ENABLED,
    ids=[f"{t}-tokens={k}-percent={p}" for t, k, p in ENABLED],
)
def test_auto_compact_enabled(trigger: str, tokens: int | None, percent: int | None) -> None:
    config = CompactionConfig(
        auto_compact_trigger=trigger,
        auto_compact_threshold_tokens=tokens,
        auto_compact_threshold_percent=percent,
    )
    assert config.auto_compact_enabled() is seed_enabled(trigger, tokens, percent)
    # "can fire for some context window": consistent with the threshold over several windows.
    can_fire = any(config.auto_compact_threshold(w) is not None for w in (None, 1, 10**6))
    assert config.auto_compact_enabled() is can_fire


@pytest.mark.parametrize(
    ("window", "percent", "expected"),
    [
        (1_047_576, 75, 785_682),  # DESIGN.md §3's example event
        (128_000, 100, 128_000),
        (128_000, 150, 128_000),  # above 100 counts as 100: never beyond the window
        (128_000, 255, 128_000),
        (999, 75, 749),  # floor division, not rounding
        (3, 33, 0),
        (200_000, 0, 0),
    ],
)
def test_threshold_is_floor_of_window_share(window: int, percent: int, expected: int) -> None:
    config = CompactionConfig(auto_compact_threshold_percent=percent)
    assert config.auto_compact_threshold(window) == expected
    assert config.auto_compact_threshold(window) <= window


@pytest.mark.parametrize("percent", [-1, 256, 1000])
def test_percent_outside_u8_rejected(percent: int) -> None:
    with pytest.raises(ConfigError) as info:
        settings_from_mapping({"compaction": {"auto_compact_threshold_percent": percent}})
    assert info.value.key == "compaction.auto_compact_threshold_percent"


# --- defaults -----------------------------------------------------------------------------------

DESIGN_DEFAULTS: dict[str, Any] = {
    "keep_recent_tool_results": None,
    "projected_tool_result_budget": None,
    "auto_compact_trigger": "thresholds",
    "auto_compact_threshold_tokens": 50_000,
    "auto_compact_threshold_percent": 75,
    "transcript_dir": Path("transcripts"),
    "summary_max_input_chars": 80_000,
    "summary_max_output_tokens": 2_000,
    "mode": "local_only",
    "preserve_recent_user_tokens": 20_000,
    "preserve_recent_delegation_results": 8,
    "max_persisted_transcripts": 10,
    "delegation_tools": ["delegate_task", "task", "agent"],
}


@pytest.mark.parametrize(("field", "expected"), DESIGN_DEFAULTS.items())
def test_design_defaults(field: str, expected: Any) -> None:
    assert getattr(CompactionConfig(), field) == expected


def test_every_seed_field_exists() -> None:
    seed_fields = set(DESIGN_DEFAULTS) - {"delegation_tools"}
    assert seed_fields <= set(CompactionConfig.model_fields)


def test_defaults_resolve_with_no_file_and_no_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no config/compactor.toml here
    settings = load_settings(environ={})
    assert settings.source == "defaults"
    assert settings.compaction == CompactionConfig()
    assert settings.llm == LLMConfig()
    assert settings.redis == RedisConfig()
    assert redis_url(settings) is None
    assert settings.tools == {}


# --- TOML ---------------------------------------------------------------------------------------


def write(tmp_path: Path, text: str, name: str = "c.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_toml_file_loads_every_section(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[compaction]
keep_recent_tool_results = 3
auto_compact_trigger = "window_share_only"
auto_compact_threshold_tokens = "none"
auto_compact_threshold_percent = 80
transcript_dir = "/var/lib/compactor/transcripts"
mode = "prefer_remote"
max_persisted_transcripts = "none"
projected_tool_result_budget = { max_bytes = 0 }
delegation_tools = ["spawn"]

[conversation.tools.grep]
compaction = "strip-responses"

[conversation.tools."*"]
compaction = "strip"

[llm]
provider = "anthropic"
model = "claude-haiku"
timeout_s = 12.5

[redis]
url = "redis://broker:6379/3"

[transcripts]
max_age_days = 30
max_total_bytes = 1000000
""",
    )
    s = load_settings(path, environ={})
    c = s.compaction
    assert c.keep_recent_tool_results == 3
    assert c.auto_compact_trigger == "window_share_only"
    assert c.auto_compact_threshold_tokens is None
    assert c.auto_compact_threshold_percent == 80
    assert c.transcript_dir == Path("/var/lib/compactor/transcripts")
    assert c.mode == "prefer_remote"
    assert c.max_persisted_transcripts is None
    assert c.projected_tool_result_budget == ProjectedToolResultBudget(
        max_bytes=0, prioritize_recent_results=2, max_preview_bytes=2048
    )
    assert c.delegation_tools == ["spawn"]
    assert s.tools == {
        "grep": ToolConfig(compaction="strip-responses"),
        "*": ToolConfig(compaction="strip"),
    }
    assert (s.llm.provider, s.llm.model, s.llm.timeout_s) == ("anthropic", "claude-haiku", 12.5)
    assert redis_url(s) == "redis://broker:6379/3"
    assert (s.transcripts.max_age_days, s.transcripts.max_total_bytes) == (30, 1_000_000)
    assert s.source == str(path)
    # Untouched settings keep their defaults.
    assert c.summary_max_output_tokens == 2_000


@pytest.mark.parametrize(
    "hint", ["keep", "strip", "strip-requests", "strip-responses", "omit", None]
)
def test_every_tool_hint_accepted(hint: str | None) -> None:
    tools = {"x": {"compaction": hint}} if hint else {"x": {}}
    s = settings_from_mapping({"conversation": {"tools": tools}})
    assert s.tools["x"].compaction == hint


def test_config_path_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert config_path(None, {}) is None
    shipped = tmp_path / "config" / "compactor.toml"
    shipped.parent.mkdir()
    shipped.write_text("[compaction]\nsummary_max_output_tokens = 111\n")
    other = write(tmp_path, "[compaction]\nsummary_max_output_tokens = 222\n", "other.toml")
    explicit = write(tmp_path, "[compaction]\nsummary_max_output_tokens = 333\n", "e.toml")
    env = {"COMPACTOR_CONFIG": str(other)}
    assert config_path(None, {}) == Path("config/compactor.toml")
    assert load_settings(environ={}).compaction.summary_max_output_tokens == 111
    assert load_settings(environ=env).compaction.summary_max_output_tokens == 222
    assert load_settings(explicit, environ=env).compaction.summary_max_output_tokens == 333


def test_relative_paths_in_a_file_are_relative_to_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file means the same from every working directory: its relative paths are joined to
    its own directory (as named, ``..`` taken lexically), whatever the process's directory."""
    etc = tmp_path / "site" / "etc"
    etc.mkdir(parents=True)
    write(
        etc,
        """
[compaction]
transcript_dir = "../transcripts"

[llm]
prompt_file = "prompts/summary.txt"
tenant_prompt_files = { acme = "prompts/acme.txt", globex = "/srv/globex.txt" }

[http]
api_keys_file = "keys.json"

[transcripts]
url = "store"
""",
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for named in (etc / "c.toml", Path("../site/etc/c.toml")):
        s = load_settings(named, environ={})
        assert s.compaction.transcript_dir == tmp_path / "site" / "transcripts"
        assert s.llm.prompt_file == etc / "prompts" / "summary.txt"
        assert s.llm.tenant_prompt_files == {
            "acme": etc / "prompts" / "acme.txt",
            "globex": Path("/srv/globex.txt"),  # absolute: as it is
        }
        assert s.http.api_keys_file == etc / "keys.json"
        url = s.transcripts.url
        assert url is not None and url.get_secret_value() == str(etc / "store")
    shown = shown_settings(load_settings(etc / "c.toml", environ={}))
    assert shown["compaction"]["transcript_dir"] == str(tmp_path / "site" / "transcripts")


def test_a_linked_config_directory_is_taken_as_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``..`` from a directory reached through a symbolic link is the link's parent, as the
    reader sees the tree, not the parent of the directory it points to."""
    real = tmp_path / "real" / "conf"
    real.mkdir(parents=True)
    write(real, '[compaction]\ntranscript_dir = "../transcripts"\n')
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "config").symlink_to(real)
    monkeypatch.chdir(checkout)
    s = load_settings("config/c.toml", environ={})
    assert s.compaction.transcript_dir == checkout / "transcripts"


def test_paths_from_the_environment_and_the_default_stay_relative_to_the_working_directory(
    tmp_path: Path,
) -> None:
    write(tmp_path, '[compaction]\nmode = "local_only"\n[transcripts]\nurl = "s3://bucket/p"\n')
    s = load_settings(tmp_path / "c.toml", environ={})
    assert s.compaction.transcript_dir == Path("transcripts")  # the built-in default, as it was
    url = s.transcripts.url
    assert url is not None and url.get_secret_value() == "s3://bucket/p"  # a URL: untouched
    env = {"COMPACTOR_TRANSCRIPT_DIR": "mine", "COMPACTOR_LLM_PROMPT_FILE": "p.txt"}
    s = load_settings(tmp_path / "c.toml", environ=env)
    assert s.compaction.transcript_dir == Path("mine")
    assert s.llm.prompt_file == Path("p.txt")
    write(tmp_path, '[llm]\nprompt_file = "none"\n[http]\napi_keys_file = "null"\n', "n.toml")
    s = load_settings(tmp_path / "n.toml", environ={})
    assert s.llm.prompt_file is None and s.http.api_keys_file is None


def test_missing_explicit_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(tmp_path / "nope.toml", environ={})
    assert "nope.toml" in info.value.key
    assert "not found" in info.value.reason


# --- environment --------------------------------------------------------------------------------


def test_environment_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    env = {
        "COMPACTOR_MODE": "remote_only",
        "COMPACTOR_AUTO_COMPACT_THRESHOLD_TOKENS": "none",
        "COMPACTOR_REDIS_URL": "redis://:pw@cache:6380/1",
        "COMPACTOR_LLM_MODEL": "gpt-5-mini",
        "COMPACTOR_LLM_TIMEOUT_S": "7.5",
        "COMPACTOR_PROJECTED_TOOL_RESULT_BUDGET": '{"max_bytes": 4096, "max_preview_bytes": 512}',
        "COMPACTOR_DELEGATION_TOOLS": '["subagent"]',
        "COMPACTOR_TRANSCRIPTS_MAX_AGE_DAYS": "2.5",
        "UNRELATED": "1",
    }
    s = load_settings(environ=env)
    assert s.compaction.mode == "remote_only"
    assert s.compaction.auto_compact_threshold_tokens is None
    assert s.compaction.auto_compact_enabled() is False  # thresholds + None tokens = off
    assert redis_url(s) == "redis://:pw@cache:6380/1"
    assert s.llm.model == "gpt-5-mini"
    assert s.llm.timeout_s == 7.5
    assert s.compaction.projected_tool_result_budget == ProjectedToolResultBudget(
        max_bytes=4096, prioritize_recent_results=2, max_preview_bytes=512
    )
    assert s.compaction.delegation_tools == ["subagent"]
    assert s.transcripts.max_age_days == 2.5
    assert "environment" in s.source


@pytest.mark.parametrize(
    ("var", "value", "key"),
    [
        ("COMPACTOR_MODE", "sometimes", "compaction.mode"),
        ("COMPACTOR_AUTO_COMPACT_TRIGGER", "always", "compaction.auto_compact_trigger"),
        ("COMPACTOR_MAX_PERSISTED_TRANSCRIPTS", "0", "compaction.max_persisted_transcripts"),
        (
            "COMPACTOR_PROJECTED_TOOL_RESULT_BUDGET",
            '{"max_bytes": -1}',
            "compaction.projected_tool_result_budget.max_bytes",
        ),
        (
            "COMPACTOR_PROJECTED_TOOL_RESULT_BUDGET",
            '{"max_bytes": 10, "bogus": 1}',
            "compaction.projected_tool_result_budget.bogus",
        ),
        ("COMPACTOR_LLM_PROVIDER", "gemini", "llm.provider"),
        ("COMPACTOR_LLM_TIMEOUT_S", "soon", "llm.timeout_s"),
    ],
)
def test_invalid_environment_value_names_the_key(
    var: str, value: str, key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_settings(environ={var: value})
    assert info.value.key == key
    assert key in str(info.value)


def test_precedence_defaults_file_environment_snapshot(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[compaction]
auto_compact_threshold_tokens = 1000
summary_max_output_tokens = 500
mode = "prefer_remote"
preserve_recent_delegation_results = 3

[conversation.tools.grep]
compaction = "keep"

[conversation.tools."*"]
compaction = "strip"
""",
    )
    env = {
        "COMPACTOR_AUTO_COMPACT_THRESHOLD_TOKENS": "2000",
        "COMPACTOR_SUMMARY_MAX_OUTPUT_TOKENS": "600",
    }
    base = load_settings(path, environ=env)
    snapshot = {
        "conversation_id": "c-1",
        "revision": 0,
        "messages": [{"role": "user", "content": "hi"}],
        "config": {"auto_compact_threshold_tokens": 3000},
        "tools": {"grep": {"compaction": "omit"}, "edit": {"compaction": "strip-requests"}},
    }
    effective = parse_snapshot(snapshot, base).settings
    c = effective.compaction
    assert c.auto_compact_threshold_tokens == 3000  # snapshot > env > file
    assert c.summary_max_output_tokens == 600  # env > file
    assert c.mode == "prefer_remote"  # file > default
    assert c.preserve_recent_delegation_results == 3  # file > default
    assert c.summary_max_input_chars == 80_000  # default
    assert effective.tools == {
        "grep": ToolConfig(compaction="omit"),  # snapshot > file
        "*": ToolConfig(compaction="strip"),  # file
        "edit": ToolConfig(compaction="strip-requests"),  # snapshot only
    }
    # The operator's settings object is not changed by a snapshot.
    assert base.compaction.auto_compact_threshold_tokens == 2000
    assert "edit" not in base.tools


def test_snapshot_without_overrides_keeps_settings() -> None:
    base = Settings()
    assert base.with_overrides(None, None) == base
    assert base.with_overrides({}, {}) == base


# --- errors name the dotted key -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("toml", "key", "reason_part"),
    [
        (
            "[compaction]\nprojected_tool_result_budget = { max_bytes = -1 }",
            "compaction.projected_tool_result_budget.max_bytes",
            "",
        ),
        ("[compaction]\nkeep_recent_tool_results = -1", "compaction.keep_recent_tool_results", ""),
        (
            "[compaction]\nauto_compact_threshold_tokens = -5",
            "compaction.auto_compact_threshold_tokens",
            "",
        ),
        (
            '[conversation.tools.grep]\ncompaction = "squash"',
            "conversation.tools.grep.compaction",
            "",
        ),
        (
            '[conversation.tools."*"]\ncompaction = "drop"',
            "conversation.tools.*.compaction",
            "",
        ),
        (
            '[conversation.tools.grep]\ncompactoin = "keep"',
            "conversation.tools.grep.compactoin",
            "unknown key",
        ),
        (
            '[compaction]\nauto_compact_trigger = "sometimes"',
            "compaction.auto_compact_trigger",
            "",
        ),
        ("[compaction]\nbogus_setting = 1", "compaction.bogus_setting", "unknown key"),
        ("[llm]\nbogus = 1", "llm.bogus", "unknown key"),
        ("[redis]\nbogus = 1", "redis.bogus", "unknown key"),
        ("[transcripts]\nbogus = 1", "transcripts.bogus", "unknown key"),
        ("[bogus_section]\nx = 1", "bogus_section", "unknown section"),
        (
            '[compaction]\nsummary_max_output_tokens = "many"',
            "compaction.summary_max_output_tokens",
            "",
        ),
        ("[compaction]\ntranscript_dir = 5", "compaction.transcript_dir", ""),
        ('[compaction]\nmode = "cloud"', "compaction.mode", ""),
        ("[llm]\ntimeout_s = 0", "llm.timeout_s", ""),
        ('[transcripts]\nmax_total_bytes = "lots"', "transcripts.max_total_bytes", ""),
        ("compaction = 5", "compaction", "table"),
    ],
)
def test_invalid_file_value_names_the_key(
    tmp_path: Path, toml: str, key: str, reason_part: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, toml + "\n"), environ={})
    assert info.value.key == key
    assert reason_part in info.value.reason
    assert info.value.reason
    assert info.value.to_dict()["key"] == key


def test_bad_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[compaction\nmode = \n")
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    assert info.value.key == str(path)
    assert "TOML" in info.value.reason


def test_non_utf8_config_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[llm]\nextra_instruction = "caf\xe9"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    assert info.value.key == str(path)


# --- the shipped config/compactor.toml ----------------------------------------------------------

# Every TOML section: the four of DESIGN.md §2, and any section Settings has grown since.
SECTION_MODELS: dict[str, type[BaseModel]] = {
    "compaction": CompactionConfig,
    "llm": LLMConfig,
    "redis": RedisConfig,
    "transcripts": TranscriptRetention,
} | {
    name: info.annotation
    for name, info in Settings.model_fields.items()
    if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)
}
# "# key = value": a default line. "# e.g. key = value" (an example) does not match.
_DEFAULT_LINE = re.compile(r"^#\s?([A-Za-z_][A-Za-z0-9_]*\s*=\s*\S.*)$")
_EXAMPLE_KEY = re.compile(r"^#\s*e\.g\.\s+([A-Za-z_][A-Za-z0-9_]*)\s*=")
_SECTION = re.compile(r"^\[([^\]]+)\]")


def _shipped_lines() -> list[str]:
    return SHIPPED.read_text(encoding="utf-8").splitlines()


def uncommented_defaults() -> str:
    """The shipped file with every ``# key = value`` default line uncommented."""
    out = []
    for line in _shipped_lines():
        match = _DEFAULT_LINE.match(line)
        out.append(match.group(1) if match else line)
    return "\n".join(out) + "\n"


def documented_keys() -> dict[str, set[str]]:
    """Per section: keys on default lines and on ``# e.g.`` example lines."""
    keys: dict[str, set[str]] = {}
    section = ""
    for line in _shipped_lines():
        if m := _SECTION.match(line):
            section = m.group(1)
        elif m := _DEFAULT_LINE.match(line):
            keys.setdefault(section, set()).add(m.group(1).split("=")[0].strip())
        elif m := _EXAMPLE_KEY.match(line):
            keys.setdefault(section, set()).add(m.group(1))
    return keys


FIELDS = [(s, f) for s, model in SECTION_MODELS.items() for f in model.model_fields]


def test_shipped_config_parses_and_resolves_to_defaults() -> None:
    settings = load_settings(SHIPPED, environ={})
    assert settings.model_dump(exclude={"source"}) == Settings().model_dump(exclude={"source"})


def test_uncommented_shipped_config_is_valid() -> None:
    data = tomllib.loads(uncommented_defaults())
    assert set(data) >= set(SECTION_MODELS)
    settings_from_mapping(data)  # raises ConfigError naming the key otherwise


@pytest.mark.parametrize(("section", "field"), FIELDS, ids=[f"{s}.{f}" for s, f in FIELDS])
def test_shipped_config_documents_field(section: str, field: str) -> None:
    documented = field in documented_keys().get(section, set())
    assert documented, f"config/compactor.toml does not document [{section}] {field}"


@pytest.mark.parametrize(("section", "field"), FIELDS, ids=[f"{s}.{f}" for s, f in FIELDS])
def test_shipped_config_default_line_is_the_builtin_default(section: str, field: str) -> None:
    data = tomllib.loads(uncommented_defaults())
    resolved = settings_from_mapping(data)
    got = getattr(getattr(resolved, section), field)
    want = getattr(getattr(Settings(), section), field)
    if section == "redis" and field == "url":
        got, want = redis_url(resolved), redis_url(Settings())
    assert got == want, f"[{section}] {field}: the file says {got!r}, the built-in is {want!r}"


# --- masking ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("redis://:hunter2@broker:6379/0", "hunter2"),
        ("redis://default:hunter2@broker:6379/0", "hunter2"),
        ("rediss://user:pa%40ss@broker:6380", "pa%40ss"),
        ("rediss://user:p@ss@broker:6380", "p@ss"),
        ("redis://hunter2@broker", "hunter2"),
    ],
)
def test_mask_url_hides_the_password(url: str, secret: str) -> None:
    masked = mask_url(url)
    assert masked is not None
    assert secret not in masked
    assert "broker" in masked


def test_mask_url_leaves_passwordless_urls() -> None:
    assert mask_url("redis://broker:6379/0") == "redis://broker:6379/0"
    assert mask_url(None) is None


def test_shown_settings_masks_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MY_LLM_KEY", "sk-planted-5c1e7")
    settings = load_settings(
        environ={
            "COMPACTOR_REDIS_URL": "redis://user:s3cr3t-pw@broker:6379/0",
            "COMPACTOR_LLM_API_KEY_ENV": "MY_LLM_KEY",
            "COMPACTOR_LLM_HEADERS": '{"X-Api-Key": "hdr-secret-91"}',
        }
    )
    shown = repr(shown_settings(settings))
    for secret in ("s3cr3t-pw", "sk-planted-5c1e7", "hdr-secret-91"):
        assert secret not in shown
    data = shown_settings(settings)
    assert data["redis"]["url"] == "redis://user:***@broker:6379/0"
    assert data["llm"]["api_key_env"] == "MY_LLM_KEY"
    assert data["llm"]["api_key"] == "set (masked)"
    assert data["llm"]["headers"] == {"X-Api-Key": "***"}
    assert data["conversation"] == {"tools": {}}


# --- [broker] -----------------------------------------------------------------------------------


def test_the_broker_defaults_to_the_state_redis_and_amqp_selects_rabbitmq() -> None:
    from worker.backend.connection import state_url
    from worker.backend.queues import broker_kind, broker_url
    from worker.runtime.celery_app import celery_config

    plain = load_settings(None, environ={"COMPACTOR_REDIS_URL": "redis://state:6379/2"})
    assert broker_url(plain) == state_url(plain) == "redis://state:6379/2"
    assert celery_config(plain)["broker_transport"] == "worker.backend.broker:Transport"
    amqp = "amqp://guest:s3cret@rabbit:5672/compactor"
    both = load_settings(
        None, environ={"COMPACTOR_REDIS_URL": "redis://state:6379/2", "COMPACTOR_BROKER_URL": amqp}
    )
    assert (broker_url(both), state_url(both)) == (amqp, "redis://state:6379/2")
    assert broker_kind(amqp) == "rabbitmq" and broker_kind(state_url(both)) == "redis"
    config = celery_config(both)
    assert "broker_transport" not in config  # the Redis workaround applies to Redis only
    assert config["broker_transport_options"] == {"confirm_publish": True}
    shown = repr(shown_settings(both))
    assert "s3cret" not in shown and "amqp://guest:***@rabbit:5672/compactor" in shown


@pytest.mark.parametrize("url", ["kafka://u:s3cret@host", "sqs://", "rabbit.example:5672"])
def test_an_unsupported_broker_scheme_is_refused_without_showing_the_url(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, environ={"COMPACTOR_BROKER_URL": url})
    assert caught.value.key == "broker.url"
    assert "unsupported broker" in caught.value.reason
    assert "s3cret" not in str(caught.value)


def test_rabbitmq_consumer_timeout_must_outlast_the_longest_task() -> None:
    from worker.runtime.celery_app import celery_config

    env = {"COMPACTOR_BROKER_URL": "amqp://guest:guest@127.0.0.1:5672//"}
    too_long = load_settings(
        None, environ=env | {"COMPACTOR_WORKER_SUMMARIZE_TIME_LIMIT_S": "1800"}
    )
    with pytest.raises(ConfigError) as caught:
        celery_config(too_long)
    assert caught.value.key == "broker.consumer_timeout_s"
    raised = env | {
        "COMPACTOR_WORKER_SUMMARIZE_TIME_LIMIT_S": "1800",
        "COMPACTOR_BROKER_CONSUMER_TIMEOUT_S": "3600",
        "COMPACTOR_REDIS_VISIBILITY_TIMEOUT_S": "60",  # not used with RabbitMQ: not checked
    }
    assert celery_config(load_settings(None, environ=raised))["broker_url"].startswith("amqp://")


@pytest.mark.parametrize(
    "url", ["http://user:s3cret@127.0.0.1:6379/0", "valkey://h:1", "127.0.0.1:6379", "redis:6379"]
)
def test_a_redis_url_of_another_scheme_is_invalid_config_without_showing_the_url(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, environ={"COMPACTOR_REDIS_URL": url})
    assert caught.value.key == "redis.url"
    assert "unsupported Redis" in caught.value.reason and "redis://" in caught.value.reason
    assert "s3cret" not in str(caught.value) and "127.0.0.1" not in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "rediss://:pw@h:6380/1",
        "unix:///run/redis.sock?db=2",
        "redis+cluster://h1:7000,h2:7001",
        "rediss+sentinel://h:26379/mymaster/0",
    ],
)
def test_every_form_of_a_redis_url_is_accepted(url: str) -> None:
    settings = load_settings(None, environ={"COMPACTOR_REDIS_URL": url})
    assert redis_url(settings) == url


# --- where a setting came from, and the variables nothing reads ------------------------------


def test_each_setting_knows_where_it_came_from(tmp_path: Path) -> None:
    from worker.config import with_redis_url

    config = tmp_path / "c.toml"
    config.write_text('[redis]\nurl = "redis://file:6379/0"\n[broker]\nconsumer_timeout_s = 600\n')
    from_file = load_settings(config, environ={})
    assert from_file.origin_of("redis.url") == str(config)
    assert from_file.origin_of("broker.consumer_timeout_s") == str(config)
    assert from_file.origin_of("broker.url") == "default"
    env = {"COMPACTOR_REDIS_URL": "redis://env:6379/0"}
    from_env = load_settings(config, environ=env)
    assert redis_url(from_env) == "redis://env:6379/0"
    assert from_env.origin_of("redis.url") == "COMPACTOR_REDIS_URL"  # the environment wins
    moved = with_redis_url(from_env, "redis://127.0.0.1:1/0", origin="embedded")
    assert moved.origin_of("redis.url") == "embedded"
    assert from_env.origin_of("redis.url") == "COMPACTOR_REDIS_URL"  # a copy: unchanged
    overridden = moved.with_overrides({"mode": "prefer_remote"}, None)
    assert overridden.origin_of("redis.url") == "embedded"
    assert load_settings(None, environ={}).origin_of("redis.url") == "default"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "worker.config" and r.levelno == logging.WARNING
    ]


def test_an_unknown_compactor_variable_is_warned_about_once_with_the_closest_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Names made here, not written out: the scan of the repository below must not meet them.
    misspelled = "COMPACTOR_" + "REDIS_ULR"
    unrelated = "COMPACTOR_" + "NOTHING_LIKE_ANY_SETTING_" + str(id(caplog))
    env = {misspelled: "redis://x:1/0", unrelated: "s3cret-value"}
    with caplog.at_level(logging.WARNING, logger="worker.config"):
        settings = load_settings(None, environ=env)
        load_settings(None, environ=env)  # a second load in the process: no second warning
    assert redis_url(settings) is None  # ignored, as said
    said = _warnings(caplog)
    assert len([m for m in said if misspelled in m]) == 1, said
    assert any(misspelled in m and "did you mean COMPACTOR_REDIS_URL?" in m for m in said)
    (other,) = [m for m in said if unrelated in m]
    assert "did you mean" not in other
    assert "s3cret" not in " ".join(said)  # names only, never values


def test_variables_that_are_not_settings_are_not_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from worker.config import OTHER_VARIABLES, env_names

    env = dict.fromkeys(OTHER_VARIABLES, "1") | dict.fromkeys(env_names(), "x")
    env |= {"COMPACTOR_TEST_REDIS_URL": "redis://h:1/0", "COMPACTOR_TEST_ANYTHING_ELSE": "1"}
    key_variable = "COMPACTOR_" + "OUR_LLM_KEY"  # llm.api_key_env may name a COMPACTOR_ one
    env[key_variable] = "sk-not-a-setting"
    from worker.config import unknown_variables

    assert unknown_variables(env, also_known=[key_variable]) == []
    with caplog.at_level(logging.WARNING, logger="worker.config"):
        load_settings(None, environ={"COMPACTOR_LLM_API_KEY_ENV": key_variable, key_variable: "k"})
    assert _warnings(caplog) == []


SCANNED = ["worker", "tests", "bench", "examples", "docs", "config"]
SCANNED_FILES = ["README.md", "Makefile", "Dockerfile", "docker-compose.yml"]


def test_every_compactor_variable_the_repository_names_is_known() -> None:
    """Every ``COMPACTOR_*`` name written anywhere in the repository (the code, the tests, the
    benchmarks, the docs, the deployment files) is a setting or a known other variable: none of
    them would be warned about."""
    from worker.config import unknown_variables

    files = [REPO_ROOT / f for f in SCANNED_FILES]
    for top in SCANNED:
        files += [p for p in (REPO_ROOT / top).rglob("*") if p.is_file()]
    names: dict[str, str] = {}
    for path in files:
        if path.suffix in {".py", ".md", ".toml", ".yml", ".yaml", ".mjs", ".json", ""}:
            text = path.read_text(encoding="utf-8", errors="replace")
            for name in re.findall(r"\bCOMPACTOR_[A-Z0-9_]*[A-Z0-9]\b", text):
                names.setdefault(name, str(path.relative_to(REPO_ROOT)))
    assert len(names) > 30, names  # the scan found what it should
    unknown = unknown_variables(names)
    # The misspelling docs/configuration.md shows as what gets warned about.
    documented = "COMPACTOR_" + "REDIS_ULR"
    assert names.pop(documented, None) == "docs/configuration.md"
    unknown.remove(documented)
    assert unknown == [], {name: names[name] for name in unknown}
