"""One error tree for the whole service.

Third-party exceptions are converted into these once, in the adapter that meets them; Celery
tasks retry on :class:`TransientError` only and turn everything else into a final event. The
command line maps the tree to exit codes in one place (``worker.cli.exit_code``):
:class:`RejectedInput` exits 2, every other :class:`CompactorError` 1.
"""

from __future__ import annotations


class CompactorError(Exception):
    """Base of every error the service raises on purpose; ``code`` is stable, machine-readable."""

    code = "error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else self.code

    def to_dict(self) -> dict[str, object]:
        return {"error": self.code, "message": self.message}


class PermanentError(CompactorError):
    """Retrying cannot help: bad input, bad configuration, a lost lease."""

    code = "permanent"


class TransientError(CompactorError):
    """May succeed later: a network fault, a busy provider, an unavailable store."""

    code = "transient"


class RejectedInput(PermanentError):
    """The input was refused before any work: an argument, a file, the configuration, a
    snapshot. The command line exits 2 for these."""

    code = "rejected"


class UsageError(RejectedInput):
    """A command-line argument cannot be used (e.g. an input file that cannot be read)."""

    code = "usage"


class InvalidInput(RejectedInput):
    """An input file's content is not what the command reads (not UTF-8, not JSON)."""

    code = "invalid_input"


class ConfigError(RejectedInput):
    """A configuration value is invalid; ``key`` names it (dotted, as in the TOML file)."""

    code = "invalid_config"

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason

    def to_dict(self) -> dict[str, object]:
        return {"error": self.code, "key": self.key, "message": self.message}


class InvalidSnapshot(RejectedInput):
    """A snapshot was rejected; ``field`` names where (dotted path), ``reason`` says why."""

    code = "invalid_snapshot"

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}" if field else reason)
        self.field = field
        self.reason = reason

    def to_dict(self) -> dict[str, object]:
        return {"error": self.code, "field": self.field, "reason": self.reason}


class TokenizerUnavailable(PermanentError):
    code = "tokenizer_unavailable"


class StorageError(TransientError):
    """The transcript store could not take a write (read-only, full, missing)."""

    code = "storage_unavailable"


class TranscriptConflict(PermanentError):
    """A different transcript already exists under this compaction's name: the same
    conversation and revision were submitted again with other messages. Transcripts are
    create-only, so the first one stays; submit the edited history under a new revision."""

    code = "transcript_conflict"

    @classmethod
    def of(cls, name: str) -> TranscriptConflict:
        return cls(
            f"a different transcript already exists as {name}: this conversation and revision "
            "were compacted before with other messages; the first stays (transcripts are "
            "create-only); submit the edited history as a new revision"
        )


class SummaryError(CompactorError):
    """Summarization failed; subclasses say whether a retry may help."""

    code = "summary_failed"


class LeaseLost(PermanentError):
    """This worker no longer holds the conversation's lock; it must not publish."""

    code = "lease_lost"


class LLMTransientError(TransientError):
    """The LLM provider failed in a way a later attempt may not (429, 5xx, timeout, network)."""

    code = "llm_unavailable"


class LLMPermanentError(PermanentError):
    """The LLM provider refused the request for good (4xx other than 429, bad key, bad model)."""

    code = "llm_rejected"


class EventMismatch(PermanentError):
    """The event does not describe these messages (another conversation or history, or it is
    already applied), or has nothing to apply."""

    code = "event_mismatch"


class CompressionError(RejectedInput):
    """A compressed tool result cannot be expanded (unknown or corrupt form)."""

    code = "compression_invalid"


class RedisUnavailable(TransientError):
    """Redis (broker, locks, events) cannot be reached now; the task is retried later."""

    code = "redis_unavailable"


class BrokerUnavailable(RedisUnavailable):
    """The broker (RabbitMQ, or the Redis that carries the task queues) cannot take a task
    message now. A kind of :class:`RedisUnavailable` so that everything that already waits
    out an unreachable Redis (a task's retries, the HTTP API's 503) treats it the same, under a
    code that names the broker."""

    code = "broker_unavailable"


class InvalidRequest(RejectedInput):
    """A request to the service (not a snapshot: a compaction on demand, say) was refused;
    ``field`` names the part that is wrong, ``reason`` says why."""

    code = "invalid_request"

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}" if field else reason)
        self.field = field
        self.reason = reason

    def to_dict(self) -> dict[str, object]:
        return {"error": self.code, "field": self.field, "message": self.message}


class NoSnapshot(RejectedInput):
    """A compaction was asked for a conversation that has no snapshot to compact (none was
    submitted, or the newest one expired after ``snapshot_ttl_s``)."""

    code = "no_snapshot"
