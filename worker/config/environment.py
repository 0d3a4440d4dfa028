"""The environment's part in the configuration: the variable of every setting
(``COMPACTOR_<FIELD>`` for [compaction], ``COMPACTOR_<SECTION>_<FIELD>`` for the others) and
the values it gives, the ``COMPACTOR_*`` variables that are not settings, a warning for one
that nothing reads (with the closest known name), OpenTelemetry's standard variables, and
where each value came from.
"""

from __future__ import annotations

import difflib
import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from worker.config.settings import SECTIONS, Settings, none_word

# The name users configure for the configuration's warnings (as before the package was split).
log = logging.getLogger("worker.config")


def env_names() -> dict[str, tuple[str, str]]:
    """Every setting's environment variable -> (section, field): ``COMPACTOR_<FIELD>`` for
    [compaction], ``COMPACTOR_<SECTION>_<FIELD>`` for the others."""
    names: dict[str, tuple[str, str]] = {}
    for section, model in SECTIONS.items():
        prefix = "COMPACTOR_" if section == "compaction" else f"COMPACTOR_{section.upper()}_"
        for field in model.model_fields:
            names[prefix + field.upper()] = (section, field)
    return names


def env_overrides(environ: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The settings the environment gives, by section (:func:`env_names`)."""
    out: dict[str, dict[str, Any]] = {}
    for name, (section, field) in env_names().items():
        raw = environ.get(name)
        if raw is not None:
            out.setdefault(section, {})[field] = _env_value(raw)
    return out


#: ``COMPACTOR_*`` variables that are not settings, and who reads them: never warned about.
OTHER_VARIABLES = {
    "COMPACTOR_CONFIG": "the configuration file",
    "COMPACTOR_API_KEYS": "compactor serve's API keys",
    "COMPACTOR_LOG_LEVEL": "the log level of the commands",
    "COMPACTOR_DEBUG": "tracebacks from the commands",
    "COMPACTOR_CORPUS_DIR": "the corpus of the tests and benchmarks",
    "COMPACTOR_ARTIFACTS_DIR": "where the test suite's browser test writes its screenshots",
    "COMPACTOR_IMAGE": "docker-compose.yml",
    "COMPACTOR_EVALUATE_CONCURRENCY": "docker-compose.yml",
    "COMPACTOR_METRICS_PORT": "docker-compose.yml",
    "COMPACTOR_BASE": "the test suite's Node.js client",
    "COMPACTOR_KEY": "the test suite's Node.js client",
    "COMPACTOR_HOSTILE_TEST_KEY": "the test suite's (never set) LLM key",
    "COMPACTOR_URL": "compactor mcp: the service it talks to",
    "COMPACTOR_API_KEY": "compactor mcp: the tenant's API key",
    "COMPACTOR_CONVERSATION": "compactor mcp: the conversation its tools act on",
}
#: Prefixes of variables that are not settings either (the test suite's own).
OTHER_PREFIXES = ("COMPACTOR_TEST_",)
_warned: set[str] = set()


def unknown_variables(environ: Mapping[str, str], *, also_known: Iterable[str] = ()) -> list[str]:
    """The ``COMPACTOR_*`` variables in ``environ`` that nothing reads: no setting, none of
    :data:`OTHER_VARIABLES` (or ``also_known``), no :data:`OTHER_PREFIXES`."""
    known = env_names().keys() | OTHER_VARIABLES.keys() | set(also_known)
    return sorted(
        name
        for name in environ
        if name.startswith("COMPACTOR_")
        and name not in known
        and not name.startswith(OTHER_PREFIXES)
    )


def closest_variable(name: str) -> str | None:
    """The known variable ``name`` is most likely a misspelling of, if one is close."""
    known = [*env_names(), *OTHER_VARIABLES]
    found = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
    return found[0] if found else None


def warn_unknown(environ: Mapping[str, str], settings: Settings) -> None:
    """A warning, once per process, for each ``COMPACTOR_*`` variable that nothing reads (a
    misspelled setting is otherwise silently ignored). The variable named by
    ``llm.api_key_env`` may be a ``COMPACTOR_*`` one; its value is never shown, nor any other."""
    for name in unknown_variables(environ, also_known=[settings.llm.api_key_env]):
        if name in _warned:
            continue
        _warned.add(name)
        near = closest_variable(name)
        hint = f" (did you mean {near}?)" if near else ""
        log.warning("ignoring %s: no setting has this name%s", name, hint)


def _env_value(raw: str) -> Any:
    text = raw.strip()
    if text[:1] in "{[":
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return raw
    return raw


#: OpenTelemetry's own variables read when ``[otel]`` (file or ``COMPACTOR_OTEL_*``) leaves
#: the setting unset: every OpenTelemetry-instrumented program honours them.
STANDARD_OTEL_VARIABLES = {
    "endpoint": "OTEL_EXPORTER_OTLP_ENDPOINT",
    "service_name": "OTEL_SERVICE_NAME",
}


def standard_otel(merged: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """The ``[otel]`` settings OpenTelemetry's standard variables give, where ours are unset."""
    ours = merged.get("otel", {})
    ours = ours if isinstance(ours, Mapping) else {}
    found = {
        field: environ[name].strip()
        for field, name in STANDARD_OTEL_VARIABLES.items()
        if environ.get(name, "").strip() and none_word(ours.get(field)) is None
    }
    return {"otel": found} if found else {}


def value_origins(data: Mapping[str, Any], file: str, environ: Mapping[str, str]) -> dict[str, str]:
    """Dotted key -> where its value came from: the file, then the environment (which wins)."""
    found = {
        f"{section}.{field}": file
        for section, table in data.items()
        if isinstance(table, Mapping)
        for field in table
    }
    for name, (section, field) in env_names().items():
        if name in environ:
            found[f"{section}.{field}"] = name
    return found
