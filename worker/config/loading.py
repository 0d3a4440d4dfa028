"""Loading the settings: defaults -> TOML file -> environment, with a relative path in the
file taken relative to the file's directory.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from worker.config.environment import (
    STANDARD_OTEL_VARIABLES,
    env_overrides,
    standard_otel,
    value_origins,
    warn_unknown,
)
from worker.config.settings import Settings, none_word, settings_from_mapping
from worker.errors import ConfigError

DEFAULT_CONFIG_PATH = Path("config/compactor.toml")


def _deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def config_path(explicit: str | Path | None, environ: Mapping[str, str]) -> Path | None:
    """``--config``, else ``COMPACTOR_CONFIG``, else ``config/compactor.toml`` if it exists."""
    if explicit:
        return Path(explicit)
    if environ.get("COMPACTOR_CONFIG"):
        return Path(environ["COMPACTOR_CONFIG"])
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.is_file() else None


#: The settings that name a file or a directory, as (section, field). One of them given in a
#: config file as a relative path is relative to that file's directory, so that the file means
#: the same from any working directory (docs/configuration.md, "Sources"). ``[transcripts] url``
#: is a path only when it has no scheme (a bare path instead of ``file:///...``).
PATH_SETTINGS = (
    ("compaction", "transcript_dir"),
    ("llm", "prompt_file"),
    ("http", "api_keys_file"),
    ("transcripts", "url"),
)
#: The settings that are tables of paths (tenant -> file), as (section, field).
PATH_TABLE_SETTINGS = (("llm", "tenant_prompt_files"),)


def paths_relative_to(directory: Path, data: Mapping[str, Any]) -> dict[str, Any]:
    """A config file's tables with every relative path setting (:data:`PATH_SETTINGS`) made
    absolute against ``directory``, the file's directory as it was named: joined and normalized
    as text, symbolic links not followed, so ``../transcripts`` beside ``config/`` means the
    directory the reader sees there. Values that are no path (``"none"``, a URL, not a string)
    are left for validation to judge."""
    out = {
        name: dict(table) if isinstance(table, Mapping) else table for name, table in data.items()
    }
    for section, field in PATH_SETTINGS:
        table = out.get(section)
        if isinstance(table, dict) and field in table:
            table[field] = _anchored(table[field], directory)
    for section, field in PATH_TABLE_SETTINGS:
        table = out.get(section)
        if isinstance(table, dict) and isinstance(table.get(field), Mapping):
            table[field] = {key: _anchored(value, directory) for key, value in table[field].items()}
    return out


def _anchored(value: Any, directory: Path) -> Any:
    """``value`` joined to ``directory`` when it is a relative path, else as it is."""
    if (
        not isinstance(value, str)
        or not value.strip()
        or none_word(value) is None
        or "://" in value
        or os.path.isabs(value)
    ):
        return value
    return os.path.abspath(os.path.join(directory, value))


def load_settings(
    path: str | Path | None = None, *, environ: Mapping[str, str] | None = None
) -> Settings:
    """Resolve defaults -> TOML file -> environment. A relative path in the file is relative
    to the file's directory (:func:`paths_relative_to`); one in the environment, and the
    built-in ``transcripts``, to the working directory of the process that uses it."""
    env = os.environ if environ is None else environ
    file = config_path(path, env)
    data: dict[str, Any] = {}
    source = "defaults"
    if file is not None:
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(str(file), "config file not found") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(str(file), f"not valid TOML: {exc}") from None
        data = paths_relative_to(file.parent, data)
        source = str(file)
    overrides = env_overrides(env)
    if overrides:
        source += " + environment"
    merged = _deep_merge(data, overrides)
    standard = standard_otel(merged, env)
    settings = settings_from_mapping(_deep_merge(merged, standard), source=source)
    settings._origins = value_origins(data, str(file), env) | {
        f"otel.{field}": STANDARD_OTEL_VARIABLES[field] for field in standard.get("otel", {})
    }
    warn_unknown(env, settings)
    return settings
