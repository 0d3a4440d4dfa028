"""What a session is, fixed at construction: the conversation, the client, the snapshot's fields."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from worker.client import Client
from worker.config import CompactionConfig
from worker.wire.models import WireFormat
from worker.wire.snapshots import OPERATOR_ONLY

# Every module of the package logs under the one name users configure (as before the split).
log = logging.getLogger("worker.session")


@dataclass(frozen=True)
class Setup:
    conversation_id: str
    client: Client
    format: WireFormat
    model: str | None
    context_window: int | None
    system: Any
    tools: dict[str, Any]
    overrides: dict[str, Any]  # the snapshot's ``config``
    projection_config: CompactionConfig  # the client's settings with the overrides
    follow_block_ms: int

    @classmethod
    def of(
        cls,
        conversation_id: str,
        *,
        client: Client,
        format: WireFormat = "openai",
        model: str | None = None,
        context_window: int | None = None,
        config: Mapping[str, Any] | CompactionConfig | None = None,
        tools: Mapping[str, Any] | None = None,
        system: Any = None,
        follow_block_ms: int = 500,
    ) -> Setup:
        tools = dict(tools or {})
        overrides, projection_config = _resolve_config(client, config, tools)
        return cls(
            conversation_id,
            client,
            format,
            model,
            context_window,
            system,
            tools,
            overrides,
            projection_config,
            follow_block_ms,
        )

    def snapshot(self, revision: int, messages: tuple[Any, ...]) -> dict[str, Any]:
        snap: dict[str, Any] = {
            "conversation_id": self.conversation_id,
            "revision": revision,
            "model": {"name": self.model or "", "context_window": self.context_window},
            "format": self.format,
            "messages": list(messages),
        }
        if self.system is not None:
            snap["system"] = self.system
        if self.overrides:
            snap["config"] = self.overrides
        if self.tools:
            snap["tools"] = self.tools
        return snap


class SetupView:
    """The setup's fields as the session's own read-only attributes (``session.format``)."""

    setup: Setup

    @property
    def conversation_id(self) -> str:
        return self.setup.conversation_id

    @property
    def client(self) -> Client:
        return self.setup.client

    @property
    def format(self) -> WireFormat:
        return self.setup.format

    @property
    def model(self) -> str | None:
        return self.setup.model

    @property
    def context_window(self) -> int | None:
        return self.setup.context_window

    @property
    def system(self) -> Any:
        return self.setup.system

    @property
    def tools(self) -> dict[str, Any]:
        return self.setup.tools

    @property
    def overrides(self) -> dict[str, Any]:
        return self.setup.overrides

    @property
    def projection_config(self) -> CompactionConfig:
        return self.setup.projection_config

    @property
    def follow_block_ms(self) -> int:
        return self.setup.follow_block_ms


def _resolve_config(
    client: Client,
    config: Mapping[str, Any] | CompactionConfig | None,
    tools: Mapping[str, Any],
) -> tuple[dict[str, Any], CompactionConfig]:
    """(the snapshot's ``config`` overrides, the configuration the projection uses)."""
    settings = client.settings
    if isinstance(config, CompactionConfig):
        base = settings.compaction.model_dump(mode="json")
        mine = config.model_dump(mode="json")
        overrides = {k: v for k, v in mine.items() if k not in OPERATOR_ONLY and base.get(k) != v}
        return overrides, config
    overrides = dict(config or {})
    return overrides, settings.with_overrides(overrides, tools).compaction
