"""How long a background loop waits before trying again: pure (no clock, no random of its own)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

_MAX_DOUBLINGS = 64  # far past any cap; keeps 2**n a float that cannot overflow


def _no_jitter() -> float:
    return 0.0


@dataclass(frozen=True)
class Backoff:
    """Delays that start at ``base_s``, double with each attempt and stop at ``cap_s``.

    ``jitter`` is the largest share of a delay taken off at random (0: none, 1: anything down
    to zero) and ``random`` the source of that chance, a callable answering in [0, 1): passed
    in, so that the delays of a given source are known in advance."""

    base_s: float
    cap_s: float
    jitter: float = 0.0
    random: Callable[[], float] = _no_jitter

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.cap_s:
            raise ValueError(
                f"a backoff needs 0 < base_s <= cap_s, not {self.base_s}, {self.cap_s}"
            )
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"a backoff's jitter is a share in [0, 1], not {self.jitter}")

    def delay(self, attempt: int) -> float:
        """The wait before trying again after ``attempt`` failures in a row (1: the first)."""
        if attempt < 1:
            raise ValueError(f"a backoff counts attempts from 1, not {attempt}")
        doubled = self.base_s * 2.0 ** min(attempt - 1, _MAX_DOUBLINGS)
        return min(doubled, self.cap_s) * (1.0 - self.jitter * self.random())
