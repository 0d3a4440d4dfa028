"""The deployment files: ``docker-compose.yml``, ``Dockerfile``, ``.dockerignore``.

Docker does not run here, so these tests check the files' structure, and that every command
line they run exists in this package: each ``compactor`` line is parsed by the real argument
parser and run as ``python -m worker ... --help``; each ``celery -A worker`` line is run as
``python -m celery -A worker ... --help`` (which imports our Celery app); the Dockerfile's
tokenizer step is executed for real. None of it needs Redis.

The compose file is read with PyYAML (refusing duplicate keys and plain scalars that YAML 1.1
and Compose's YAML 1.2 read differently) and validated against the Compose Specification's
JSON Schema, which the check-jsonschema package ships (so the check needs no network); the
tests below add what the schema cannot know: this project's services, Redis durability,
loopback-only ports, queues, health checks, secrets and interpolation.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from worker.cli import build_parser
from worker.config import Settings, load_settings
from worker.runtime.celery_app import EVALUATE_QUEUE, MAINTENANCE_QUEUE, QUEUES, SUMMARIZE_QUEUE
from worker.runtime.supervisor import celery_command

REPO = Path(__file__).resolve().parent.parent.parent
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
LOCK = REPO / "requirements.lock"
README = REPO / "README.md"
PYPROJECT = REPO / "pyproject.toml"

OUR_IMAGE_SERVICES = {"evaluate", "summarize", "beat", "metrics"}
WORKER_SERVICES = {"evaluate", "summarize"}
TRANSCRIPT_DIR = "/data/transcripts"
REDIS_URL = "redis://redis:6379/0"
CONTAINER_HOSTNAME = "c0ffee123456"  # stands in for $HOSTNAME inside a container


# --- reading docker-compose.yml: PyYAML, strictly, and the Compose Specification's schema ---


class ComposeYamlError(ValueError):
    pass


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader (anchors, aliases, ``<<`` merges) with two refusals where PyYAML
    and Compose would read the same text differently: a duplicate key (PyYAML silently keeps
    the last; Compose rejects the file), and a plain scalar that YAML 1.1 (PyYAML) resolves to
    something other than what YAML 1.2 (Compose) reads, such as ``22:22`` (1342 in YAML 1.1),
    ``yes``, ``010`` or ``1.5``. Only decimal integers, ``true``/``false`` and ``null`` may be
    unquoted non-strings; quote anything else."""


_DECIMAL = re.compile(r"[-+]?(0|[1-9][0-9]*)")
_PLAIN_NON_STRINGS = {
    "tag:yaml.org,2002:merge": {"<<"},
    "tag:yaml.org,2002:bool": {"true", "True", "TRUE", "false", "False", "FALSE"},
    "tag:yaml.org,2002:null": {"", "~", "null", "Null", "NULL"},
}


def _construct_strict_mapping(
    loader: StrictLoader, node: yaml.MappingNode, deep: bool = False
) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # merged keys may be overridden: that is what a merge is for
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise ComposeYamlError(f"line {key_node.start_mark.line + 1}: duplicate key {key!r}")
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_strict_mapping,
)


def _check_plain_scalars(node: yaml.Node) -> None:
    if isinstance(node, yaml.ScalarNode):
        if node.style is not None or node.tag == "tag:yaml.org,2002:str":
            return
        if node.tag == "tag:yaml.org,2002:int" and _DECIMAL.fullmatch(node.value):
            return
        if node.value in _PLAIN_NON_STRINGS.get(node.tag, ()):
            return
        raise ComposeYamlError(
            f"line {node.start_mark.line + 1}: YAML 1.1 reads {node.value!r} as {node.tag}, "
            "Compose may not: quote it"
        )
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _check_plain_scalars(item)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            _check_plain_scalars(key)
            _check_plain_scalars(value)


def load_compose_yaml(text: str) -> Any:
    """The document as Compose reads it, or :class:`ComposeYamlError` (or a
    :class:`yaml.YAMLError` for text that is no YAML at all)."""
    node = yaml.compose(text, Loader=StrictLoader)
    if node is not None:
        _check_plain_scalars(node)
    return yaml.load(text, Loader=StrictLoader)


def compose_schema() -> dict[str, Any]:
    """The Compose Specification's JSON Schema (compose-spec/compose-spec,
    ``schema/compose-spec.json``, Apache-2.0), as vendored in the check-jsonschema package:
    available offline, and refreshed by each check-jsonschema release."""
    from check_jsonschema.builtin_schemas import get_builtin_schema

    schema = get_builtin_schema("vendor.compose-spec")
    assert schema.get("title") == "Compose Specification", schema.get("title")
    return schema


def schema_errors(validator: Any, document: Any) -> list[str]:
    """Every violation, as ``path: message``; empty when the document is valid."""
    return sorted(
        f"{'/'.join(map(str, error.absolute_path)) or '(top level)'}: {error.message}"
        for error in validator.iter_errors(document)
    )


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
    doc = load_compose_yaml(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module")
def compose_validator() -> Any:
    schema = compose_schema()
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema, format_checker=validator_class.FORMAT_CHECKER)


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


# --- reading the compose file -----------------------------------------------------------


def test_loader_reads_anchors_merges_and_quoted_scalars() -> None:
    text = """\
x-base: &base
  image: "img:1"     # trailing comment
  env:
    A: 'it''s'
    B: ${B:-}
svc:
  <<: *base
  image: other
  ports: ["127.0.0.1:22:22"]
  count: 3
  flag: true
  empty:
"""
    assert load_compose_yaml(text)["svc"] == {
        "image": "other",
        "env": {"A": "it's", "B": "${B:-}"},
        "ports": ["127.0.0.1:22:22"],
        "count": 3,
        "flag": True,
        "empty": None,
    }


@pytest.mark.parametrize(
    "text",
    [
        "a: 1\na: 2",  # PyYAML would keep 2; Compose rejects the file
        "s:\n  image: x\n  image: y",
        "a: yes",  # a YAML 1.1 boolean, a string in YAML 1.2
        "ports:\n  - 22:22",  # sexagesimal 1342 in YAML 1.1
        "a: 1.5",
        "a: 010",  # octal in YAML 1.1
        "a: 0x1f",
        "a: 1_000",
        "a: 2026-01-01",
    ],
)
def test_loader_rejects_what_pyyaml_and_compose_read_differently(text: str) -> None:
    with pytest.raises(ComposeYamlError):
        load_compose_yaml(text)


def test_compose_file_follows_the_compose_specification(
    compose: dict[str, Any], services: dict[str, dict[str, Any]], compose_validator: Any
) -> None:
    """As written (Compose validates the merged document) and with the defaults filled in."""
    assert schema_errors(compose_validator, compose) == []
    assert schema_errors(compose_validator, {**compose, "services": services}) == []


VALID_SERVICE = "services:\n  web:\n    image: nginx:1\n"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (VALID_SERVICE + "    comand: nginx -g daemon\n", "services/web"),  # a typo
        (VALID_SERVICE + "    ports: 8080\n", "services/web/ports"),
        (
            VALID_SERVICE + "    ports:\n      - {target: 80, publish: 8080}\n",
            "services/web/ports/0",
        ),
        (VALID_SERVICE + "    healthcheck:\n      test: 1\n", "services/web/healthcheck/test"),
        (
            VALID_SERVICE + "    restart: unless-stopped\n    deploy:\n      replicas: [1]\n",
            "services/web/deploy/replicas",
        ),
        (
            VALID_SERVICE + "    depends_on:\n      db:\n        condition: healthy\n",
            "services/web/depends_on",
        ),
        (VALID_SERVICE + "volumes: [data]\n", "volumes"),
        (VALID_SERVICE + "service: {}\n", "(top level)"),
        ("services: []\n", "services"),
    ],
)
def test_the_schema_check_rejects_an_invalid_compose_file(
    text: str, where: str, compose_validator: Any
) -> None:
    assert schema_errors(compose_validator, load_compose_yaml(VALID_SERVICE)) == []
    errors = schema_errors(compose_validator, load_compose_yaml(text))
    assert errors, text
    assert any(error.startswith(f"{where}: ") for error in errors), errors


def test_the_schema_check_rejects_a_broken_copy_of_our_compose_file(
    compose: dict[str, Any], compose_validator: Any
) -> None:
    broken = json.loads(json.dumps(compose))  # a deep copy that shares no merged mapping
    broken["services"]["evaluate"]["stop_grace_period"] = {"seconds": 130}
    broken["services"]["redis"]["healthcheck"]["retries"] = [30]
    broken["volumes"]["transcripts"] = {"drvier": "local"}
    errors = schema_errors(compose_validator, broken)
    for where in (
        "services/evaluate/stop_grace_period",
        "services/redis/healthcheck/retries",
        "volumes/transcripts",
    ):
        assert any(error.startswith(f"{where}: ") for error in errors), (where, errors)


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


def test_published_ports_are_loopback_only(services: dict[str, dict[str, Any]]) -> None:
    """No service has authentication on its published port (Redis, metrics, Flower), so each
    binds the host's loopback address only."""
    published = {name: service["ports"] for name, service in services.items() if "ports" in service}
    assert set(published) == {"redis", "metrics", "flower"}
    for name, ports in published.items():
        for port in ports:
            assert isinstance(port, str), f"{name}: use the short form HOST_IP:HOST:CONTAINER"
            host_ip, _, rest = port.partition(":")
            assert host_ip == "127.0.0.1" and rest.count(":") == 1, f"{name}: {port!r}"
    for name, service in services.items():
        assert service.get("network_mode") != "host", name


def published(service: dict[str, Any], container_port: str) -> tuple[str, str]:
    """(host address, host port) that ``container_port`` is published on."""
    found = [p.rsplit(":", 2) for p in service["ports"] if p.endswith(f":{container_port}")]
    assert len(found) == 1, f"{container_port} is published {len(found)} times"
    host_ip, host_port, _ = found[0]
    return host_ip, host_port


def test_readme_ports_are_the_compose_files(services: dict[str, dict[str, Any]]) -> None:
    """README's Deployment section says where Prometheus and Flower listen on the host; the
    compose file serves, publishes and health-checks exactly there (with no host variables
    set), and the Dockerfile exposes nothing else."""
    readme = README.read_text(encoding="utf-8")
    (metrics_at,) = re.findall(r"Prometheus metrics on\s+(127\.0\.0\.1:\d+)", readme)
    (flower_at,) = re.findall(r"Flower on\s+(127\.0\.0\.1:\d+)", readme)

    metrics = services["metrics"]
    port = option(command_argv(metrics["command"]), "--serve")
    assert ":".join(published(metrics, port)) == metrics_at
    check = healthcheck_argv(metrics["healthcheck"]["test"])
    assert f"'http://127.0.0.1:{port}/metrics'" in check[-1]

    flower = services["flower"]
    flower_port = option(command_argv(flower["command"]), "--port")
    assert ":".join(published(flower, flower_port)) == flower_at
    assert f"127.0.0.1:{flower_port}/" in healthcheck_argv(flower["healthcheck"]["test"])[-1]

    exposed = [
        rest
        for stage in dockerfile_stages(DOCKERFILE.read_text(encoding="utf-8"))
        for keyword, rest in stage
        if keyword == "EXPOSE"
    ]
    assert all(p.split("/")[0] == port for e in exposed for p in e.split()), exposed


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


def test_dockerfile_bakes_both_tokenizers(
    stages: list[list[tuple[str, str]]], tmp_path: Path, subprocesses: None
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
    # The default CMD's node name is compactor@%h (see worker.runtime.supervisor.celery_command).
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
        "tests/integration/test_cli.py",
        "worker/__pycache__/cli.cpython-311.pyc",
        "worker/core/identifiers.cpython-311-x86_64-linux-gnu.so",
    ):
        assert dockerignored(patterns, private), private


# --- requirements.lock ---------------------------------------------------------------------


def locked_pins(text: str) -> dict[str, list[tuple[Requirement, list[str]]]]:
    """requirements.lock as {canonical name: [(requirement, hashes)]}: one entry per line
    (a universal lock may pin a package once per environment marker)."""
    pins: dict[str, list[tuple[Requirement, list[str]]]] = {}
    for entry in re.sub(r"\\\n", " ", text).splitlines():
        entry = entry.split(" #", 1)[0].strip()
        if not entry or entry.startswith("#"):
            continue
        assert not entry.startswith("-"), f"options belong on the command line: {entry!r}"
        requirement_text, *hashes = re.split(r"\s+--hash=", entry)
        requirement = Requirement(requirement_text)
        pins.setdefault(canonicalize_name(requirement.name), []).append((requirement, hashes))
    return pins


def pinned_version(requirement: Requirement) -> Version:
    (spec,) = requirement.specifier
    assert spec.operator == "==" and "*" not in spec.version, f"not an exact pin: {requirement}"
    return Version(spec.version)


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def lock() -> dict[str, list[tuple[Requirement, list[str]]]]:
    return locked_pins(LOCK.read_text(encoding="utf-8"))


def test_lock_pins_every_runtime_dependency_inside_pyprojects_range(
    pyproject: dict[str, Any], lock: dict[str, list[tuple[Requirement, list[str]]]]
) -> None:
    """pyproject.toml keeps compatible ranges; the lock picks one version of each, inside the
    range, with the sha256 of its files. The Dockerfile builds the package with the locked
    setuptools (--no-build-isolation), so the build requirements must be locked too."""
    for entry in lock.values():
        for requirement, hashes in entry:
            pinned_version(requirement)
            assert hashes and all(h.startswith("sha256:") for h in hashes), requirement.name
    required = [Requirement(r) for r in pyproject["project"]["dependencies"]]
    required += [Requirement(r) for r in pyproject["build-system"]["requires"]]
    extras = pyproject["project"]["optional-dependencies"]
    required += [Requirement(r) for extra in image_extras() for r in extras[extra]]
    assert required
    for wanted in required:
        entries = lock.get(canonicalize_name(wanted.name))
        assert entries, f"{wanted.name} is not in requirements.lock: run `make lock`"
        for requirement, _ in entries:
            version = pinned_version(requirement)
            assert wanted.specifier.contains(version, prereleases=True), (
                f"{wanted.name}=={version} is outside pyproject's {wanted.specifier}: "
                "run `make lock`"
            )
    for tool in ("pytest", "hypothesis", "ruff", "mypy", "check-jsonschema"):
        assert tool not in lock, "the lock is for production: no [dev] extras"
    assert canonicalize_name(pyproject["project"]["name"]) not in lock


def image_extras() -> list[str]:
    """The extras the Makefile locks for the image (``IMAGE_EXTRAS``)."""
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    match = re.search(r"^IMAGE_EXTRAS := (.+)$", makefile, re.M)
    assert match, "the Makefile names the image's extras (IMAGE_EXTRAS)"
    return match.group(1).split()


def test_the_image_holds_the_server_and_every_shared_store() -> None:
    """Across hosts a deployment needs `compactor serve` and the S3 or PostgreSQL store: the
    image's lock holds them (the agent-framework adapters belong to the agent)."""
    assert set(image_extras()) == {"http", "s3", "postgres"}


def test_locked_pins_are_checked_against_the_range() -> None:
    """The check above fails on a pin outside pyproject's range, and on a loose pin."""
    ((requirement, _),) = locked_pins("redis==4.6.0 \\\n    --hash=sha256:00\n")["redis"]
    assert not Requirement("redis>=5.0,<9").specifier.contains(pinned_version(requirement))
    with pytest.raises(AssertionError):
        pinned_version(Requirement("redis>=5.0"))


def test_dockerfile_installs_from_the_lock_file(stages: list[list[tuple[str, str]]]) -> None:
    (build,) = [stage for stage in stages if " AS build" in stage[0][1]]
    runs = [(i, rest) for i, (k, rest) in enumerate(build) if k == "RUN" and "pip install" in rest]
    assert [rest for _, rest in runs] == [
        f"pip install --require-hashes -r {LOCK.name}",
        "pip install --no-deps --no-build-isolation .",
    ]
    copies = {shlex.split(rest)[0]: i for i, (k, rest) in enumerate(build) if k == "COPY"}
    (locked_at, _), (package_at, _) = runs
    assert copies[LOCK.name] < locked_at < copies["worker"] < package_at, (
        "the dependencies' layer must not depend on the code"
    )
    runs_all = " ".join(rest for stage in stages for k, rest in stage if k == "RUN")
    assert "[dev]" not in runs_all and "requirements-dev" not in runs_all


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


def test_every_command_exists(
    services: dict[str, dict[str, Any]], stages: Any, subprocesses: None
) -> None:
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

    from worker.runtime.celery_app import TUNES_GC, WORKER_GC_THRESHOLDS

    before = gc.get_threshold()
    assert before != WORKER_GC_THRESHOLDS
    try:
        worker_init.send(sender=None)
        assert gc.get_threshold() == (WORKER_GC_THRESHOLDS if TUNES_GC else before)
    finally:
        gc.set_threshold(*before)
