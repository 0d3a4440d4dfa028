"""API keys and tenants.

Keys come from the environment (``COMPACTOR_API_KEYS``, a JSON object key -> tenant) or from the
file named by ``[http] api_keys_file`` (the same shape), never from the TOML file. A tenant is
part of every key the service writes for it: the external conversation id ``c-42`` of tenant
``acme`` is the internal id ``acme:c-42``, so its Redis keys and transcript paths carry the
tenant and no tenant can name another's data.

What a tenant is shown of an event (:meth:`Tenant.event`) names neither the prefix nor where
the service keeps its data: the transcript reference is the API path that serves it.

With no keys, ``compactor serve`` refuses to start unless told to run without authentication
(``--no-auth``, ``[http] allow_unauthenticated``): then every request is tenant
:data:`OPEN_TENANT`, whatever key it brings.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.config import Settings
from worker.errors import ConfigError, InvalidSnapshot
from worker.wire.models import CONVERSATION_ID_PATTERN, CONVERSATION_ID_RULE

API_KEYS_ENV = "COMPACTOR_API_KEYS"
OPEN_TENANT = "anonymous"  # every request's tenant when authentication is off
# No ':' in a tenant: the first ':' of an internal id ends the tenant, so two tenants' ids can
# never collide ("a:b" + "c" vs "a" + "b:c").
TENANT_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}$"
_CONVERSATION_ID = re.compile(CONVERSATION_ID_PATTERN)
# Where a tenant reads a transcript; what a tenant's events carry as compaction.transcript.uri.
TRANSCRIPT_PATH = "/v1/conversations/{conversation_id}/transcripts/{revision}"
# The message of a storage failure names the store's paths, hosts or bucket: not for tenants.
STORAGE_FAILED = "the transcript store is unavailable; a later snapshot tries again"


@dataclass(frozen=True)
class Tenant:
    name: str

    def internal(self, conversation_id: str) -> str:
        """The id the service stores ``conversation_id`` under; InvalidSnapshot if it is not
        a valid id (or too long with the tenant prefix)."""
        internal = f"{self.name}:{conversation_id}"
        if not _CONVERSATION_ID.fullmatch(conversation_id) or not _CONVERSATION_ID.fullmatch(
            internal
        ):
            limit = 128 - len(self.name) - 1
            raise InvalidSnapshot(
                "conversation_id", f"{CONVERSATION_ID_RULE} (at most {limit} characters here)"
            )
        return internal

    def external(self, internal: str) -> str:
        prefix = self.name + ":"
        return internal[len(prefix) :] if internal.startswith(prefix) else internal

    def event(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """An event (its JSON document) as this tenant is shown it, over HTTP, SSE and
        webhooks: its own conversation id, in the texts too; ``compaction.transcript.uri`` the
        API path of the transcript instead of the store's location; no store location in a
        storage failure's message. Internal readers (workers, ``worker.client``) keep the
        event as published."""
        internal = str(doc.get("conversation_id", ""))
        external = self.external(internal)
        out = dict(doc, conversation_id=external)
        compaction = doc.get("compaction")
        if isinstance(compaction, dict) and isinstance(compaction.get("transcript"), dict):
            path = TRANSCRIPT_PATH.format(conversation_id=external, revision=doc.get("revision"))
            out["compaction"] = compaction | {
                "transcript": compaction["transcript"] | {"uri": path}
            }
        error = doc.get("error")
        if isinstance(error, dict):
            storage = error.get("code") == "storage_unavailable"

            def text(value: Any) -> Any:
                if not isinstance(value, str):
                    return value
                return STORAGE_FAILED if storage else value.replace(internal, external)

            out["error"] = error | {"message": text(error.get("message"))}
            if "reason" in doc:
                out["reason"] = text(doc["reason"])
        return out


class ApiKeys:
    """Key -> tenant, looked up in constant time per key (``hmac.compare_digest``); or, with
    ``open_to``, that one tenant for every request (authentication off)."""

    def __init__(self, keys: Mapping[str, str], *, open_to: Tenant | None = None) -> None:
        self._keys = [(k.encode(), Tenant(t)) for k, t in keys.items()]
        self.open_to = open_to

    def __len__(self) -> int:
        """The ways in: the keys, or one when authentication is off (so "no keys" means no
        request can get in)."""
        return len(self._keys) + (self.open_to is not None)

    def tenant(self, presented: str | None) -> Tenant | None:
        if self.open_to is not None:
            return self.open_to
        if not presented:
            return None
        given = presented.encode("utf-8", "surrogateescape")
        found = None
        for key, tenant in self._keys:  # no early exit: the time does not tell which key
            if hmac.compare_digest(key, given):
                found = tenant
        return found

    def has_digest(self, digest: str, tenant: Tenant) -> bool:
        """Whether a key whose sha256 is ``digest`` still opens ``tenant`` (an inspector
        session ends when its key is removed from the configuration)."""
        if self.open_to is not None:
            return tenant == self.open_to
        given = digest.encode()
        found = False
        for key, owner in self._keys:
            mine = hashlib.sha256(key).hexdigest().encode()
            found |= hmac.compare_digest(mine, given) and owner == tenant
        return found


def bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def load_api_keys(settings: Settings, environ: Mapping[str, str]) -> ApiKeys:
    """The file's keys, then the environment's (which win for a key in both)."""
    keys: dict[str, str] = {}
    path = settings.http.api_keys_file
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError("http.api_keys_file", f"cannot read: {exc.strerror}") from None
        keys |= _parse(text, "http.api_keys_file")
    if environ.get(API_KEYS_ENV):
        keys |= _parse(environ[API_KEYS_ENV], API_KEYS_ENV)
    if settings.http.allow_unauthenticated:
        if keys:
            raise ConfigError(
                "http.allow_unauthenticated",
                "API keys are configured too: serve with the keys, or without authentication "
                "(--no-auth), not both",
            )
        return ApiKeys({}, open_to=Tenant(OPEN_TENANT))
    return ApiKeys(keys)


def serving_keys(settings: Settings, environ: Mapping[str, str]) -> ApiKeys:
    """The keys ``compactor serve`` would run with; ConfigError (``http.api_keys``) when there
    are none and authentication is not explicitly off: every /v1 request would get 401."""
    keys = load_api_keys(settings, environ)
    if not len(keys):
        raise ConfigError(
            "http.api_keys",
            f"no API keys configured: set {API_KEYS_ENV} or [http] api_keys_file, or serve "
            "without authentication with --no-auth (or [http] allow_unauthenticated = true)",
        )
    return keys


def _parse(text: str, where: str) -> dict[str, str]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise ConfigError(where, "must be a JSON object of API key -> tenant") from None
    if not isinstance(data, dict):
        raise ConfigError(where, "must be a JSON object of API key -> tenant")
    for key, tenant in data.items():
        if len(key) < 16:
            raise ConfigError(where, "every API key must be at least 16 characters")
        if not isinstance(tenant, str) or not re.fullmatch(TENANT_PATTERN, tenant):
            raise ConfigError(
                where, f"a tenant must match {TENANT_PATTERN} (no ':'), got {tenant!r}"
            )
    return dict(data)
