"""The settings themselves: one pydantic model per section of the TOML file, every field's
default and bounds, validation of a TOML-shaped mapping (:func:`settings_from_mapping`) with
errors naming the dotted key, and how the settings are shown (secrets masked) or pointed
elsewhere. Every setting, its default and its meaning: docs/configuration.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    StrictInt,
    StringConstraints,
    ValidationError,
    field_validator,
)

from worker.errors import ConfigError

AutoCompactTrigger = Literal["off", "window_share_only", "thresholds"]
CompactionMode = Literal["local_only", "prefer_remote", "remote_only"]
CompactionPolicy = Literal["threshold", "cost"]
ToolHint = Literal["keep", "strip", "strip-requests", "strip-responses", "omit"]
# How the compacted range is reduced (docs/configuration.md, "Reduction"): summarized, or cut
# down by a non-LLM strategy (worker.core.strategies) or by observation masking.
Reduction = Literal[
    "summary", "truncation", "sliding_window", "token_budget", "selective_tool_result", "masking"
]

M = TypeVar("M", bound=BaseModel)
# Optional numbers in TOML/env have no null; this spelling means None ("unlimited"/"off").
_NONE_WORDS = {"none", "null", "unlimited"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


def none_word(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lower() in _NONE_WORDS:
        return None
    return value


class ProjectedToolResultBudget(_Strict):
    """A strict aggregate cap on projected tool-result bodies (bytes of UTF-8)."""

    max_bytes: int = Field(ge=0)
    prioritize_recent_results: int = Field(default=2, ge=0)
    max_preview_bytes: int = Field(default=2048, ge=0)


class CompactionConfig(_Strict):
    """``[compaction]``: the core settings, then our extensions (marked below)."""

    keep_recent_tool_results: int | None = Field(default=None, ge=0)
    projected_tool_result_budget: ProjectedToolResultBudget | None = None
    auto_compact_trigger: AutoCompactTrigger = "thresholds"
    auto_compact_threshold_tokens: int | None = Field(default=50_000, ge=0)
    auto_compact_threshold_percent: int | None = Field(default=75, ge=0, le=255)
    transcript_dir: Path = Path("transcripts")
    summary_max_input_chars: int = Field(default=80_000, ge=1_000)
    summary_max_output_tokens: int = Field(default=2_000, ge=16)
    mode: CompactionMode = "local_only"
    preserve_recent_user_tokens: int = Field(default=20_000, ge=0)
    preserve_recent_delegation_results: int = Field(default=8, ge=0)
    max_persisted_transcripts: int | None = Field(default=10, ge=1)
    # --- extensions ---
    # When a compaction pays (docs/configuration.md, "When a compaction pays"): it is made only
    # when it can shrink the request by at least min_gain_percent of its tokens, and published
    # only when it did; it aims at auto_compact_target_percent of the threshold, so that the
    # turns after it have room before the next one.
    min_gain_percent: int = Field(default=10, ge=0, le=100)
    auto_compact_target_percent: int = Field(default=70, ge=1, le=100)
    delegation_tools: list[str] = Field(default_factory=lambda: ["delegate_task", "task", "agent"])
    min_summary_fidelity: float = Field(default=0.5, ge=0.0, le=1.0)
    compress_tool_results: bool = True
    compress_min_tokens: int = Field(default=200, ge=0)
    compress_min_saving: float = Field(default=0.15, ge=0.0, lt=1.0)
    token_counting: Literal["exact", "estimate"] = "exact"
    image_default_width: int = Field(default=1024, ge=1)
    image_default_height: int = Field(default=1024, ge=1)
    file_part_tokens: int = Field(default=1500, ge=0)
    max_snapshot_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    max_messages: int = Field(default=50_000, ge=1)
    # How the decision is made (docs/cost.md): "threshold" compacts over the threshold;
    # "cost" compacts when the expected saving pays for the cache write and the summary call.
    policy: CompactionPolicy = "threshold"
    # Never rewrite a warm cached prefix for an expected net gain under this (US dollars).
    cost_min_gain_usd: float = Field(default=0.01, ge=0.0)
    # How many later turns a compaction's saving is counted over, at most.
    cost_horizon_turns: int = Field(default=20, ge=1)
    # "cost" compacts no earlier than this share of the threshold, and defers no later than
    # this share of the context window (or, with no window known, 1.25 x the threshold).
    cost_floor_percent: int = Field(default=50, ge=1, le=100)
    cost_ceiling_percent: int = Field(default=90, ge=1, le=100)
    # Idle-timed compaction (off: None): a conversation with no snapshot for this long and
    # over idle_threshold_tokens is compacted by the scheduler.
    idle_compact_after_s: float | None = Field(default=None, gt=0)
    idle_threshold_tokens: int = Field(default=20_000, ge=0)
    # Review before apply: hold every compaction as ``compaction.proposed`` until it is
    # approved (docs/events.md). A snapshot may turn it on, never off; ``review_tenants``
    # (operator only) holds those of the named tenants' conversations.
    review: bool = False
    review_tenants: list[str] = Field(default_factory=list)
    # How the range is reduced: "summary" (the LLM or digest) or a strategy, each with its knob.
    reduction: Reduction = "summary"
    reduction_max_messages: int = Field(default=40, ge=1)  # truncation
    reduction_window: int = Field(default=40, ge=1)  # sliding_window
    # token_budget; None: half the trigger threshold (docs/configuration.md, "Reduction").
    reduction_max_tokens: int | None = Field(default=None, ge=1)
    reduction_keep_tool_results: int = Field(default=3, ge=0)  # selective_tool_result, masking

    def reviews(self, conversation_id: str) -> bool:
        """Whether compactions of ``conversation_id`` (an internal id, ``tenant:conv`` under
        ``compactor serve``) are held for review."""
        tenant, colon, _rest = conversation_id.partition(":")
        return self.review or (bool(colon) and tenant in self.review_tenants)

    _none_ok = field_validator(
        "idle_compact_after_s",
        "keep_recent_tool_results",
        "projected_tool_result_budget",
        "auto_compact_threshold_tokens",
        "auto_compact_threshold_percent",
        "max_persisted_transcripts",
        "reduction_max_tokens",
        mode="before",
    )(none_word)

    def auto_compact_threshold(self, context_window: int | None) -> int | None:
        """The token count at which a run compacts; None means it does not auto-compact."""
        percent = self.auto_compact_threshold_percent
        if self.auto_compact_trigger == "off":
            return None
        if self.auto_compact_trigger == "window_share_only":
            if context_window is None or percent is None:
                return None
            return _share(context_window, percent)
        if self.auto_compact_threshold_tokens is None:
            return None
        if context_window is not None and percent is not None:
            return _share(context_window, percent)
        return self.auto_compact_threshold_tokens

    def target_tokens(self, threshold: int | None) -> int | None:
        """The size a compaction aims at: ``auto_compact_target_percent`` of the threshold."""
        if threshold is None:
            return None
        return threshold * self.auto_compact_target_percent // 100

    def summary_output_bound(self, threshold: int | None) -> int:
        """The least bound a summary gets, in tokens: ``summary_max_output_tokens`` when it was
        set (in the file, the environment or the snapshot), else a quarter of the target,
        between :data:`MIN_DERIVED_SUMMARY_TOKENS` and the default. A compaction gives an unset
        bound whatever room the target leaves beside what it carries, up to the default
        (worker.pipeline.prepare): a small window gets a summary that leaves it room, so
        that it cannot compact on every turn."""
        target = self.target_tokens(threshold)
        if "summary_max_output_tokens" in self.model_fields_set or target is None:
            return self.summary_max_output_tokens
        derived = max(target // 4, MIN_DERIVED_SUMMARY_TOKENS)
        return min(derived, self.summary_max_output_tokens)

    def min_gain_tokens(self, tokens_before: int) -> int:
        """The fewest tokens a compaction of a ``tokens_before`` request must save."""
        return max(-(-tokens_before * self.min_gain_percent // 100), 1)

    def auto_compact_enabled(self) -> bool:
        """Whether auto-compaction can fire at all, for some context window."""
        if self.auto_compact_trigger == "off":
            return False
        if self.auto_compact_trigger == "window_share_only":
            return self.auto_compact_threshold_percent is not None
        return self.auto_compact_threshold_tokens is not None


# The least a derived summary bound is (CompactionConfig.summary_output_bound): below it a
# summary cannot say what the task is and where it stands.
MIN_DERIVED_SUMMARY_TOKENS = 128


def _share(context_window: int, percent: int) -> int:
    return context_window * min(percent, 100) // 100


def duration_seconds(text: str) -> int:
    """``"5m"`` -> 300, ``"1h"`` -> 3600, ``"30s"`` -> 30."""
    units = {"s": 1, "m": 60, "h": 3600}
    if len(text) < 2 or text[-1] not in units or not text[:-1].isdigit():
        raise ValueError(f"{text!r} is not a duration such as 30s, 5m or 1h")
    return int(text[:-1]) * units[text[-1]]


class ModelPrices(_Strict):
    """One model's list prices in US dollars per million tokens (``[cost.models."NAME"]``):
    input, cached input read, output, and cache write by cache TTL (``{"5m" = 3.75, "1h" =
    6.0}``; empty: a write costs ``input``, as on OpenAI and Google's implicit caching).
    ``cache_ttl``: how long the provider keeps a prefix cached (and which write price applies);
    ``min_cacheable_tokens``: the shortest prefix it caches. ``source``: where the figures
    come from."""

    input: float = Field(ge=0)
    cached_input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_write: dict[str, float] = Field(default_factory=dict)
    cache_ttl: str = "5m"
    min_cacheable_tokens: int = Field(default=1024, ge=0)
    source: str = ""

    @field_validator("cache_ttl")
    @classmethod
    def _ttl(cls, value: str) -> str:
        duration_seconds(value)
        return value

    @field_validator("cache_write")
    @classmethod
    def _writes(cls, value: dict[str, float]) -> dict[str, float]:
        for ttl, price in value.items():
            duration_seconds(ttl)
            if price < 0:
                raise ValueError(f"cache_write.{ttl} must be >= 0")
        return value

    @property
    def cache_ttl_s(self) -> int:
        return duration_seconds(self.cache_ttl)

    @property
    def cache_write_price(self) -> float:
        """Per million tokens written to the cache at ``cache_ttl``."""
        return self.cache_write.get(self.cache_ttl, self.input)


class CostConfig(_Strict):
    """``[cost]``: prices for the cost model (docs/cost.md). ``models`` add to or replace the
    built-in table by model name (a snapshot's model matches the longest name it starts with);
    ``builtin_prices = false`` uses only them."""

    models: dict[str, ModelPrices] = Field(default_factory=dict)
    builtin_prices: bool = True


class ToolConfig(_Strict):
    """``[conversation.tools.NAME]``: the per-tool compaction hint (unset inherits)."""

    compaction: ToolHint | None = None


class LLMConfig(_Strict):
    """``[llm]``: the summarizing model. The key is read from ``api_key_env`` at call time."""

    provider: Literal["openai", "anthropic"] = "openai"
    base_url: str = "https://api.openai.com/v1"
    model: str = "gpt-4.1-mini"
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = Field(default=60.0, gt=0)
    connect_timeout_s: float = Field(default=5.0, gt=0)
    deadline_s: float = Field(default=180.0, gt=0)
    max_retries: int = Field(default=4, ge=0)
    backoff_base_s: float = Field(default=0.5, ge=0)
    backoff_max_s: float = Field(default=20.0, ge=0)
    headers: dict[str, str] = Field(default_factory=dict, repr=False)  # may carry credentials
    temperature: float | None = Field(default=0.0, ge=0, le=2)  # None: omitted from requests
    extra_instruction: str = ""
    # The summary prompt's template (docs/summaries.md, "The prompt"): a UTF-8 text file that
    # replaces our default opening; our sections, rules and bounds are always appended. Per
    # tenant (the conversations of ``compactor serve``'s tenants): tenant name -> file.
    prompt_file: Path | None = None
    tenant_prompt_files: dict[str, Path] = Field(default_factory=dict)
    max_concurrency: int = Field(default=256, ge=1)
    circuit_failure_threshold: int = Field(default=5, ge=1)
    circuit_reset_s: float = Field(default=30.0, gt=0)
    anthropic_version: str = "2023-06-01"
    # OpenAI-compatible only: which body field carries the output bound. ``max_tokens`` is what
    # every compatible server (vLLM, Ollama, llama.cpp, LiteLLM) understands; OpenAI's reasoning
    # models (o-series, gpt-5) accept only ``max_completion_tokens``.
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    # Tried in order, each with its own deadline and breaker, when ``model`` fails (same
    # provider, URL and key); the digest comes after the last (per ``mode``).
    fallback_models: list[str] = Field(default_factory=list, max_length=8)

    _none_ok = field_validator("prompt_file", mode="before")(none_word)


# What a [redis] url may start with: one Redis (redis-py's forms), a Redis Cluster, or the
# master a Sentinel names (worker/backend/redis_target.py).
REDIS_SCHEMES = (
    "redis",
    "rediss",
    "unix",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
)


def _url_with_scheme(
    url: SecretStr | None, schemes: tuple[str, ...], what: str
) -> SecretStr | None:
    """The URL when its scheme is one of ``schemes``; a ValueError naming only the scheme (the
    rest of the URL may hold a password) otherwise."""
    if url is None:
        return url
    text = url.get_secret_value()
    scheme = text.partition("://")[0].lower() if "://" in text else ""
    if scheme not in schemes:
        found = f"unsupported {what} scheme {scheme!r}" if scheme else f"unsupported {what} URL"
        raise ValueError(f"{found}: use one of " + ", ".join(f"{s}://" for s in schemes))
    return url


class RedisConfig(_Strict):
    """``[redis]``. ``url`` may carry a password; it is masked whenever shown."""

    url: SecretStr | None = None
    stream_maxlen: int = Field(default=1000, ge=10)
    stream_ttl_s: int = Field(default=7 * 24 * 3600, ge=60)
    snapshot_ttl_s: int = Field(default=24 * 3600, ge=60)
    # Unacknowledged tasks are redelivered after this; it must outlast the longest compaction.
    visibility_timeout_s: int = Field(default=900, ge=5)
    lock_lease_s: float = Field(default=30.0, ge=1.0)

    _none_ok = field_validator("url", mode="before")(none_word)

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: SecretStr | None) -> SecretStr | None:
        return _url_with_scheme(url, REDIS_SCHEMES, "Redis")


BROKER_SCHEMES = ("redis", "rediss", "amqp", "amqps")


class BrokerConfig(_Strict):
    """``[broker]``: where Celery's task messages travel. Unset, they go through the Redis of
    ``[redis] url`` (one server for everything); ``amqp://`` / ``amqps://`` selects RabbitMQ,
    while the state (claim checks, locks, events, memos) stays in Redis. ``url`` may carry a
    password; it is masked whenever shown."""

    url: SecretStr | None = None
    # RabbitMQ closes a channel whose delivery stays unacknowledged longer than its
    # consumer_timeout (rabbitmq.conf; 30 min by default), and the task runs twice: say what
    # the server's is, and start-up checks that the longest task fits in it.
    consumer_timeout_s: int = Field(default=1800, ge=60)

    _none_ok = field_validator("url", mode="before")(none_word)

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: SecretStr | None) -> SecretStr | None:
        return _url_with_scheme(url, BROKER_SCHEMES, "broker")


class TranscriptRetention(_Strict):
    """``[transcripts]``: the store (``url``; none: files under ``compaction.transcript_dir``)
    and retention beyond ``max_persisted_transcripts``. ``url`` may carry a password; it is
    masked whenever shown. ``redact``: secrets redacted from what is stored (as from what is
    summarized)."""

    url: SecretStr | None = None
    max_age_days: float | None = Field(default=None, gt=0)
    max_total_bytes: int | None = Field(default=None, ge=0)
    # Transcripts keep the verbatim history unless this asks to redact secrets from them too.
    redact: bool = False

    _none_ok = field_validator("url", "max_age_days", "max_total_bytes", mode="before")(none_word)


class WorkerConfig(_Strict):
    """``[worker]``: task limits and schedules."""

    evaluate_time_limit_s: float = Field(default=120.0, gt=0)
    summarize_time_limit_s: float = Field(default=600.0, gt=0)
    max_retries: int = Field(default=8, ge=0)
    prune_interval_s: float = Field(default=3600.0, gt=0)
    # The reconciler (scheduled by beat every reconcile_interval_s) re-queues a conversation
    # pending for reconcile_after_s unless its lock lease is alive: a worker killed mid-summary
    # is recovered at the first run after its lease (redis.lock_lease_s) lapsed.
    reconcile_interval_s: float = Field(default=15.0, gt=0)
    reconcile_after_s: float = Field(default=45.0, gt=0)  # pending this long -> re-queued
    # How often the scheduler looks for idle conversations ([compaction] idle_compact_after_s).
    idle_scan_interval_s: float = Field(default=30.0, gt=0)
    log_format: Literal["json", "text"] = "json"
    # Per process: the last parsed snapshot of recent conversations, so a grown conversation's
    # next snapshot reuses the messages it shares with the last one. Counted by payload size;
    # the parsed objects and counted projections take about 4-7 times that in memory.
    conversation_cache_mb: float = Field(default=32.0, ge=0)


class HttpConfig(_Strict):
    """``[http]``: ``compactor serve``. API keys never live here: they come from the
    environment (``COMPACTOR_API_KEYS``) or the file named by ``api_keys_file``."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    api_keys_file: Path | None = None
    # Serve /v1 with no API keys, every request as one fixed tenant (``compactor serve
    # --no-auth``). Off: serving with no keys configured is refused at start.
    allow_unauthenticated: bool = False
    # None: the snapshot limit (compaction.max_snapshot_bytes).
    max_body_bytes: int | None = Field(default=None, ge=1024)
    header_timeout_s: float = Field(default=10.0, gt=0)  # the request line and headers
    body_timeout_s: float = Field(default=30.0, gt=0)  # a request body must arrive within this
    keep_alive_timeout_s: float = Field(default=5.0, gt=0)
    sse_keepalive_s: float = Field(default=15.0, gt=0)
    # Each live SSE follower holds one connection of the process's asyncio Redis pool while it
    # waits (XREAD BLOCK); the pool's size bounds the followers one process serves.
    redis_max_connections: int = Field(default=2000, ge=10)
    ready_cache_s: float = Field(default=5.0, ge=0)
    ready_timeout_s: float = Field(default=1.0, gt=0)

    _none_ok = field_validator("api_keys_file", "max_body_bytes", mode="before")(none_word)


# A model's context window as the proxy reads it (a request header, [proxy.context_windows]):
# fewer tokens than this is a mistake (a window given in thousands, 200 meant as 200,000, would
# compact every turn), more is larger than any model's.
MIN_CONTEXT_WINDOW = 1_024
MAX_CONTEXT_WINDOW = 100_000_000
ContextWindowTokens = Annotated[StrictInt, Field(ge=MIN_CONTEXT_WINDOW, le=MAX_CONTEXT_WINDOW)]
# A model name of [proxy.context_windows]: what providers' model ids are made of
# ("claude-sonnet-4-5@20250929", "llama3.1:8b", "Qwen/Qwen2.5-7B-Instruct"), so that the proxy
# can report the name it matched in a header as it is.
ModelName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._:/@+-]{1,256}$")]


class ProxyConfig(_Strict):
    """``[proxy]``: where ``/proxy/...`` forwards. The agent's own key is passed through.
    ``context_windows`` (model name -> tokens) add to or replace the built-in table of models'
    context windows (worker/core/windows.py); ``builtin_context_windows = false`` uses only
    them."""

    openai_base_url: str = "https://api.openai.com/v1"
    anthropic_base_url: str = "https://api.anthropic.com"
    connect_timeout_s: float = Field(default=10.0, gt=0)
    read_timeout_s: float = Field(default=600.0, gt=0)  # between two chunks of the reply
    max_connections: int = Field(default=200, ge=1)
    context_windows: dict[ModelName, ContextWindowTokens] = Field(default_factory=dict)
    builtin_context_windows: bool = True


class WebhooksConfig(_Strict):
    """``[webhooks]``: delivery of events to the URLs tenants register."""

    allow_private: bool = False  # loopback, link-local and private addresses refused unless set
    max_attempts: int = Field(default=5, ge=1)
    backoff_s: float = Field(default=1.0, ge=0)
    backoff_max_s: float = Field(default=60.0, ge=0)
    timeout_s: float = Field(default=10.0, gt=0)
    max_concurrency: int = Field(default=100, ge=1)
    # Review hooks (webhooks subscribed to compaction.proposed by name): how long one has to
    # answer, and what is decided when none answers in time (or with a bad signature).
    review_deadline_s: float = Field(default=10.0, gt=0, le=300)
    review_default: Literal["approve", "reject"] = "reject"


OTEL_SCHEMES = ("http", "https")


class OtelConfig(_Strict):
    """``[otel]``: OpenTelemetry traces and metrics over OTLP/HTTP (docs/observability.md).
    Unset ``endpoint`` (and no ``OTEL_EXPORTER_OTLP_ENDPOINT``): off, and nothing of
    OpenTelemetry is imported. ``endpoint`` is the collector's base URL (``/v1/traces`` and
    ``/v1/metrics`` are appended); it is masked whenever shown."""

    endpoint: SecretStr | None = None
    service_name: str = Field(default="compaction-worker", min_length=1)
    # The share of traces kept, decided where a trace starts (the agent's submit); a worker
    # follows the decision carried in the task message (parent-based sampling).
    sampling_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    export_interval_s: float = Field(default=5.0, gt=0, le=300)  # spans batched, metrics read
    export_timeout_s: float = Field(default=10.0, gt=0, le=300)

    _none_ok = field_validator("endpoint", mode="before")(none_word)

    @field_validator("endpoint")
    @classmethod
    def _known_scheme(cls, url: SecretStr | None) -> SecretStr | None:
        return _url_with_scheme(url, OTEL_SCHEMES, "OTLP endpoint")


class Settings(_Strict):
    """Everything the service reads, resolved once and passed down."""

    compaction: CompactionConfig = Field(default_factory=CompactionConfig)
    tools: dict[str, ToolConfig] = Field(default_factory=dict)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    redis: RedisConfig = Field(default_factory=RedisConfig)
    broker: BrokerConfig = Field(default_factory=BrokerConfig)
    transcripts: TranscriptRetention = Field(default_factory=TranscriptRetention)
    worker: WorkerConfig = Field(default_factory=WorkerConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)
    webhooks: WebhooksConfig = Field(default_factory=WebhooksConfig)
    otel: OtelConfig = Field(default_factory=OtelConfig)
    cost: CostConfig = Field(default_factory=CostConfig)
    source: str = "defaults"
    # Where each setting given by a source came from (dotted key -> the environment variable or
    # the file): what the commands say at start (origin_of).
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    def origin_of(self, key: str) -> str:
        """Where the setting ``key`` (``redis.url``) came from: ``COMPACTOR_...``, the config
        file's path, or ``default`` (the built-in default)."""
        return self._origins.get(key, "default")

    def with_origin(self, key: str, origin: str) -> Settings:
        """These settings, with ``key`` noted as coming from ``origin``."""
        copy = self.model_copy()
        copy._origins = self._origins | {key: origin}
        return copy

    def with_overrides(
        self, config: Mapping[str, Any] | None, tools: Mapping[str, Any] | None
    ) -> Settings:
        """These settings with a snapshot's own ``config`` and ``tools`` applied on top."""
        if not config and not tools:
            return self
        # Only what was set, so that what the snapshot leaves unset stays unset (a derived
        # summary bound stays derived).
        merged = self.compaction.model_dump(exclude_unset=True) | dict(config or {})
        tool_map = {k: v.model_dump() for k, v in self.tools.items()} | dict(tools or {})
        return self.model_copy(
            update={
                "compaction": _validate(CompactionConfig, merged, prefix="config"),
                "tools": _validate_tools(tool_map, prefix="tools"),
            }
        )


def _validate(model: type[M], data: Any, *, prefix: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _config_error(exc, prefix) from None


def _validate_tools(data: Any, *, prefix: str) -> dict[str, ToolConfig]:
    if not isinstance(data, Mapping):
        raise ConfigError(prefix, "must be a table of tool names")
    return {str(k): _validate(ToolConfig, v, prefix=f"{prefix}.{k}") for k, v in data.items()}


def _config_error(exc: ValidationError, prefix: str) -> ConfigError:
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    key = f"{prefix}.{loc}" if loc else prefix
    reason = first["msg"]
    if first["type"] == "extra_forbidden":
        reason = "unknown key"
    elif first["type"] == "value_error":  # a validator's own message: without pydantic's prefix
        reason = reason.removeprefix("Value error, ")
    return ConfigError(key, reason)


SECTIONS: dict[str, type[BaseModel]] = {
    "compaction": CompactionConfig,
    "llm": LLMConfig,
    "redis": RedisConfig,
    "broker": BrokerConfig,
    "transcripts": TranscriptRetention,
    "worker": WorkerConfig,
    "http": HttpConfig,
    "proxy": ProxyConfig,
    "webhooks": WebhooksConfig,
    "otel": OtelConfig,
    "cost": CostConfig,
}


def settings_from_mapping(data: Mapping[str, Any], *, source: str = "mapping") -> Settings:
    """Validate a TOML-shaped mapping; errors name the dotted key."""
    unknown = set(data) - set(SECTIONS) - {"conversation"}
    if unknown:
        raise ConfigError(sorted(unknown)[0], "unknown section")
    parts: dict[str, Any] = {"source": source}
    for name, model in SECTIONS.items():
        section = data.get(name, {})
        if not isinstance(section, Mapping):
            raise ConfigError(name, "must be a table")
        parts[name] = _validate(model, section, prefix=name)
    conversation = data.get("conversation", {})
    if not isinstance(conversation, Mapping) or set(conversation) - {"tools"}:
        raise ConfigError("conversation", "only [conversation.tools.NAME] tables are allowed")
    parts["tools"] = _validate_tools(conversation.get("tools", {}), prefix="conversation.tools")
    return Settings(**parts)


def mask_url(url: str | None) -> str | None:
    """``redis://user:secret@host`` -> ``redis://user:***@host``."""
    if not url or "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0] if ":" in creds else ""
    return f"{scheme}://{user}:***@{host}"


def redis_url(settings: Settings) -> str | None:
    """The state's Redis URL (``[redis] url`` or ``COMPACTOR_REDIS_URL``; the broker's too
    unless ``[broker] url`` is set), or None for embedded mode."""
    return settings.redis.url.get_secret_value() if settings.redis.url else None


def configured_broker_url(settings: Settings) -> str | None:
    """``[broker] url`` (or ``COMPACTOR_BROKER_URL``) when set; None: the Redis of the state."""
    return settings.broker.url.get_secret_value() if settings.broker.url else None


def shown_settings(settings: Settings) -> dict[str, Any]:
    """The resolved configuration as ``config show`` prints it: secrets masked."""
    data = settings.model_dump(mode="json")
    data["redis"]["url"] = mask_url(redis_url(settings))
    transcripts_url = settings.transcripts.url
    data["transcripts"]["url"] = mask_url(
        transcripts_url.get_secret_value() if transcripts_url else None
    )
    data["broker"]["url"] = mask_url(configured_broker_url(settings))
    otel_endpoint = settings.otel.endpoint
    data["otel"]["endpoint"] = mask_url(otel_endpoint.get_secret_value() if otel_endpoint else None)
    data["llm"]["base_url"] = mask_url(settings.llm.base_url)
    data["llm"]["headers"] = {k: "***" for k in settings.llm.headers}
    data["proxy"]["openai_base_url"] = mask_url(settings.proxy.openai_base_url)
    data["proxy"]["anthropic_base_url"] = mask_url(settings.proxy.anthropic_base_url)
    data["llm"]["api_key"] = (
        "set (masked)" if os.environ.get(settings.llm.api_key_env) else "not set"
    )
    data["conversation"] = {"tools": data.pop("tools")}
    return data


def with_redis_url(settings: Settings, url: str, *, origin: str = "given") -> Settings:
    """These settings pointed at another Redis (an embedded one, say); ``origin``: what says
    so, for :meth:`Settings.origin_of`."""
    redis_cfg = settings.redis.model_copy(update={"url": SecretStr(url)})
    moved = settings.model_copy(update={"redis": redis_cfg})
    return moved.with_origin("redis.url", origin)


def with_broker_url(settings: Settings, url: str | None) -> Settings:
    """These settings with their task messages on another broker (None: the state's Redis)."""
    broker_cfg = BrokerConfig.model_validate(
        settings.broker.model_dump() | {"url": SecretStr(url) if url else None}
    )
    return settings.model_copy(update={"broker": broker_cfg})
