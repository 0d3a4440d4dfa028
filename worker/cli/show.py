"""``compactor show CONVERSATION [--revision N]``: one compaction in a terminal, what the
inspector's compaction page shows: the replaced messages beside (or, in a narrow terminal,
above) what replaced them, the summary's sections with the messages each was drawn from, the
fidelity and what was dropped outright.

Colour (ANSI) only when stdout is a terminal and ``NO_COLOR`` is not set; plain text when
piped. The data is :func:`worker.core.inspection.compaction_view`'s, the same as the page's.
Whatever comes from a conversation is printed with its control characters escaped (``\x1b``),
on a terminal and piped alike: a message's text can never move the cursor, retitle the window,
write the clipboard or hide what follows.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import os
import shutil
import sys
import textwrap
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from worker.backend import keys
from worker.cli.common import say_start_if_asked, settings_of
from worker.cli.demo import describe_event
from worker.core.inspection import CompactionView, compaction_view
from worker.errors import CompactorError, UsageError
from worker.wire.events import CompletedEvent, parse_event

SIDE_BY_SIDE_MIN = 120  # columns from which the two sides stand next to each other
MAX_LINES = 24  # of one message, unless --full
_GAP = " │ "


def visible(text: str) -> str:
    """``text`` with every control character but line breaks and tabs (C0, DEL, C1) and every
    bidirectional formatting character written as an escape (``\x1b``, ``\u202e``)."""
    return "".join(
        ch if ch in "\n\t" or not _hidden(ch) else ch.encode("unicode_escape").decode("ascii")
        for ch in text
    )


def _hidden(ch: str) -> bool:
    return unicodedata.category(ch) == "Cc" or unicodedata.bidirectional(ch) in _BIDI_CONTROLS


_BIDI_CONTROLS = frozenset({"LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI"})


@dataclass(frozen=True)
class Style:
    """ANSI styles, or none."""

    on: bool

    def _wrap(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.on else text

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def red(self, text: str) -> str:
        return self._wrap("31", text)

    def green(self, text: str) -> str:
        return self._wrap("32", text)

    def cyan(self, text: str) -> str:
        return self._wrap("36", text)


def use_colour(stream: TextIO, environ: dict[str, str] | os._Environ[str]) -> bool:
    """Colour only on a terminal, and never with ``NO_COLOR`` set (https://no-color.org)."""
    return stream.isatty() and not environ.get("NO_COLOR") and environ.get("TERM") != "dumb"


def cmd_show(args: argparse.Namespace) -> int:
    from worker.client import Client

    settings = settings_of(args)
    say_start_if_asked("show", settings, args)
    client = Client(settings)
    try:
        entries = _all_events(client, args.conversation_id)
        if not entries:  # no such conversation: which ones it may have meant
            raise _unknown(
                args.conversation_id, suggestions(client.state.client, args.conversation_id)
            )
        chosen = _choose(entries, args.conversation_id, args.revision)
        if not isinstance(chosen[1], CompletedEvent):
            print(visible(describe_event(chosen[1])))  # a skip, a failure: what happened
            return 0
        event, raw = chosen[1], chosen[0]
        original, problem = _original(client, event)
    finally:
        client.close()
    view = compaction_view(event, original, raw=raw, transcript_problem=problem)
    width = shutil.get_terminal_size((100, 24)).columns if sys.stdout.isatty() else 100
    style = Style(use_colour(sys.stdout, os.environ))
    for line in render(view, width=width, style=style, full=args.full):
        print(line)
    return 0


def _all_events(client: Any, conversation_id: str) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    after = "0"
    while True:
        batch = client.state.read_events(conversation_id, after=after, count=500)
        if not batch:
            return out
        after = batch[-1][0]
        out += [(sid, doc) for sid, doc in batch if doc is not None]


MAX_TENANTS = 100  # tenant indexes looked at for a suggestion
MAX_SUGGESTIONS = 10
NEWEST_COMPARED = 1000  # of each tenant's conversations, for an id that is near, not equal


def suggestions(redis_client: Any, conversation_id: str) -> list[str]:
    """The conversations ``conversation_id`` (which has no events) may mean, at most
    :data:`MAX_SUGGESTIONS`, tenant by tenant: the same id under a tenant's prefix (what
    ``compactor serve`` and a client that prefixes its ids store: ``TENANT:ID``), or without
    its prefix or under another tenant's; when none is, the ids nearest it among each tenant's
    :data:`NEWEST_COMPARED` most recent. At most :data:`MAX_TENANTS` tenants are looked at."""
    from worker.backend.connection import redis_errors

    tenant, colon, rest = conversation_id.partition(":")
    bare = rest if colon else conversation_id
    with redis_errors("looking for the conversations it may mean"):
        tenants = _tenants(redis_client)
        same = [f"{t}:{bare}" for t in tenants if f"{t}:{bare}" != conversation_id]
        found = _indexed(redis_client, same)
        if colon and redis_client.exists(keys.events(bare), keys.latest(bare)):
            found.insert(0, bare)
        if not found:
            within = [tenant] if colon and tenant in tenants else tenants
            found = _nearest(redis_client, within, bare)
    return found[:MAX_SUGGESTIONS]


def _tenants(redis_client: Any) -> list[str]:
    """The tenants with a conversation index (``cw:tenant:T:conversations``), sorted."""
    head, _, tail = keys.tenant_conversations("*").partition("*")
    found = itertools.islice(
        redis_client.scan_iter(match=f"{head}*{tail}", count=1000, _type="zset"), MAX_TENANTS
    )
    return sorted({_text(key)[len(head) : -len(tail)] for key in found})


def _indexed(redis_client: Any, candidates: list[str]) -> list[str]:
    """Those of ``candidates`` (``TENANT:ID``) their tenant's index holds."""
    pipe = redis_client.pipeline(transaction=False)
    for candidate in candidates:
        pipe.zscore(keys.tenant_conversations(candidate.partition(":")[0]), candidate)
    return [c for c, score in zip(candidates, pipe.execute(), strict=True) if score is not None]


def _nearest(redis_client: Any, tenants: list[str], bare: str) -> list[str]:
    """The ids of ``tenants`` whose part after the prefix is nearest ``bare`` (a typo)."""
    by_rest: dict[str, str] = {}
    for tenant in tenants:
        newest = redis_client.zrevrange(keys.tenant_conversations(tenant), 0, NEWEST_COMPARED - 1)
        for member in map(_text, newest):
            by_rest.setdefault(member.partition(":")[2], member)
    near = difflib.get_close_matches(bare, list(by_rest), n=MAX_SUGGESTIONS, cutoff=0.75)
    return [by_rest[rest] for rest in near]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _unknown(conversation_id: str, meant: list[str]) -> UsageError:
    """No event of ``conversation_id`` at all: say so, and which ids it may mean."""
    if not meant:
        return UsageError(
            f"no conversation {conversation_id!r} has events, and no conversation of a tenant "
            "has an id like it (compactor events ID lists a conversation's events)"
        )
    listed = ", ".join(meant)
    return UsageError(
        f"no conversation {conversation_id!r} has events; did you mean {listed}? (conversations "
        "submitted through compactor serve, or with a tenant prefix, are named TENANT:ID)"
    )


def _choose(
    entries: list[tuple[str, dict[str, Any]]], conversation_id: str, revision: int | None
) -> tuple[dict[str, Any], Any]:
    """The newest compaction (not restored since), or the outcome of ``revision``."""
    reverted = {
        doc.get("reverted_event_id")
        for _sid, doc in entries
        if doc.get("type") == "compaction.reverted"
    }
    found = None
    for _sid, doc in entries:
        if revision is not None and doc.get("revision") != revision:
            continue
        kind = doc.get("type")
        if (kind == "compaction.completed" and doc.get("event_id") not in reverted) or (
            revision is not None
            and kind in ("compaction.skipped", "compaction.failed")
            and (found is None or found.get("type") != "compaction.completed")
        ):
            found = doc
    if found is None:
        which = f"revision {revision}" if revision is not None else "any revision"
        raise UsageError(
            f"no compaction of {which} of {conversation_id} in its events "
            f"(compactor events {conversation_id} lists them)"
        )
    return found, parse_event(found)


def _original(client: Any, event: CompletedEvent) -> tuple[list[dict[str, Any]] | None, str | None]:
    try:
        messages: list[dict[str, Any]] = client.restore(event)
    except CompactorError as exc:
        return None, exc.message
    return messages, None


# --- rendering ---------------------------------------------------------------------------------


def render(view: CompactionView, *, width: int, style: Style, full: bool = False) -> list[str]:
    """The compaction as lines of at most ``width`` columns."""
    event, c = view.event, view.event.compaction
    head = [
        style.bold(f"{event.conversation_id} revision {event.revision}: {event.type}"),
        f"{c.tokens_before:,} → {c.tokens_after:,} tokens: {c.end - c.start} messages "
        f"({visible(c.first_id)} … {visible(c.last_id)}) replaced by {len(c.replacement)}",
        "",
    ]
    if width >= SIDE_BY_SIDE_MIN:
        half = (width - len(_GAP)) // 2
        left = _replaced(view, half, style, full)
        right = _replacement(view, half, style, full)
        body = [
            _pad(a, half) + style.dim(_GAP) + b
            for a, b in itertools.zip_longest(left, right, fillvalue="")
        ]
    else:
        body = [*_replaced(view, width, style, full), "", *_replacement(view, width, style, full)]
    return [*head, *body, "", *_fidelity(view, style), *_dropped(view, width, style)]


def _columns(text: str) -> int:
    """Columns ``text`` takes (ANSI codes take none)."""
    out, skipping = 0, False
    for ch in text:
        if ch == "\033":
            skipping = True
        elif skipping:
            skipping = ch != "m"
        else:
            out += 1
    return out


def _pad(text: str, width: int) -> str:
    return text + " " * max(0, width - _columns(text))


def _wrapped(text: str, width: int, full: bool) -> Iterator[str]:
    lines = [
        piece
        for line in (visible(text).splitlines() or [""])
        for piece in (textwrap.wrap(line, max(width, 10), replace_whitespace=False) or [""])
    ]
    shown = lines if full or len(lines) <= MAX_LINES else lines[:MAX_LINES]
    yield from shown
    if len(shown) < len(lines):
        yield f"… {len(lines) - len(shown)} more lines (--full shows them)"


def _replaced(view: CompactionView, width: int, style: Style, full: bool) -> list[str]:
    out = [style.red(style.bold(f"REPLACED ({len(view.replaced)} messages)"))]
    if not view.replaced:
        why = view.transcript_problem or "the transcript holds none"
        return [*out, visible(f"cannot be shown: {why}")[:width]]
    titles = {s.number: s.title or "(intro)" for s in view.sections}
    for m in view.replaced:
        drawn = ", ".join(f"§{n} {titles.get(n, '')}" for n in m.sections)
        out.append(style.cyan(visible(f"┌ {m.id} · {m.role}")[:width]))
        if drawn:
            out += [style.dim(f"│ → {line}") for line in _wrapped(drawn, width - 4, True)]
        out += [f"│ {line}" for line in _wrapped(m.text, width - 2, full)]
    return out


def _replacement(view: CompactionView, width: int, style: Style, full: bool) -> list[str]:
    c = view.event.compaction
    out = [style.green(style.bold(f"INSTEAD ({len(c.replacement)} messages)"))]
    for role, text in view.carried:
        out.append(style.cyan(visible(f"┌ {role} (carried verbatim)")[:width]))
        out += [f"│ {line}" for line in _wrapped(text, width - 2, full)]
    out.append(style.cyan(f"┌ the summary ({c.summary.source}, {c.summary.tokens:,} tokens)"))
    for s in view.sections:
        out.append(style.bold(visible(f"│ §{s.number} {s.title or '(intro)'}")[:width]))
        if s.source_ids:
            more = f" and {s.omitted_ids} more" if s.omitted_ids else ""
            sources = "from " + ", ".join(s.source_ids) + more
            out += [style.dim(f"│ ← {line}") for line in _wrapped(sources, width - 4, True)]
        out += [f"│ {line}" for line in _wrapped(s.text, width - 2, full)]
    return out


def _fidelity(view: CompactionView, style: Style) -> list[str]:
    f = view.fidelity
    if f is None:
        return [style.bold("FIDELITY") + " not checked (an event from before the checks)"]
    dropped = ", ".join(f"{k} {v}" for k, v in sorted(f.dropped.items())) or "none"
    line = [
        style.bold("FIDELITY") + f" {f.checked} facts checked, {f.kept} kept, {f.repaired} "
        f"repaired, dropped: {dropped} (score {f.score:.2f})"
    ]
    if view.redactions is not None:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(view.redactions.items())) or "none"
        line.append(style.bold("REDACTED") + f" {counts}")
    return line


def _dropped(view: CompactionView, width: int, style: Style) -> list[str]:
    if not view.dropped:
        return [style.bold("DROPPED") + " nothing outright"]
    out = [style.bold("DROPPED")]
    for d in view.dropped:
        what = " ".join(
            str(x)
            for x in (d.message_id, d.kind, d.tool, d.call_id or d.attachment)
            if x is not None
        )
        size = f", {d.bytes:,} bytes" if d.bytes is not None else ""
        out.append(visible(f"  {what}{size}")[:width])
    return out
