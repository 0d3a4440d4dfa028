"""One answer per thread, kept for the very same messages: a compaction asks several steps
(the LLM's checklist, the digest, the fidelity check) for the facts or names of one range."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from worker.wire.models import Message

T = TypeVar("T")


class LastAnswer(Generic[T]):
    """``compute(messages)``, reused while this thread asks again for the same message objects
    (compared by identity, so a changed message is never served a stale answer). Callers must
    not modify the answer."""

    def __init__(self, compute: Callable[[list[Message]], T]) -> None:
        self._compute = compute
        self._last = threading.local()

    def __call__(self, messages: list[Message]) -> T:
        last = self._last
        asked: tuple[Message, ...] | None = getattr(last, "messages", None)
        if (
            asked is not None
            and len(asked) == len(messages)
            and all(a is b for a, b in zip(asked, messages, strict=True))
        ):
            answer: T = last.answer
            return answer
        answer = self._compute(messages)
        last.messages, last.answer = tuple(messages), answer
        return answer
