"""Token budget: the most recent history that fits a number of tokens."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from worker.core.projection import count_message_tokens
from worker.core.strategies._base import keep_newest_groups
from worker.tokens import Tokenizer
from worker.wire.models import Message


class TokenBudgetConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: StrictInt = Field(ge=1)


class TokenBudget:
    """Keep the leading system message(s), then walk back from the newest group accumulating
    token counts, keeping groups until the next would push the total past ``max_tokens``.

    The total is the sum of :func:`worker.core.projection.count_message_tokens` over the kept
    messages, leading systems included; a request carrying them costs ``REPLY_PRIMING_TOKENS``
    more. Counts are taken on the messages as given, not on their projection. A group that
    does not fit is dropped whole with everything older, even if an older, smaller group would
    fit, so the history stays contiguous. The leading systems and the protected tail (the
    newest group and any tool exchange still waiting for results,
    :func:`worker.core.groups.protected_tail_start`) are always kept; when they alone exceed
    ``max_tokens``, the result is exactly them.
    """

    def __init__(self, config: TokenBudgetConfig, tokenizer: Tokenizer) -> None:
        self.config = config
        self.tokenizer = tokenizer

    def compact(self, messages: list[Message]) -> list[Message]:
        return keep_newest_groups(messages, budget=self.config.max_tokens, cost=self._tokens)

    def _tokens(self, message: Message) -> int:
        return count_message_tokens(message, self.tokenizer)
