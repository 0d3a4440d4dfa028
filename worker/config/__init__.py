"""Configuration: the compaction settings and the service settings around them.

Every setting, its default and its meaning: docs/configuration.md.

Sources, later wins: built-in defaults -> TOML file -> environment (``COMPACTOR_...``) -> a
snapshot's own ``config`` / ``tools`` overrides. Secrets never live in these objects: the LLM key
is read from the environment variable named by ``llm.api_key_env`` at call time, and the Redis
URL is masked whenever it is shown.

One module per job, every name importable from here: :mod:`~worker.config.settings` (the
models, validation, showing), :mod:`~worker.config.environment` (the variables),
:mod:`~worker.config.loading` (defaults -> file -> environment).
"""

from __future__ import annotations

from worker.config.environment import (
    OTHER_PREFIXES,
    OTHER_VARIABLES,
    STANDARD_OTEL_VARIABLES,
    closest_variable,
    env_names,
    env_overrides,
    unknown_variables,
)
from worker.config.loading import (
    DEFAULT_CONFIG_PATH,
    PATH_SETTINGS,
    PATH_TABLE_SETTINGS,
    config_path,
    load_settings,
    paths_relative_to,
)
from worker.config.settings import (
    BROKER_SCHEMES,
    MAX_CONTEXT_WINDOW,
    MIN_CONTEXT_WINDOW,
    MIN_DERIVED_SUMMARY_TOKENS,
    OTEL_SCHEMES,
    REDIS_SCHEMES,
    AutoCompactTrigger,
    BrokerConfig,
    CompactionConfig,
    CompactionMode,
    CompactionPolicy,
    ContextWindowTokens,
    CostConfig,
    HttpConfig,
    LLMConfig,
    ModelName,
    ModelPrices,
    OtelConfig,
    ProjectedToolResultBudget,
    ProxyConfig,
    RedisConfig,
    Reduction,
    Settings,
    ToolConfig,
    ToolHint,
    TranscriptRetention,
    WebhooksConfig,
    WorkerConfig,
    configured_broker_url,
    duration_seconds,
    mask_url,
    redis_url,
    settings_from_mapping,
    shown_settings,
    with_broker_url,
    with_redis_url,
)

__all__ = [
    "BROKER_SCHEMES",
    "DEFAULT_CONFIG_PATH",
    "MAX_CONTEXT_WINDOW",
    "MIN_CONTEXT_WINDOW",
    "MIN_DERIVED_SUMMARY_TOKENS",
    "OTEL_SCHEMES",
    "OTHER_PREFIXES",
    "OTHER_VARIABLES",
    "PATH_SETTINGS",
    "PATH_TABLE_SETTINGS",
    "REDIS_SCHEMES",
    "STANDARD_OTEL_VARIABLES",
    "AutoCompactTrigger",
    "BrokerConfig",
    "CompactionConfig",
    "CompactionMode",
    "CompactionPolicy",
    "ContextWindowTokens",
    "CostConfig",
    "HttpConfig",
    "LLMConfig",
    "ModelName",
    "ModelPrices",
    "OtelConfig",
    "ProjectedToolResultBudget",
    "ProxyConfig",
    "RedisConfig",
    "Reduction",
    "Settings",
    "ToolConfig",
    "ToolHint",
    "TranscriptRetention",
    "WebhooksConfig",
    "WorkerConfig",
    "closest_variable",
    "config_path",
    "configured_broker_url",
    "duration_seconds",
    "env_names",
    "env_overrides",
    "load_settings",
    "mask_url",
    "paths_relative_to",
    "redis_url",
    "settings_from_mapping",
    "shown_settings",
    "unknown_variables",
    "with_broker_url",
    "with_redis_url",
]
