"""The S3 store (``s3://bucket/prefix``): one object per transcript, in any S3-compatible store.

An object's key is ``{prefix}/{conversation}/{name}``. Endpoint, region and credentials come
from the environment as boto3 reads them everywhere (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, an
instance role; ``AWS_REGION`` or ``AWS_DEFAULT_REGION``), so ``[transcripts] url`` plus that
environment configures every host alike. The URL may name the endpoint and region itself
(``s3://bucket/prefix?endpoint=http://host:9000&region=eu-west-1``), which
``compactor transcripts migrate`` needs to copy between two object stores; credentials never
go in the URL.

- Whole or absent, durable: an S3 PUT stores the whole object or nothing, and is durable when
  it returns. The payload's SHA-256 goes with it (``ChecksumSHA256``, which the server checks
  on receipt, and ``x-amz-meta-sha256``), and :meth:`S3Store.get` checks it on the way back.
- Create-only: ``If-None-Match: *`` (a conditional write, in AWS S3 since August 2024). A
  412 means the name exists: the same bytes (a redelivered task) are a successful write,
  others a :class:`~worker.errors.TranscriptConflict`.
- Removal is listing-based, as retention is: :meth:`S3Store.delete` removes an object only if
  it is still the one the listing held (``If-Match`` its ETag, a conditional delete, in AWS S3
  since September 2025). Of prunes racing each other exactly one removes and reports each
  object; an object removed meanwhile (404) or written again (412) is left alone. Plain S3
  deletes are idempotent and say nothing of what was there, which is why a batch
  ``DeleteObjects`` is not used: S3-compatible servers do not all honour its per-object ETags.
- Every botocore error is converted here, once, into :class:`~worker.errors.StorageError`
  naming the bucket (never a credential).

boto3's clients are thread-safe (its sessions are not): one client per store, made from a
private session, is shared by the HTTP server's threads.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from worker.errors import ConfigError, StorageError, TranscriptConflict

try:
    import boto3
    import botocore.exceptions
    from botocore.config import Config
except ImportError:  # the optional extra is not installed: a configuration error, said once
    raise ConfigError(
        "transcripts.url", "an s3:// store needs the s3 extra: pip install 'compaction-worker[s3]'"
    ) from None
from worker.transcripts import (
    NAME_PATTERN,
    StoredTranscript,
    TranscriptKey,
    TranscriptStore,
    is_conversation_id,
    valid_conversation_id,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["S3Store"]

SHA256_METADATA = "sha256"
# Bounded: a store that does not answer fails the write (storage_unavailable, retried later)
# instead of holding a summarize thread for botocore's defaults (60 s reads, 5 attempts).
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 10.0  # between two reads of the answer, not for the whole request
MAX_ATTEMPTS = 3  # per request, the first included (botocore's total_max_attempts)
# One deadline for a whole write (every request it makes, every retry): no attempt starts
# later than this after the write began, so a write ends within WRITE_BOUND_S however the
# store fails to answer (docs/transcripts.md).
WRITE_DEADLINE_S = 20.0
WRITE_BOUND_S = WRITE_DEADLINE_S + CONNECT_TIMEOUT_S + READ_TIMEOUT_S
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_PRECONDITION_FAILED = {"PreconditionFailed", "412"}
# AWS answers 409 to a conditional write racing another one on the same key: try again.
_CONDITIONAL_CONFLICT = "ConditionalRequestConflict"
_CONFLICT_ATTEMPTS = 5
_GONE = {"NoSuchKey", "404", "PreconditionFailed", "412"}


@dataclass(frozen=True)
class _ListedObject(StoredTranscript):
    """A listed transcript with its object's ETag, so that removing it removes that object."""

    etag: str = ""


@dataclass(frozen=True)
class S3Location:
    """What an ``s3://`` URL names: a bucket, a key prefix, and optionally where and which
    region (else the environment's)."""

    bucket: str
    prefix: str
    endpoint: str | None = None
    region: str | None = None

    @classmethod
    def parse(cls, url: str) -> S3Location:
        parts = urlsplit(url)
        if parts.scheme.lower() != "s3" or not parts.netloc:
            raise ConfigError("transcripts.url", "an S3 URL is s3://bucket/prefix")
        if "@" in parts.netloc:
            raise ConfigError(
                "transcripts.url",
                "credentials do not go in an s3:// URL: use AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or a profile or role)",
            )
        if not _BUCKET.fullmatch(parts.netloc):
            raise ConfigError("transcripts.url", f"not an S3 bucket name: {parts.netloc!r}")
        query = parse_qs(parts.query)
        unknown = set(query) - {"endpoint", "region"}
        if unknown:
            raise ConfigError(
                "transcripts.url", f"unknown s3:// URL parameters: {', '.join(sorted(unknown))}"
            )
        return cls(
            bucket=parts.netloc,
            prefix=parts.path.strip("/"),
            endpoint=query.get("endpoint", [None])[-1],
            region=query.get("region", [None])[-1],
        )

    def key_of(self, key: TranscriptKey) -> str:
        return f"{self.prefix}/{key}" if self.prefix else str(key)

    @property
    def listing_prefix(self) -> str:
        return f"{self.prefix}/" if self.prefix else ""


class _Deadline:
    """A per-thread deadline for the requests a client sends (its clients are shared by
    threads). Called by botocore before every attempt: once the deadline has passed it raises
    :class:`_OutOfTime`, which botocore does not retry, instead of sending."""

    def __init__(self) -> None:
        self._local = threading.local()

    @contextlib.contextmanager
    def within(self, seconds: float) -> Iterator[None]:
        self._local.at = time.monotonic() + seconds
        self._local.last = "no attempt"
        try:
            yield
        finally:
            self._local.at = None

    def before_attempt(self, **_: Any) -> None:
        at = getattr(self._local, "at", None)
        if at is not None and time.monotonic() > at:
            raise _OutOfTime(self._local.last)

    def after_attempt(self, exception: Exception | None = None, **kwargs: Any) -> None:
        """Remember how the last attempt ended, for the message should the deadline pass."""
        error = (kwargs.get("parsed_response") or {}).get("Error", {}).get("Code")
        if exception is not None or error:
            self._local.last = type(exception).__name__ if exception is not None else error


class _OutOfTime(Exception):
    """A write's deadline passed before its next attempt (the reason: the last attempt's)."""


class S3Store(TranscriptStore):
    def __init__(self, location: S3Location, client: S3Client | None = None) -> None:
        self.location = location
        self.display = f"s3://{location.bucket}/{location.prefix}"
        self.client = client if client is not None else _client(location)
        self._deadline = _Deadline()
        events = self.client.meta.events
        events.register("before-send.s3", self._deadline.before_attempt)
        events.register("response-received.s3", self._deadline.after_attempt)

    @classmethod
    def from_url(cls, url: str) -> S3Store:
        return cls(S3Location.parse(url))

    def close(self) -> None:
        self.client.close()

    def uri_of(self, key: TranscriptKey) -> str:
        return f"s3://{self.location.bucket}/{self.location.key_of(key)}"

    # --- primitives --------------------------------------------------------------------------

    def create(self, key: TranscriptKey, payload: bytes, digest: str) -> str:
        try:
            with self._deadline.within(WRITE_DEADLINE_S):
                return self._create(key, payload, digest)
        except _OutOfTime as exc:
            raise StorageError(
                f"cannot write transcript {key} to s3://{self.location.bucket}: no attempt "
                f"succeeded within {WRITE_DEADLINE_S:.0f} s (the last: {exc})"
            ) from None

    def _create(self, key: TranscriptKey, payload: bytes, digest: str) -> str:
        for _ in range(_CONFLICT_ATTEMPTS):
            try:
                self.client.put_object(
                    Bucket=self.location.bucket,
                    Key=self.location.key_of(key),
                    Body=payload,
                    IfNoneMatch="*",
                    ChecksumSHA256=base64.b64encode(bytes.fromhex(digest)).decode("ascii"),
                    Metadata={SHA256_METADATA: digest},
                    ContentType="application/json",
                )
                return self.uri_of(key)
            except botocore.exceptions.ClientError as exc:
                code = _error_code(exc)
                if code == _CONDITIONAL_CONFLICT:
                    continue
                if code not in _PRECONDITION_FAILED:
                    raise self._error("write", key, exc) from None
            except botocore.exceptions.BotoCoreError as exc:
                raise self._error("write", key, exc) from None
            # It exists: a redelivered write of the same bytes is done; other bytes conflict.
            if hashlib.sha256(self.get(key)).hexdigest() != digest:
                raise TranscriptConflict.of(key.name)
            return self.uri_of(key)
        raise StorageError(
            f"cannot write transcript {key} to s3://{self.location.bucket}: "
            "concurrent conditional writes kept conflicting"
        )

    def get(self, key: TranscriptKey) -> bytes:
        try:
            reply = self.client.get_object(
                Bucket=self.location.bucket, Key=self.location.key_of(key), ChecksumMode="ENABLED"
            )
            data = reply["Body"].read()
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            raise self._error("read", key, exc) from None
        expected = reply.get("Metadata", {}).get(SHA256_METADATA)
        if expected is not None and hashlib.sha256(data).hexdigest() != expected:
            raise StorageError(
                f"cannot read transcript {key} from s3://{self.location.bucket}: "
                "its bytes do not match the sha256 stored with it"
            )
        return data

    def stored(self, conversation_id: str | None = None) -> list[StoredTranscript]:
        prefix = self.location.listing_prefix
        if conversation_id is not None:
            prefix += valid_conversation_id(conversation_id) + "/"
        found = []
        for item in self._list(prefix):
            key = self._key_of_object(item["Key"])
            if key is not None:
                found.append(
                    _ListedObject(
                        key,
                        self.uri_of(key),
                        item["Size"],
                        item["LastModified"].timestamp(),
                        etag=item["ETag"],
                    )
                )
        return sorted(found, key=lambda t: t.key)

    def delete(self, items: Iterable[StoredTranscript]) -> list[StoredTranscript]:
        return [t for t in items if self._delete_listed(t)]

    # --- helpers -----------------------------------------------------------------------------

    def _list(self, prefix: str) -> Iterator[Any]:
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.location.bucket, Prefix=prefix
            )
            for page in pages:
                yield from page.get("Contents", [])
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            raise self._error("list", None, exc) from None

    def _delete_listed(self, item: StoredTranscript) -> bool:
        """Remove the object a listing held, if it is still that object: ``If-Match`` its ETag,
        so of prunes racing each other exactly one removes (and reports) it, and an object
        written again under the same name since the listing is never removed by it."""
        object_key = self.location.key_of(item.key)
        try:
            etag = item.etag if isinstance(item, _ListedObject) else self._etag(object_key)
            if etag is None:
                return False
            self.client.delete_object(Bucket=self.location.bucket, Key=object_key, IfMatch=etag)
        except botocore.exceptions.ClientError as exc:
            if _error_code(exc) in _GONE:
                return False  # removed by another prune, or replaced since the listing
            raise self._error("remove", item.key, exc) from None
        except botocore.exceptions.BotoCoreError as exc:
            raise self._error("remove", item.key, exc) from None
        return True

    def _etag(self, object_key: str) -> str | None:
        try:
            return self.client.head_object(Bucket=self.location.bucket, Key=object_key)["ETag"]
        except botocore.exceptions.ClientError as exc:
            if _error_code(exc) in _GONE:
                return None
            raise

    def _key_of_object(self, object_key: str) -> TranscriptKey | None:
        """The transcript an object key names, or None for any other object under the prefix."""
        rest = object_key[len(self.location.listing_prefix) :].split("/")
        if len(rest) != 2 or not is_conversation_id(rest[0]) or not NAME_PATTERN.fullmatch(rest[1]):
            return None
        return TranscriptKey(rest[0], rest[1])

    def _error(self, action: str, key: TranscriptKey | None, exc: Exception) -> StorageError:
        what = f"transcript {key}" if key is not None else "transcripts"
        where = "to" if action == "write" else "from" if action in ("read", "remove") else "in"
        return StorageError(
            f"cannot {action} {what} {where} s3://{self.location.bucket}: {_reason(exc)}"
        )


def _client(location: S3Location) -> S3Client:
    config = Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        retries={"total_max_attempts": MAX_ATTEMPTS, "mode": "standard"},
    )
    try:
        session = boto3.session.Session()  # one per store: sessions are not thread-safe
        return session.client(
            "s3",
            endpoint_url=location.endpoint,  # None: AWS_ENDPOINT_URL(_S3), else AWS
            region_name=location.region or os.environ.get("AWS_REGION") or None,
            config=config,
        )
    except (botocore.exceptions.BotoCoreError, ValueError) as exc:
        raise ConfigError("transcripts.url", f"cannot use this S3 store: {exc}") from None


def _error_code(exc: botocore.exceptions.ClientError) -> str:
    error = exc.response.get("Error", {})
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return str(error.get("Code") or status or "")


def _reason(exc: Exception) -> str:
    """What went wrong, in botocore's words (which never include the secret key)."""
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        code = error.get("Code", "error")
        message = error.get("Message")
        return f"{code}: {message}" if message else str(code)
    return f"{type(exc).__name__}: {exc}"
