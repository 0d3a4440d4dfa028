"""``compactor transcripts migrate FROM TO``: copy every kept transcript from one store to
another, verified and resumable.

Each transcript is read from the source, written to the target under the same conversation
and name (create-only), and read back from the target and compared by sha256 before it
counts as copied. One the target already holds with the same bytes (a migration interrupted
and run again) is skipped after the same comparison; one it holds with other bytes is a
conflict: reported and counted, never overwritten. Because readers find a transcript by its
conversation and name (:func:`worker.transcripts.key_of_uri`), events published before the
migration restore from the target once ``[transcripts] url`` names it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from worker.errors import StorageError, TranscriptConflict
from worker.transcripts import StoredTranscript, TranscriptStore

__all__ = ["Migration", "migrate"]


@dataclass
class Migration:
    """How far a migration got: ``total`` transcripts listed in the source, ``done`` of them
    handled (copied + skipped + conflicts); ``bytes`` copied."""

    source: str
    target: str
    total: int = 0
    copied: int = 0
    skipped: int = 0
    bytes: int = 0
    conflicts: list[str] = field(default_factory=list)

    @property
    def done(self) -> int:
        return self.copied + self.skipped + len(self.conflicts)

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["conflicts"] = len(self.conflicts)
        out["conflicting"] = list(self.conflicts)
        return out


def migrate(
    source: TranscriptStore,
    target: TranscriptStore,
    *,
    progress: Callable[[Migration], None] | None = None,
) -> Migration:
    """Copy every transcript ``source`` keeps into ``target`` (see the module docstring);
    ``progress`` is called after each one."""
    items = source.stored()
    state = Migration(source=source.display, target=target.display, total=len(items))
    present = {t.key for t in target.stored()}
    for item in items:
        _copy(item, source, target, state, already_there=item.key in present)
        if progress is not None:
            progress(state)
    return state


def _copy(
    item: StoredTranscript,
    source: TranscriptStore,
    target: TranscriptStore,
    state: Migration,
    *,
    already_there: bool,
) -> None:
    payload = source.get(item.key)
    digest = hashlib.sha256(payload).hexdigest()
    if not already_there:
        try:
            target.create(item.key, payload, digest)
        except TranscriptConflict:
            state.conflicts.append(str(item.key))
            return
    stored = target.get(item.key)  # read back: what the target now serves
    if hashlib.sha256(stored).hexdigest() != digest:
        if already_there:
            state.conflicts.append(str(item.key))
            return
        raise StorageError(
            f"transcript {item.key} read back from {target.display} does not match what was "
            "written (sha256)"
        )
    if already_there:
        state.skipped += 1
    else:
        state.copied += 1
        state.bytes += len(payload)
