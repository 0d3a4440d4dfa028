"""The deployment files: ``docker-compose.yml``, ``Dockerfile``, ``.dockerignore``.

Docker does not run here, so these tests check the files' structure, and that every command
line they run exists in this package: each ``compactor`` line is parsed by the real argument
parser and run as ``python -m worker ... --help``; each ``celery -A worker`` line is run as
``python -m celery -A worker ... --help`` (which imports our Celery app); the Dockerfile's
tokenizer step is executed for real. None of it needs Redis.

PyYAML is not a dependency, so the compose file is read by ``load_yaml_subset`` below: a strict
loader for the YAML subset the file keeps to (block mappings and sequences, one-line flow
sequences, quoted and plain scalars, anchors, aliases and ``<<`` merge keys). Anything outside
that subset, and every plain scalar YAML could read as something other than a string, int, bool
or null (``yes``, ``6379:6379``, ``1.5``, ``010`` ...), is an error, not a guess. Where PyYAML
happens to be importable, the two loaders must agree.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from worker.celery_app import EVALUATE_QUEUE, MAINTENANCE_QUEUE, QUEUES, SUMMARIZE_QUEUE
from worker.cli import build_parser
from worker.cli_service import celery_command
from worker.config import Settings, load_settings

REPO = Path(__file__).resolve().parent.parent
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"

OUR_IMAGE_SERVICES = {"evaluate", "summarize", "beat", "metrics"}
WORKER_SERVICES = {"evaluate", "summarize"}
TRANSCRIPT_DIR = "/data/transcripts"
REDIS_URL = "redis://redis:6379/0"
CONTAINER_HOSTNAME = "c0ffee123456"  # stands in for $HOSTNAME inside a container


# --- a strict loader for the YAML subset docker-compose.yml uses ---------------------------


class YamlSubsetError(ValueError):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")


_KEY = re.compile(r"""([A-Za-z0-9_.<][A-Za-z0-9_.<-]*|"[^"\\]*"|'[^']*'):(?: +(.*))?$""")
_ANCHOR = re.compile(r"[&*]([A-Za-z0-9_-]+)")
_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)")
# Plain scalars that YAML 1.1 (PyYAML) or 1.2 would read as something else than our reading.
_AMBIGUOUS = re.compile(
    r"""(?ix)
    (y|n|yes|no|on|off)                                  # YAML 1.1 booleans
    | [-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)(e[-+]?[0-9]+)?   # floats, 010, 1_000
    | [-+]?\.(inf|nan)
    | [-+]?0[xob][0-9a-f_]+                              # hex, octal, binary
    | [-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?      # sexagesimal: 6379:6379, 1:30
    | [0-9]{4}-[0-9]{1,2}-[0-9]{1,2}.*                   # timestamps
    | = | <<
    """
)


def _strip_comment(raw: str, line: int) -> str:
    """``raw`` without its ``#`` comment; quotes open only where a scalar can start."""
    quote = ""
    i = 0
    while i < len(raw):
        char = raw[i]
        if quote == '"':
            if char == "\\":
                i += 1
            elif char == '"':
                quote = ""
        elif quote == "'":
            if char == "'":
                if raw[i + 1 : i + 2] == "'":
                    i += 1
                else:
                    quote = ""
        elif char in "\"'" and (i == 0 or raw[i - 1] in " [,"):
            quote = char
        elif char == "#" and (i == 0 or raw[i - 1] == " "):
            return raw[:i]
        i += 1
    if quote:
        raise YamlSubsetError(line, "unterminated quoted scalar (multi-line scalars unsupported)")
    return raw


def _scalar(text: str, line: int) -> Any:
    if text.startswith('"'):
        try:
            return json.loads(text)  # JSON's string escapes are a subset of YAML's
        except json.JSONDecodeError as exc:
            raise YamlSubsetError(line, f"bad double-quoted scalar {text!r}: {exc}") from None
    if text.startswith("'"):
        inner = text[1:-1]
        if len(text) < 2 or not text.endswith("'") or "'" in inner.replace("''", ""):
            raise YamlSubsetError(line, f"bad single-quoted scalar {text!r}")
        return inner.replace("''", "'")
    if text[0] in "[]{},#&*!|>%@`" or (text[0] in "-?:" and text[1:2] in ("", " ")):
        raise YamlSubsetError(line, f"unsupported YAML syntax {text!r}")
    if ": " in text or text.endswith(":") or " #" in text:
        raise YamlSubsetError(line, f"ambiguous plain scalar {text!r}: quote it")
    if text in ("null", "Null", "NULL", "~"):
        return None
    if text in ("true", "True", "TRUE", "false", "False", "FALSE"):
        return text.lower() == "true"
    if _INT.fullmatch(text):
        return int(text)
    if _AMBIGUOUS.fullmatch(text):
        raise YamlSubsetError(line, f"YAML may not read {text!r} as a string: quote it")
    return text


def _flow_sequence(text: str, line: int) -> list[Any]:
    """A one-line ``[a, "b", 'c']`` of scalars."""
    items: list[Any] = []
    i = 1
    while True:
        while text[i : i + 1] == " ":
            i += 1
        if text[i : i + 1] == "]" and not items:
            i += 1
            break
        start = i
        if text[i : i + 1] == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
        elif text[i : i + 1] == "'":
            i += 1
            while i < len(text) and not (text[i] == "'" and text[i + 1 : i + 2] != "'"):
                i += 2 if text[i] == "'" else 1
            i += 1
        else:
            while i < len(text) and text[i] not in ",]":
                i += 1
        token = text[start:i].strip()
        if not token:
            raise YamlSubsetError(line, f"empty item in flow sequence {text!r}")
        if token[0] in "[{":
            raise YamlSubsetError(line, "nested flow collections unsupported")
        items.append(_scalar(token, line))
        while text[i : i + 1] == " ":
            i += 1
        if text[i : i + 1] == ",":
            i += 1
            continue
        if text[i : i + 1] == "]":
            i += 1
            break
        raise YamlSubsetError(line, f"malformed flow sequence {text!r}")
    if text[i:].strip():
        raise YamlSubsetError(line, f"text after flow sequence: {text[i:]!r}")
    return items


class _Loader:
    def __init__(self, text: str) -> None:
        self.lines: list[tuple[int, int, str]] = []  # (line number, indent, content)
        self.anchors: dict[str, Any] = {}
        self.pos = 0
        for number, raw in enumerate(text.splitlines(), 1):
            if "\t" in raw:
                raise YamlSubsetError(number, "tab character")
            if raw.startswith(("%", "---", "...")):
                raise YamlSubsetError(number, "directives and document markers unsupported")
            content = _strip_comment(raw, number).rstrip()
            if content.strip():
                indent = len(content) - len(content.lstrip(" "))
                self.lines.append((number, indent, content.strip()))

    def document(self) -> Any:
        if not self.lines:
            return None
        value = self.block(self.lines[0][1])
        if self.pos != len(self.lines):
            raise YamlSubsetError(self.lines[self.pos][0], "unexpected dedent")
        return value

    def block(self, indent: int) -> Any:
        text = self.lines[self.pos][2]
        if text == "-" or text.startswith("- "):
            return self.sequence(indent)
        return self.mapping(indent)

    def mapping(self, indent: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        merges: list[dict[Any, Any]] = []
        while self.pos < len(self.lines):
            number, ind, text = self.lines[self.pos]
            if ind < indent:
                break
            if ind > indent:
                raise YamlSubsetError(number, "unexpected indentation")
            match = _KEY.match(text)
            if match is None:
                raise YamlSubsetError(number, f"expected `key: value`, got {text!r}")
            raw_key = match.group(1)
            key: Any = raw_key if raw_key == "<<" else _scalar(raw_key, number)
            self.pos += 1
            value = self.value(match.group(2) or "", indent, number)
            if key == "<<":
                if not isinstance(value, dict):
                    raise YamlSubsetError(number, "a merge key takes one aliased mapping")
                merges.append(value)
            elif key in out:
                raise YamlSubsetError(number, f"duplicate key {key!r}")
            else:
                out[key] = value
        for merged in merges:  # explicit keys win; earlier merges win over later ones
            for key, value in merged.items():
                out.setdefault(key, copy.deepcopy(value))
        return out

    def sequence(self, indent: int) -> list[Any]:
        out: list[Any] = []
        while self.pos < len(self.lines):
            number, ind, text = self.lines[self.pos]
            if ind < indent:
                break
            if ind > indent or not (text == "-" or text.startswith("- ")):
                raise YamlSubsetError(number, "expected a `- item` line")
            rest = text[1:].strip()
            if not rest or _KEY.match(rest):
                raise YamlSubsetError(number, "only scalars and flow sequences in block lists")
            self.pos += 1
            out.append(self.value(rest, indent, number))
        return out

    def value(self, text: str, indent: int, number: int) -> Any:
        anchor = None
        if text.startswith("&"):
            match = _ANCHOR.match(text)
            if match is None:
                raise YamlSubsetError(number, f"bad anchor {text!r}")
            anchor, text = match.group(1), text[match.end() :].strip()
        if not text:
            nested = self.pos < len(self.lines) and self.lines[self.pos][1] > indent
            value = self.block(self.lines[self.pos][1]) if nested else None
        elif text.startswith("*"):
            match = _ANCHOR.fullmatch(text)
            if match is None or match.group(1) not in self.anchors:
                raise YamlSubsetError(number, f"unknown alias {text!r}")
            value = copy.deepcopy(self.anchors[match.group(1)])
        elif text.startswith("["):
            value = _flow_sequence(text, number)
        else:
            value = _scalar(text, number)
        if anchor is not None:
            self.anchors[anchor] = value
        return value


def load_yaml_subset(text: str) -> Any:
    return _Loader(text).document()


# --- compose semantics: interpolation and command lines ------------------------------------

_INTERPOLATION = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>[^}$]*))?\})"
)


def interpolate(text: str, host_env: Mapping[str, str]) -> str:
    """Compose's ``$$``, ``${VAR}``, ``${VAR:-default}`` and ``${VAR-default}``. Anything else
    with a ``$`` (bare ``$VAR``, ``${VAR:?}``, nesting) is rejected: we keep to the forms whose
    meaning is unambiguous, and a required variable with no default would break a plain
    ``docker compose up``."""
    if "$" in _INTERPOLATION.sub("", text):
        raise AssertionError(f"unsupported or bare $-reference in {text!r}")

    def substitute(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name, op = match["name"], match["op"]
        if op is None:
            raise AssertionError(f"${{{name}}} has no default: compose up would need it set")
        if op == ":-":
            return host_env.get(name) or match["default"]
        return host_env.get(name, match["default"])

    return _INTERPOLATION.sub(substitute, text)


def interpolated(value: Any, host_env: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return interpolate(value, host_env)
    if isinstance(value, list):
        return [interpolated(v, host_env) for v in value]
    if isinstance(value, dict):
        return {k: interpolated(v, host_env) for k, v in value.items()}
    return value


def host_variables(value: Any) -> set[str]:
    if isinstance(value, str):
        return {m["name"] for m in _INTERPOLATION.finditer(value) if m["name"]}
    if isinstance(value, list):
        return set().union(*map(host_variables, value)) if value else set()
    if isinstance(value, dict):
        return set().union(*map(host_variables, value.values())) if value else set()
    return set()


def command_argv(command: str | list[str]) -> list[str]:
    """A compose ``command``: a string is split shell-like (no shell runs it)."""
    return shlex.split(command) if isinstance(command, str) else list(command)


def healthcheck_argv(test: list[str]) -> list[str]:
    """A healthcheck ``test`` as the argv it runs. For CMD-SHELL only a simple command with an
    optional ``|| exit 1`` is accepted; $HOSTNAME is what the container's shell expands."""
    kind, *rest = test
    if kind == "CMD":
        return rest
    assert kind == "CMD-SHELL" and len(rest) == 1, test
    return shell_argv(rest[0])


def shell_argv(line: str) -> list[str]:
    line = line.removesuffix(" || exit 1").replace("$HOSTNAME", CONTAINER_HOSTNAME)
    assert not re.search(r"[|;&`<>]|\$", line), f"not a simple command: {line!r}"
    return shlex.split(line)


def option(argv: list[str], name: str) -> str:
    """The value of ``--name V`` or ``--name=V`` in argv (exactly once)."""
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == name]
    values += [a.split("=", 1)[1] for a in argv if a.startswith(name + "=")]
    assert len(values) == 1, f"{name} given {len(values)} times in {argv}"
    return values[0]


# --- Dockerfile and .dockerignore ----------------------------------------------------------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue  # Docker drops comment lines, also inside a continuation
        if stripped.endswith("\\"):
            pending += raw.rstrip()[:-1]
            continue
        keyword, _, args = (pending + raw).strip().partition(" ")
        out.append((keyword.upper(), args.strip()))
        pending = ""
    assert not pending, "Dockerfile ends inside a line continuation"
    return out


def dockerfile_stages(text: str) -> list[list[tuple[str, str]]]:
    """The instructions of each stage, in order; the global ARGs before the first FROM are
    resolved into every FROM line."""
    args: dict[str, str] = {}
    stages: list[list[tuple[str, str]]] = []
    for keyword, rest in dockerfile_instructions(text):
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            for name, value in args.items():
                rest = rest.replace("${" + name + "}", value)
            stages.append([(keyword, rest)])
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].append((keyword, rest))
    return stages


def stage_env(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, rest in stage:
        if keyword == "ENV":
            for pair in shlex.split(rest):
                name, sep, value = pair.partition("=")
                assert sep, f"use ENV NAME=value, not the legacy form: {rest!r}"
                env[name] = value
    return env


def _glob_regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignored(patterns: list[str], path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent directories
    decides; ``!`` re-includes."""
    parts = path.split("/")
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = _glob_regex(pattern.removeprefix("!").strip("/"))
        if any(regex.fullmatch("/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            excluded = not negate
    return excluded


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = load_yaml_subset(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services as compose runs them when the host sets none of the optional variables."""
    resolved: dict[str, dict[str, Any]] = interpolated(compose["services"], {})
    return resolved


@pytest.fixture(scope="module")
def stages() -> list[list[tuple[str, str]]]:
    return dockerfile_stages(DOCKERFILE.read_text(encoding="utf-8"))


def final_stage(stages: list[list[tuple[str, str]]]) -> list[tuple[str, str]]:
    return stages[-1]


def only(stage: list[tuple[str, str]], keyword: str) -> str:
    values = [rest for k, rest in stage if k == keyword]
    assert len(values) == 1, f"expected one {keyword}, found {values}"
    return values[0]


def worker_argv(service: dict[str, Any]) -> list[str]:
    argv = command_argv(service["command"])
    assert argv[:2] == ["compactor", "worker"], argv
    return argv


# --- the YAML subset loader itself ---------------------------------------------------------


def test_yaml_subset_loader_reads_what_yaml_means() -> None:
    text = """\
# comment
x-base: &base
  image: "img:1"     # trailing comment
  env:
    A: 'it''s'
    B: ${B:-}
    C:
  list:
    - one
    - "two # not a comment"
svc:
  <<: *base
  image: other
  test: ["CMD-SHELL", "echo \\"hi\\" || exit 1", plain]
  count: 3
  flag: true
  empty: []
"""
    assert load_yaml_subset(text) == {
        "x-base": {
            "image": "img:1",
            "env": {"A": "it's", "B": "${B:-}", "C": None},
            "list": ["one", "two # not a comment"],
        },
        "svc": {
            "image": "other",
            "env": {"A": "it's", "B": "${B:-}", "C": None},
            "list": ["one", "two # not a comment"],
            "test": ["CMD-SHELL", 'echo "hi" || exit 1', "plain"],
            "count": 3,
            "flag": True,
            "empty": [],
        },
    }


@pytest.mark.parametrize(
    "text",
    [
        "a:\n\tb: 1",  # tab
        "a: yes",  # YAML 1.1 boolean
        "ports:\n  - 22:22",  # a sexagesimal integer (1342) in YAML 1.1
        "a: 1.5",
        "a: 010",  # octal in YAML 1.1
        "a: 0x1f",
        "a: 2026-01-01",
        "a: 1\na: 2",  # duplicate key
        "a: *nowhere",
        "a: |\n  text",  # block scalar
        "a: {b: 1}",  # flow mapping
        'a: "open',
        "a:\n  - b: 1",  # mapping inside a sequence
        "a: b: c",
        "a:\n    b: 1\n  c: 2",  # inconsistent indentation
        "a: [b, [c]]",
        "a: !!str b",
    ],
)
def test_yaml_subset_loader_rejects_what_it_does_not_support(text: str) -> None:
    with pytest.raises(YamlSubsetError):
        load_yaml_subset(text)


def test_compose_file_parses_the_same_with_pyyaml_where_installed() -> None:
    """PyYAML is not a dependency; where it is importable anyway, both loaders must agree."""
    text = COMPOSE.read_text(encoding="utf-8")
    ours = load_yaml_subset(text)
    assert isinstance(ours, dict) and "services" in ours
    if importlib.util.find_spec("yaml") is not None:
        import yaml

        assert yaml.safe_load(text) == ours


# --- docker-compose.yml --------------------------------------------------------------------


def test_services_and_roles(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == {"redis", "evaluate", "summarize", "beat", "flower", "metrics"}
    ours = {name for name, s in services.items() if s.get("build") == "."}
    assert ours == OUR_IMAGE_SERVICES
    assert len({services[name]["image"] for name in ours}) == 1, "one image for every role"

    evaluate = worker_argv(services["evaluate"])
    assert option(evaluate, "--pool") == "prefork"
    summarize = worker_argv(services["summarize"])
    assert option(summarize, "--pool") == "threads"
    assert option(summarize, "--concurrency") == "64"
    assert command_argv(services["beat"]["command"]) == ["compactor", "beat"]
    metrics = command_argv(services["metrics"]["command"])
    assert metrics[:2] == ["compactor", "metrics"]
    assert option(metrics, "--host") == "0.0.0.0"
    port = option(metrics, "--serve")
    assert any(p.endswith(f":{port}") for p in services["metrics"]["ports"])

    flower = services["flower"]
    assert flower["image"].startswith("mher/flower:")
    flower_argv = command_argv(flower["command"])
    assert flower_argv[0] == "celery" and "flower" in flower_argv
    assert option(flower_argv, "--broker") == REDIS_URL


def test_redis_is_durable_and_never_evicts(compose: dict[str, Any], services: Any) -> None:
    redis = services["redis"]
    assert redis["image"].startswith("redis:7")
    argv = command_argv(redis["command"])
    assert argv[0] == "redis-server"
    assert option(argv, "--appendonly") == "yes"
    assert option(argv, "--maxmemory-policy") == "noeviction"
    volume, _, target = redis["volumes"][0].partition(":")
    assert target == "/data" and volume in compose["volumes"], "the AOF must outlive the container"
    assert "redis-cli ping" in redis["healthcheck"]["test"][-1]
    assert "depends_on" not in redis


def test_everything_waits_for_a_healthy_redis(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        if name != "redis":
            assert service["depends_on"] == {"redis": {"condition": "service_healthy"}}, name
    for name in OUR_IMAGE_SERVICES:
        assert services[name]["environment"]["COMPACTOR_REDIS_URL"] == REDIS_URL, name


def test_workers_are_scalable(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        assert "container_name" not in service, f"{name}: container_name prevents --scale"
    for name in WORKER_SERVICES:
        service = services[name]
        assert "ports" not in service, f"{name}: a fixed host port collides between replicas"
        assert "hostname" not in service, f"{name}: replicas would share one Celery node name"
        assert service.get("deploy", {}).get("replicas", 1) >= 1
        node = option(worker_argv(service), "--name")
        assert node.endswith("@%h"), f"{name}: each replica needs its own node name"


def test_exactly_one_scheduler(services: dict[str, dict[str, Any]]) -> None:
    def runs_beat(service: dict[str, Any]) -> bool:
        argv = command_argv(service.get("command", []))
        return argv[:2] == ["compactor", "beat"] or (argv[:1] == ["celery"] and "beat" in argv)

    schedulers = [name for name, service in services.items() if runs_beat(service)]
    assert schedulers == ["beat"]
    assert services["beat"]["deploy"]["replicas"] == 1
    for name, service in services.items():  # no worker embeds a scheduler (celery worker -B)
        argv = command_argv(service.get("command", []))
        assert "-B" not in argv and "--beat" not in argv, name


def test_queues_match_the_celery_app(services: dict[str, dict[str, Any]]) -> None:
    evaluate = set(option(worker_argv(services["evaluate"]), "--queues").split(","))
    summarize = set(option(worker_argv(services["summarize"]), "--queues").split(","))
    assert evaluate == {EVALUATE_QUEUE, MAINTENANCE_QUEUE}
    assert summarize == {SUMMARIZE_QUEUE}, "evaluations must never wait behind LLM summaries"
    assert evaluate | summarize == set(QUEUES), "every queue has a consumer"


def test_transcript_volume_is_shared_by_every_worker(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    assert "transcripts" in compose["volumes"]
    for name in WORKER_SERVICES:
        service = services[name]
        assert f"transcripts:{TRANSCRIPT_DIR}" in service["volumes"], name
        assert service["environment"]["COMPACTOR_TRANSCRIPT_DIR"] == TRANSCRIPT_DIR, name


def test_container_settings_are_the_defaults_plus_redis_and_transcripts(
    services: dict[str, dict[str, Any]],
) -> None:
    """With no host variables set, every COMPACTOR_* value the compose file passes is valid and
    changes nothing but the Redis URL and the transcript directory."""
    for name in OUR_IMAGE_SERVICES:
        env = {k: str(v) for k, v in services[name]["environment"].items() if v is not None}
        settings = load_settings(REPO / "config" / "compactor.toml", environ=env)
        assert settings.redis.url is not None
        assert settings.redis.url.get_secret_value() == REDIS_URL
        assert settings.compaction.transcript_dir == Path(TRANSCRIPT_DIR)
        defaults = Settings().model_dump(exclude={"source"})
        ours = settings.model_dump(exclude={"source"})
        for section, field in (("redis", "url"), ("compaction", "transcript_dir")):
            del defaults[section][field], ours[section][field]
        assert ours == defaults, name


def test_no_secret_literals(compose: dict[str, Any]) -> None:
    for path in (COMPOSE, DOCKERFILE, DOCKERIGNORE):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"\bsk-[A-Za-z0-9_-]{6,}", text), path.name
        assert not re.search(
            r"(?i)(api[_-]?key|token|secret|password)\s*[:=]\s*['\"]?\w{16,}", text
        )
    secret_name = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD)$")
    for name, service in compose["services"].items():
        env = service.get("environment") or {}
        for var, value in env.items():
            if secret_name.search(var):
                assert value in (f"${{{var}}}", f"${{{var}:-}}"), (
                    f"{name}: {var} must come from the host by name, got {value!r}"
                )
            assert "@" not in str(value), f"{name}: credentials in a URL ({var})"
    llm_key = Settings().llm.api_key_env
    for name in OUR_IMAGE_SERVICES:
        assert llm_key in compose["services"][name]["environment"], f"{name}: no {llm_key}"


def test_interpolation_is_explicit(compose: dict[str, Any]) -> None:
    """Every ${VAR} has a default (a plain `compose up` works with nothing set), and the
    container-side $HOSTNAME in health checks is escaped as $$ so compose leaves it alone."""
    names = host_variables(compose)
    assert names, "the file passes host variables through"
    for name in names:
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", name), name
    interpolated(compose, {})  # raises on a bare $VAR or a variable without default
    for name in WORKER_SERVICES:
        test = compose["services"][name]["healthcheck"]["test"]
        assert "$$HOSTNAME" in test[-1], f"{name}: $HOSTNAME would be the host's, not the box's"


def test_every_service_has_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        check = service["healthcheck"]
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name
        assert {"interval", "timeout", "retries"} <= set(check), name


def test_worker_healthchecks_ping_their_own_node(services: dict[str, dict[str, Any]]) -> None:
    for name in WORKER_SERVICES:
        node = option(worker_argv(services[name]), "--name")
        argv = healthcheck_argv(services[name]["healthcheck"]["test"])
        assert argv[:5] == ["celery", "-A", "worker", "inspect", "ping"], argv
        assert option(argv, "--destination") == node.replace("%h", CONTAINER_HOSTNAME)


def test_beat_healthcheck_watches_the_schedule_file_beat_writes(services: Any) -> None:
    argv = healthcheck_argv(services["beat"]["healthcheck"]["test"])
    assert argv[:2] == ["python", "-c"]
    compile(argv[2], "<beat healthcheck>", "exec")
    # In the container TMPDIR is unset, so beat's schedule lives under /tmp.
    schedule = option(celery_command("beat", None, workdir=Path("/tmp")), "--schedule")
    assert f"glob.glob('{schedule}*')" in argv[2]


# --- Dockerfile ----------------------------------------------------------------------------


def test_dockerfile_base_user_and_install(stages: list[list[tuple[str, str]]]) -> None:
    for stage in stages:
        image = stage[0][1].split()[0]
        assert image == "python:3.11-slim", image
    runtime = final_stage(stages)
    user = [rest for keyword, rest in runtime if keyword == "USER"]
    assert user and user[-1] not in ("root", "0"), "the runtime runs as an unprivileged user"
    creates_user = [rest for k, rest in runtime if k == "RUN" and "useradd" in rest]
    assert len(creates_user) == 1 and user[-1] in creates_user[0]
    installs = [
        rest for stage in stages for k, rest in stage if k == "RUN" and "pip install" in rest
    ]
    assert installs == ["pip install ."], installs
    runs = " ".join(rest for stage in stages for k, rest in stage if k == "RUN")
    assert "[dev]" not in runs and "requirements-dev" not in runs


def test_dockerfile_bakes_both_tokenizers(
    stages: list[list[tuple[str, str]]], tmp_path: Path
) -> None:
    runtime = final_stage(stages)
    cache_dir = stage_env(runtime)["TIKTOKEN_CACHE_DIR"]
    assert cache_dir == "/opt/tiktoken"
    (seed,) = [i for i, (k, rest) in enumerate(runtime) if k == "RUN" and "seed_tiktoken" in rest]
    env_at = next(i for i, (k, rest) in enumerate(runtime) if "TIKTOKEN_CACHE_DIR=" in rest)
    assert env_at < seed, "TIKTOKEN_CACHE_DIR must be set before the files are seeded"
    argv = shlex.split(runtime[seed][1])
    assert argv[0] == "--network=none", "the bake must prove counting needs no network"
    assert argv[1:3] == ["python", "-c"] and len(argv) == 4
    code = argv[3]
    assert "seed_tiktoken_cache(" in code
    for name in ("o200k_base", "cl100k_base"):
        assert f"'{name}'" in code
    # Run the very same step here, with a dead proxy standing in for --network=none.
    cache = tmp_path / "tiktoken"
    env = dict(os.environ, TIKTOKEN_CACHE_DIR=str(cache))
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        env[proxy] = "http://127.0.0.1:9"
    env.pop("NO_PROXY", None)
    env.pop("no_proxy", None)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert len(list(cache.iterdir())) == 2, "one rank file per encoding"


def test_dockerfile_transcript_volume_owned_by_the_app_user(
    stages: list[list[tuple[str, str]]],
) -> None:
    runtime = final_stage(stages)
    assert stage_env(runtime)["COMPACTOR_TRANSCRIPT_DIR"] == TRANSCRIPT_DIR
    assert json.loads(only(runtime, "VOLUME")) == [TRANSCRIPT_DIR]
    user = [rest for keyword, rest in runtime if keyword == "USER"][-1]
    chown = [r for k, r in runtime if k == "RUN" and f"chown {user}:{user} {TRANSCRIPT_DIR}" in r]
    assert chown, "a fresh named volume copies the image directory's owner"
    keywords = [k for k, _ in runtime]
    assert keywords.index("VOLUME") > runtime.index(("RUN", chown[0])), "chown before VOLUME"


def test_dockerfile_default_command_and_healthcheck(stages: list[list[tuple[str, str]]]) -> None:
    runtime = final_stage(stages)
    assert json.loads(only(runtime, "CMD")) == ["compactor", "worker"]
    check = only(runtime, "HEALTHCHECK")
    options, _, command = check.partition(" CMD ")
    assert {"--interval", "--timeout", "--retries"} <= {o.split("=")[0] for o in options.split()}
    argv = shell_argv(command.strip())
    assert argv[:5] == ["celery", "-A", "worker", "inspect", "ping"]
    # The default CMD's node name is compactor@%h (see worker.cli_service.celery_command).
    default_node = option(celery_command("worker", None), "-n")
    assert option(argv, "--destination") == default_node.replace("%h", CONTAINER_HOSTNAME)


def test_dockerignore_sends_only_what_the_build_copies(
    stages: list[list[tuple[str, str]]],
) -> None:
    lines = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
    patterns = [p.strip() for p in lines if p.strip() and not p.startswith("#")]
    sources = []
    for stage in stages:
        for keyword, rest in stage:
            if keyword == "COPY" and not rest.startswith("--from="):
                sources += shlex.split(rest)[:-1]
    assert sources
    for source in sources:
        path = REPO / source
        assert path.exists(), source
        sample = next(path.rglob("*.py")) if path.is_dir() else path
        assert not dockerignored(patterns, sample.relative_to(REPO).as_posix()), source
    for private in (
        ".git/config",
        ".venv/bin/python",
        ".env",
        "transcripts/c-1/t.json",
        "tests/test_cli.py",
        "worker/__pycache__/cli.cpython-311.pyc",
    ):
        assert dockerignored(patterns, private), private


# --- every command the files run exists ----------------------------------------------------


def commands_run(services: dict[str, dict[str, Any]], stages: Any) -> Iterator[list[str]]:
    """Every command line our image runs: compose commands and health checks, and the
    Dockerfile's CMD and HEALTHCHECK."""
    runtime = final_stage(stages)
    yield json.loads(only(runtime, "CMD"))
    yield shell_argv(only(runtime, "HEALTHCHECK").partition(" CMD ")[2].strip())
    for name in sorted(OUR_IMAGE_SERVICES):
        yield command_argv(services[name]["command"])
        yield healthcheck_argv(services[name]["healthcheck"]["test"])


def test_every_command_exists(services: dict[str, dict[str, Any]], stages: Any) -> None:
    """``compactor`` lines must parse with the real parser (unknown options fail) and run with
    --help; ``celery -A worker`` lines must run with --help, which imports our Celery app and
    rejects unknown options; ``python -c`` code must compile. All subprocesses run at once."""
    probes: dict[tuple[str, ...], list[str]] = {}
    inspect_actions: set[str] = set()
    for argv in commands_run(services, stages):
        program = argv[0]
        if program == "compactor":
            try:
                build_parser().parse_args(argv[1:])
            except SystemExit:
                pytest.fail(f"the compactor parser rejects {argv}")
            probes[tuple(argv)] = [sys.executable, "-m", "worker", *argv[1:], "--help"]
        elif argv[:3] == ["celery", "-A", "worker"]:
            probes[tuple(argv)] = [sys.executable, "-m", "celery", *argv[1:], "--help"]
            if argv[3] == "inspect":
                inspect_actions.add(argv[4])
        elif argv[:2] == ["python", "-c"]:
            compile(argv[2], "<healthcheck>", "exec")
        else:
            pytest.fail(f"a command our image does not provide: {argv}")
    if inspect_actions:
        listing = [sys.executable, "-m", "celery", "-A", "worker", "inspect", "--list"]
        probes[("celery", "inspect", "--list")] = listing

    running = {
        key: subprocess.Popen(
            cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for key, cmd in probes.items()
    }
    failures = []
    outputs = {}
    for key, process in running.items():
        stdout, stderr = process.communicate(timeout=60)
        outputs[key] = stdout
        if process.returncode != 0:
            failures.append(f"{' '.join(key)}: exit {process.returncode}\n{stderr[-2000:]}")
    assert not failures, "\n".join(failures)
    for action in inspect_actions:
        listed = re.findall(r"^\s{2}(\w+)", outputs[("celery", "inspect", "--list")], re.M)
        assert action in listed, f"celery inspect has no {action!r} command"


def test_a_starting_worker_collects_garbage_in_large_steps() -> None:
    """Set when the worker starts (Celery's worker_init), before any pool process forks."""
    import gc

    from celery.signals import worker_init

    from worker.celery_app import TUNES_GC, WORKER_GC_THRESHOLDS

    before = gc.get_threshold()
    assert before != WORKER_GC_THRESHOLDS
    try:
        worker_init.send(sender=None)
        assert gc.get_threshold() == (WORKER_GC_THRESHOLDS if TUNES_GC else before)
    finally:
        gc.set_threshold(*before)
