"""The inspector's pages as HTML: pure functions from the data of :mod:`worker.api.conversations`
and :mod:`worker.core.inspection` to text.

Every value is escaped (:func:`esc`) where it enters the markup; nothing else is ever inserted.
No inline script or style (the Content-Security-Policy allows neither): the chart is SVG with
classes, styled by ``static/inspector.css``. Readable without JavaScript; ``static/inspector.js``
only adds the live updates. Never rendered: an API key, a session id, an internal conversation
id or where a transcript is stored.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import quote

from worker.api.conversations import ConversationRow, Page
from worker.api.review import Preview
from worker.core.cost import usd
from worker.core.inspection import CompactionView, Point, Section, Timeline
from worker.wire.events import Cost

UI = "/ui"


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def path_part(value: str) -> str:
    """A value inside a URL path segment (every reserved character percent-encoded)."""
    return quote(value, safe="")


def conversation_url(conversation_id: str) -> str:
    return f"{UI}/conversations/{path_part(conversation_id)}"


def compaction_url(conversation_id: str, event_id: str) -> str:
    return f"{conversation_url(conversation_id)}/compactions/{path_part(event_id)}"


def message_anchor(message_id: str) -> str:
    """The id attribute of a replaced message; ``#`` + :func:`path_part` of it links there."""
    return f"m-{message_id}"


def _tokens(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


@dataclass(frozen=True)
class Frame:
    """What every page of a logged-in tenant carries: who, and the CSRF token of its forms."""

    tenant: str
    csrf: str
    notice: str | None = None


def layout(
    title: str, body: str, frame: Frame | None, *, crumbs: Sequence[tuple[str, str]] = ()
) -> str:
    trail = "".join(f'<li><a href="{esc(href)}">{esc(text)}</a></li>' for href, text in crumbs)
    account = ""
    if frame is not None:
        account = (
            f'<p class="who">Tenant <strong>{esc(frame.tenant)}</strong></p>'
            f'<form method="post" action="{UI}/logout" class="logout">{csrf_field(frame)}'
            '<button type="submit">Log out</button></form>'
        )
    notice = ""
    if frame is not None and frame.notice:
        notice = f'<p class="notice" role="status">{esc(frame.notice)}</p>'
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · compactor</title>"
        '<link rel="icon" href="data:,">'
        f'<link rel="stylesheet" href="{UI}/static/inspector.css">'
        f'<script src="{UI}/static/inspector.js" defer></script>'
        "</head><body>"
        '<a class="skip" href="#main">Skip to content</a>'
        f'<header><nav aria-label="Breadcrumb"><ol><li><a href="{UI}/conversations">'
        f"Conversations</a></li>{trail}</ol></nav>{account}</header>"
        f'<main id="main" tabindex="-1"><h1>{esc(title)}</h1>{notice}{body}</main>'
        "</body></html>\n"
    )


def csrf_field(frame: Frame) -> str:
    return f'<input type="hidden" name="csrf" value="{esc(frame.csrf)}">'


def login_page(token: str, *, error: str | None = None, next_path: str = "") -> str:
    problem = f'<p class="error" role="alert">{esc(error)}</p>' if error else ""
    body = (
        f"{problem}<p>Sign in with the API key of your tenant. The key is checked once and "
        "never kept in the page, a URL or the browser: a session cookie is.</p>"
        f'<form method="post" action="{UI}/login" class="login">'
        f'<input type="hidden" name="login_token" value="{esc(token)}">'
        f'<input type="hidden" name="next" value="{esc(next_path)}">'
        '<label for="key">API key</label>'
        '<input id="key" name="key" type="password" autocomplete="off" required '
        'spellcheck="false" autofocus>'
        '<button type="submit">Sign in</button></form>'
    )
    return layout("Sign in", body, None)


def error_page(status: int, message: str, frame: Frame | None) -> str:
    body = (
        f'<p class="error" role="alert">{esc(message)}</p>'
        f'<p><a href="{UI}/conversations">Back to the conversations</a></p>'
    )
    return layout(f"{status}", body, frame)


# --- the conversations -----------------------------------------------------------------------


def conversations_page(page: Page, frame: Frame, *, now: float | None = None) -> str:
    """The tenant's conversations; ``now`` (seconds since the epoch) says how long ago each
    was active (None: the date alone)."""
    if not page.rows:
        rows = f'<tr><td colspan="7">{_no_conversations(frame.tenant)}</td></tr>'
    else:
        rows = "".join(_conversation_row(r, now) for r in page.rows)
    more = ""
    if page.next:
        href = f"{UI}/conversations?after={quote(page.next, safe='')}"
        more = f'<p><a rel="next" href="{esc(href)}">Older conversations</a></p>'
    body = (
        "<p>Newest activity first: how many compactions each conversation's next request "
        "carries and the tokens they save it, its size after the newest outcome, and that "
        "outcome.</p>"
        '<div class="table-wrap"><table class="conversations"><caption>Conversations</caption>'
        '<thead><tr><th scope="col">Conversation</th><th scope="col">Last activity</th>'
        '<th scope="col" class="num">Compactions</th><th scope="col" class="num">Tokens saved'
        '</th><th scope="col">Tokens / threshold</th><th scope="col">Last outcome</th>'
        '<th scope="col" class="num">Events</th></tr></thead>'
        f"<tbody>{rows}</tbody></table></div>{more}"
    )
    return layout("Conversations", body, frame)


def _no_conversations(tenant: str) -> str:
    """The empty list's text: where conversations come from, and the id prefix that puts one
    submitted from Python here (docs/inspector.md, "The conversation index")."""
    example = f"{tenant}:my-agent-1"
    return (
        '<div class="empty"><p>No conversations yet (or none active lately).</p>'
        "<p>A conversation is listed here once it is submitted through this server (the "
        "<code>/v1</code> API or the proxy) with this tenant's key. One submitted from Python "
        "(<code>worker.client.Client</code>, <code>CompactingSession</code>) straight to Redis "
        "is listed only when its id starts with this tenant's name and a colon: "
        f"<code>{esc(example)}</code> is listed as <code>my-agent-1</code>; an id without that "
        "prefix belongs to no tenant, and no page shows it.</p></div>"
    )


def readable_time(seconds: float, now: float | None) -> str:
    """A moment for people, as markup: the UTC date and minute (the ``<time>`` element's
    ``datetime`` exact), and how long before ``now`` it was."""
    moment = datetime.fromtimestamp(seconds, UTC)
    iso = moment.isoformat(timespec="seconds")
    shown = f'<time datetime="{esc(iso)}" class="when">{moment:%Y-%m-%d %H:%M} UTC</time>'
    return shown if now is None else f'{shown} <span class="ago">· {_ago(now - seconds)}</span>'


def _ago(seconds: float) -> str:
    if seconds < 60:
        return "just now"
    for size, unit in ((86_400, "day"), (3_600, "hour"), (60, "minute")):
        if seconds >= size:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''} ago"
    return "just now"


def _conversation_row(row: ConversationRow, now: float | None) -> str:
    outcome = row.outcome
    said = "—"
    if outcome is not None:
        reason = f": {outcome['reason']}" if outcome.get("reason") else ""
        said = f"{outcome.get('type')} (revision {outcome.get('revision')}){reason}"
    cid = row.conversation_id
    return (
        f'<tr><th scope="row"><a href="{esc(conversation_url(cid))}">{esc(cid)}</a></th>'
        f"<td>{readable_time(row.last_activity, now)}</td>"
        f'<td class="num">{row.compactions:,}</td>'
        f'<td class="num">{_saved(row)}</td>'
        f"<td>{_tokens(row.tokens)} / {_tokens(row.threshold)}</td>"
        f'<td>{esc(said)}</td><td class="num">{row.events:,}</td></tr>'
    )


def _saved(row: ConversationRow) -> str:
    if not row.compactions:
        return "—"
    # Only the newest compactions' savings are kept together (ConversationRow.tokens_saved).
    bound = "at least " if row.compactions > row.saved_over else ""
    return f"{bound}{row.tokens_saved:,}"


# --- one conversation ---------------------------------------------------------------------------


# Which events the timeline's table lists: every one, or the compactions and what became of
# them (made, held, decided, restored, failed) without the skips that bury them.
Show = Literal["all", "compactions"]
SHOWS: tuple[Show, ...] = ("all", "compactions")
COMPACTION_TYPES = frozenset(
    {
        "compaction.completed",
        "compaction.proposed",
        "compaction.declined",
        "compaction.reverted",
        "compaction.failed",
    }
)


def shown(points: Sequence[Point], show: Show) -> list[Point]:
    return [p for p in points if show == "all" or p.type in COMPACTION_TYPES]


def timeline_page(conversation_id: str, line: Timeline, frame: Frame, show: Show = "all") -> str:
    last = line.points[-1].stream_id if line.points else "0"
    events_url = f"{conversation_url(conversation_id)}/events"
    rows = shown(line.points, show)
    listed = "".join(_event_row(conversation_id, p, line, frame) for p in rows)
    if not rows:
        listed = (
            '<tr><td colspan="6">No compaction yet: every event so far is a skip (the '
            "request stayed under its threshold). All events lists them.</td></tr>"
        )
    body = (
        f"{chart(line)}{_proposals(conversation_id, line, frame)}"
        f'<h2 id="events-heading">Events</h2>{_filter(conversation_id, line, show)}'
        f'<p id="live" class="live" aria-live="polite" data-events="{esc(events_url)}" '
        f'data-after="{esc(last)}" data-show="{esc(show)}" data-types="{esc(_types(show))}">'
        "</p>"
        '<div class="table-wrap"><table class="events" id="events" '
        'aria-labelledby="events-heading"><thead><tr><th scope="col">Revision</th>'
        '<th scope="col">Event</th><th scope="col">Tokens before → after</th>'
        '<th scope="col">Threshold</th><th scope="col">What happened</th>'
        f'<th scope="col">Actions</th></tr></thead><tbody>{listed}</tbody></table></div>'
    )
    return layout(conversation_id, body, frame)


def _types(show: Show) -> str:
    """The event types the table lists, for the page's script ('': every type)."""
    return "" if show == "all" else " ".join(sorted(COMPACTION_TYPES))


def _filter(conversation_id: str, line: Timeline, show: Show) -> str:
    """Links to the table's two views, each with how many events it lists (no script)."""
    base = conversation_url(conversation_id)
    counts = {s: len(shown(line.points, s)) for s in SHOWS}
    labels = {"compactions": "Compactions only", "all": "All events"}
    links = []
    for option in ("compactions", "all"):
        href = f"{base}?show={option}"
        current = ' aria-current="page"' if option == show else ""
        links.append(
            f'<li><a href="{esc(href)}"{current}>{labels[option]} '
            f'<span class="count">({counts[option]:,})</span></a></li>'
        )
    return f'<nav class="filter" aria-label="Which events to list"><ul>{"".join(links)}</ul></nav>'


def event_name(kind: str) -> str:
    """An event type that a narrow column may break after a dot, never inside a word (each
    word its own box: inspector.css)."""
    parts = kind.split(".")
    words = [f"{part}." for part in parts[:-1]] + parts[-1:]
    inner = "".join(f'<span class="word">{esc(w)}</span>' for w in words)
    return f'<span class="event-name">{inner}</span>'


def _event_row(conversation_id: str, p: Point, line: Timeline, frame: Frame) -> str:
    kind = event_name(p.type) + (' <span class="tag">restored</span>' if p.reverted else "")
    actions = ""
    if p.type == "compaction.completed":
        actions = f'<a href="{esc(compaction_url(conversation_id, p.event_id))}">Inspect</a>'
        if p.event_id == line.newest_completed:
            actions += restore_form(conversation_id, p.event_id, frame)
    elif p.type == "compaction.proposed":
        actions = f'<a href="{esc(compaction_url(conversation_id, p.event_id))}">Review</a>'
    tokens = f"{_tokens(p.before)} → {_tokens(p.after)}" if p.before is not None else "—"
    return (
        f'<tr id="e-{esc(p.stream_id)}" class="t-{esc(p.type.replace(".", "-"))}">'
        f"<td>{esc(p.revision)}</td><td>{kind}</td><td>{tokens}</td>"
        f"<td>{_tokens(p.threshold)}</td><td>{esc(p.note)}</td><td>{actions}</td></tr>"
    )


def restore_form(conversation_id: str, event_id: str, frame: Frame) -> str:
    action = f"{compaction_url(conversation_id, event_id)}/restore"
    label = f"reason-{esc(event_id)}"
    return (
        f'<form method="post" action="{esc(action)}" class="restore">{csrf_field(frame)}'
        f'<label for="{label}" class="visually-hidden">Why restore it (optional)</label>'
        f'<input id="{label}" name="reason" maxlength="1000" placeholder="why (optional)">'
        '<button type="submit">Restore (undo)</button></form>'
    )


@dataclass(frozen=True)
class Review:
    """A held compaction's decision as its page shows it: the editor's ``text``, and what
    approving it would publish (``preview``) or why it could not be (``problem``)."""

    text: str
    preview: Preview | None
    problem: str | None = None


def edit_figures(preview: Preview) -> str:
    """What an edit (or the proposal, unedited) weighs: its tokens, counted as the approval
    counts them, and the next request's size and cost with it."""
    c = preview.cost
    request = f"{preview.tokens_before:,} → {preview.tokens_after:,} tokens"
    if not preview.edited:
        return (
            f"The proposed summary: {preview.proposed_tokens:,} tokens. With it, the next "
            f"request holds {request}; {cost_line(c)}."
        )
    fidelity = preview.summary.fidelity
    repaired = fidelity.repaired if fidelity is not None else 0
    facts = (
        f", with the {repaired} must-keep fact{'s' if repaired != 1 else ''} it lacked added "
        "under Kept facts"
        if repaired
        else ""
    )
    return (
        f"Your edit: {preview.summary.tokens:,} tokens (the proposal: "
        f"{preview.proposed_tokens:,}){facts}. With it, the next request holds about {request}; "
        f"{cost_line(c)}."
    )


def review_form(conversation_id: str, event_id: str, review: Review, frame: Frame) -> str:
    """A held compaction's decision on its own page: approve, with its summary editable (left
    as it is, it is approved as proposed) and counted again as it is edited (by the page's
    script as you type, or with "Count the edit"), or reject with a reason."""
    base = f"{conversation_url(conversation_id)}/proposals/{path_part(event_id)}"
    if review.problem is not None:
        figures = f"This edit cannot be approved: {review.problem}"
    else:
        figures = edit_figures(review.preview) if review.preview is not None else ""
    state = " error" if review.problem is not None else ""
    return (
        '<section class="review" aria-labelledby="review-heading">'
        '<h2 id="review-heading">Held for review</h2>'
        f'<form method="post" action="{esc(base)}/approve" class="edit">{csrf_field(frame)}'
        '<label for="summary-edit">Summary (edit it to approve your version; its must-keep '
        "facts are checked again, and its tokens and cost counted again as you type)</label>"
        f'<textarea id="summary-edit" name="summary" rows="14" spellcheck="false" '
        f'data-preview="{esc(base)}/preview">{esc(review.text)}</textarea>'
        f'<p id="edit-figures" class="figures{state}" role="status">{esc(figures)}</p>'
        '<div class="buttons"><button type="submit">Approve</button>'
        f'<button type="submit" class="secondary" formaction="{esc(base)}/preview">'
        "Count the edit</button></div></form>"
        f'<form method="post" action="{esc(base)}/reject" class="decide">{csrf_field(frame)}'
        '<label for="why-reject">Why reject it (optional)</label>'
        '<input id="why-reject" name="reason" maxlength="1000">'
        '<button type="submit">Reject</button></form></section>'
    )


def _proposals(conversation_id: str, line: Timeline, frame: Frame) -> str:
    """Held compactions waiting for a decision (review before apply), when there are any."""
    if not line.proposed:
        return ""
    items = []
    for p in line.proposed:
        base = f"{conversation_url(conversation_id)}/proposals/{path_part(p.event_id)}"
        items.append(
            f'<li><a href="{esc(compaction_url(conversation_id, p.event_id))}">Revision '
            f"{esc(p.revision)}</a>: {esc(p.note)}"
            f'<form method="post" action="{esc(base)}/approve" class="decide">'
            f'{csrf_field(frame)}<button type="submit">Approve</button></form>'
            f'<form method="post" action="{esc(base)}/reject" class="decide">'
            f'{csrf_field(frame)}<label for="why-{esc(p.event_id)}" class="visually-hidden">'
            f'Why reject it</label><input id="why-{esc(p.event_id)}" name="reason" '
            'maxlength="1000" placeholder="why (optional)">'
            '<button type="submit">Reject</button></form></li>'
        )
    return f'<h2>Held for review</h2><ul class="proposals">{"".join(items)}</ul>'


# --- the chart -----------------------------------------------------------------------------------

# The chart's coordinates (SVG user units). It takes the page's width (inspector.css), so a
# unit is about a pixel on a wide screen; a narrow one scrolls it sideways in its figure.
_W, _H, _PAD_R, _PAD_T, _PAD_B = 960, 300, 16, 16, 40
_FONT = 12  # the ticks' font size (inspector.css)
_DIGIT_W = 7.5  # the widest a digit or comma of it is drawn, and then some
_TICK_GAP = 14  # the least room between two revision labels
_SHAPES = {
    "compaction.completed": "completed",
    "compaction.skipped": "skipped",
    "compaction.failed": "failed",
    "compaction.rejected": "rejected",
}


@dataclass(frozen=True)
class _Frame:
    """Where a chart's points go: revision ``k`` of ``count`` at :meth:`x`, ``tokens`` at
    :meth:`y`, under ``top`` tokens, right of a margin as wide as the widest token label."""

    count: int
    top: int
    left: float

    @property
    def width(self) -> float:
        return _W - self.left - _PAD_R

    @property
    def height(self) -> float:
        return _H - _PAD_T - _PAD_B

    @property
    def step(self) -> float:
        return self.width / max(self.count - 1, 1)

    def x(self, k: int) -> float:
        return self.left + (k * self.step if self.count > 1 else self.width / 2)

    def y(self, tokens: int) -> float:
        return _PAD_T + self.height - tokens / self.top * self.height


def _label_width(text: str) -> float:
    return len(text) * _DIGIT_W


def chart(line: Timeline) -> str:
    """Tokens before and after each outcome, the threshold, and a marker per outcome whose
    ``<title>`` says what happened (the events table below says the same in text)."""
    points = [p for p in line.outcomes if p.before is not None]
    if not points:
        return '<p class="empty-chart">No counted outcome yet: nothing to chart.</p>'
    top = max([*(p.before or 0 for p in points), *(p.threshold or 0 for p in points), 1])
    top = int(top * 1.1) + 1
    left = max(56.0, _label_width(f"{top:,}") + 14)
    f = _Frame(len(points), top, left)
    before = " ".join(f"{f.x(k):.1f},{f.y(p.before or 0):.1f}" for k, p in enumerate(points))
    after = " ".join(f"{f.x(k):.1f},{f.y(p.after or 0):.1f}" for k, p in enumerate(points))
    parts = [
        f'<svg class="chart" viewBox="0 0 {_W} {_H}" role="img" '
        'aria-labelledby="chart-title chart-desc" preserveAspectRatio="xMidYMid meet">'
        '<title id="chart-title">Tokens of the request per revision</title>'
        '<desc id="chart-desc">Tokens before and after each outcome, and the threshold; '
        "the events table lists the same.</desc>",
        _axes(f),
        _threshold_line(points, f),
        f'<polyline class="before" points="{before}"/>',
        f'<polyline class="after" points="{after}"/>',
    ]
    for k, p in enumerate(points):
        parts.append(_marker(p, f.x(k), f.y(p.before or 0), f.y(p.after or 0)))
    for k in revision_labels([p.revision for p in points], f.step):
        parts.append(
            f'<text class="tick x" x="{f.x(k):.1f}" y="{_PAD_T + f.height + 16:.1f}" '
            f'text-anchor="middle">{esc(points[k].revision)}</text>'
        )
    parts.append(
        f'<text class="axis-label" x="{f.left + f.width / 2:.0f}" y="{_H - 4}" '
        'text-anchor="middle">revision</text></svg>'
    )
    legend = (
        '<ul class="legend"><li><span class="key before"></span>tokens before</li>'
        '<li><span class="key after"></span>after</li>'
        '<li><span class="key threshold"></span>threshold</li>'
        '<li><span class="key completed"></span>compaction</li>'
        '<li><span class="key skipped"></span>skip</li></ul>'
    )
    return (
        f'<figure class="chart-figure"><div class="chart-scroll">{"".join(parts)}</div>'
        f"<figcaption>{legend}</figcaption></figure>"
    )


def revision_labels(revisions: Sequence[int], step: float) -> list[int]:
    """The indexes of the revisions to label under the chart, ``step`` units apart: evenly
    spaced, each label clear of the next by :data:`_TICK_GAP` at its widest, the first
    always and the last in place of the one before it when the two would touch."""
    if not revisions:
        return []
    widest = max(_label_width(str(r)) for r in revisions) + _TICK_GAP
    every = max(1, math.ceil(widest / step)) if step > 0 else len(revisions)
    picked = list(range(0, len(revisions), every))
    last = len(revisions) - 1
    if picked[-1] != last:
        if (last - picked[-1]) * step < widest and len(picked) > 1:
            picked.pop()
        if not picked or (last - picked[-1]) * step >= widest:
            picked.append(last)
    return picked


def _axes(f: _Frame) -> str:
    ticks = []
    for k in range(5):
        value = f.top * k // 4
        ty = f.y(value)
        ticks.append(
            f'<line class="grid" x1="{f.left:.1f}" x2="{_W - _PAD_R}" y1="{ty:.1f}" '
            f'y2="{ty:.1f}"/><text class="tick y" x="{f.left - 6:.1f}" y="{ty + 4:.1f}" '
            f'text-anchor="end">{value:,}</text>'
        )
    return "".join(ticks)


def _threshold_line(points: Sequence[Point], f: _Frame) -> str:
    known = [(k, p.threshold) for k, p in enumerate(points) if p.threshold is not None]
    if not known:
        return ""
    coords = []
    for k, value in known:  # a step line: the threshold may change with the window
        coords.append(f"{f.x(k) - 0.5:.1f},{f.y(value):.1f}")
        coords.append(f"{f.x(k) + 0.5:.1f},{f.y(value):.1f}")
    if len(known) == 1:
        value = known[0][1]
        coords = [f"{f.left:.1f},{f.y(value):.1f}", f"{_W - _PAD_R},{f.y(value):.1f}"]
    return f'<polyline class="threshold" points="{" ".join(coords)}"/>'


def _marker(p: Point, x: float, y_before: float, y_after: float) -> str:
    kind = _SHAPES.get(p.type, "other")
    what = f"revision {p.revision}: {p.type}"
    if p.type == "compaction.completed":
        what += f", {_tokens(p.before)} → {_tokens(p.after)} tokens"
        if p.reverted:
            what += " (restored since)"
    elif p.note:
        what += f" — {p.note}"
    title = f"<title>{esc(what)}</title>"
    if kind == "completed":
        restored = " restored" if p.reverted else ""
        return (
            f'<g class="marker completed{restored}"><line x1="{x:.1f}" x2="{x:.1f}" '
            f'y1="{y_before:.1f}" y2="{y_after:.1f}"/>'
            f'<circle cx="{x:.1f}" cy="{y_before:.1f}" r="5">{title}</circle></g>'
        )
    return (
        f'<g class="marker {kind}"><rect x="{x - 4:.1f}" y="{y_before - 4:.1f}" width="8" '
        f'height="8">{title}</rect></g>'
    )


# --- one compaction -------------------------------------------------------------------------------


def cost_line(cost: Cost | None) -> str:
    """The ``cost`` object in a line (docs/cost.md): money where priced, tokens always."""
    if cost is None:
        return "not recorded (an event of an earlier version)"
    saved = f"{cost.saved_tokens_per_turn:,} tokens saved per later turn"
    if not cost.priced:
        return f"{saved}; {cost.note or 'no prices'}"
    even = "never" if cost.break_even_turns is None else f"{cost.break_even_turns} turns"
    line = (
        f"{saved} ({_usd(cost.saving_per_turn_usd)}); spent {_usd(cost.summary_usd)} summary, "
        f"{_usd(cost.cache_write_usd)} cache write; breaks even in {even}; expected net "
        f"{_usd(cost.expected_net_usd)} over {cost.horizon_turns} turns"
    )
    if cost.estimated_net_usd is not None:
        line += f" (estimated {_usd(cost.estimated_net_usd)} when the cost policy decided)"
    return line


def _usd(amount: float | None) -> str:
    return "unknown" if amount is None else usd(amount)


def compaction_page(
    conversation_id: str,
    view: CompactionView,
    line: Timeline,
    frame: Frame,
    review: Review | None = None,
) -> str:
    """One compaction beside what it replaced; a held one with its decision (``review``: an
    edit being counted; else its proposed summary, as proposed)."""
    event, c = view.event, view.event.compaction
    reverted = any(p.reverted and p.event_id == event.event_id for p in line.points)
    facts = [
        ("Revision", str(event.revision)),
        ("Tokens", f"{c.tokens_before:,} → {c.tokens_after:,}"),
        ("Replaced", f"{c.end - c.start} messages, {c.first_id} … {c.last_id}"),
        (
            "Replaced by",
            f"{len(c.replacement)} messages ({len(view.carried)} carried, the summary)",
        ),
        (
            "Summary",
            f"{c.summary.source}, {c.summary.tokens:,} tokens"
            + (f"; fell back: {c.summary.fallback_reason}" if c.summary.fallback_reason else ""),
        ),
        ("Cost", cost_line(event.cost)),
    ]
    status = ""
    if reverted:
        status = '<p class="notice">This compaction was restored (undone).</p>'
    elif event.event_id == line.newest_completed:
        status = restore_form(conversation_id, event.event_id, frame)
    elif any(p.event_id == event.event_id for p in line.proposed):
        proposal = Review(c.summary.text, Preview.of(c, event.cost, None))
        status = review_form(conversation_id, event.event_id, review or proposal, frame)
    body = (
        '<dl class="facts">'
        + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts)
        + f"</dl>{status}"
        + '<div class="sides">'
        + _replaced_side(conversation_id, view)
        + _replacement_side(view)
        + "</div>"
        + _fidelity(view)
        + _dropped(view)
        + _redactions(view)
    )
    crumbs = [(conversation_url(conversation_id), conversation_id)]
    return layout(f"Compaction of revision {event.revision}", body, frame, crumbs=crumbs)


def _replaced_side(conversation_id: str, view: CompactionView) -> str:
    if not view.replaced:
        why = view.transcript_problem or "the transcript holds no replaced message"
        inner = f'<p class="error">The replaced messages cannot be shown: {esc(why)}.</p>'
    else:
        inner = "".join(_replaced_message(conversation_id, m, view.sections) for m in view.replaced)
    return (
        '<section class="side replaced" aria-labelledby="replaced-heading">'
        f'<h2 id="replaced-heading">Replaced ({len(view.replaced)} messages)</h2>{inner}</section>'
    )


def _replaced_message(conversation_id: str, m: Any, sections: Sequence[Section]) -> str:
    titles = {s.number: s.title or "(before the first heading)" for s in sections}
    drawn = ", ".join(f'<a href="#s-{n}">§{n} {esc(titles.get(n, ""))}</a>' for n in m.sections)
    recall = f"{conversation_url(conversation_id)}/messages/{path_part(m.id)}"
    return (
        f'<article class="message" id="{esc(message_anchor(m.id))}" tabindex="-1">'
        f'<h3><span class="role">{esc(m.role)}</span> <code>{esc(m.id)}</code></h3>'
        f"<pre>{esc(m.text)}</pre>"
        f'<p class="drawn">{"Drawn into: " + drawn if drawn else "In no summary section."} '
        f'<a class="recall" href="{esc(recall)}">Recall</a></p></article>'
    )


def _replacement_side(view: CompactionView) -> str:
    carried = "".join(
        f'<article class="message carried"><h3><span class="role">{esc(role)}</span> '
        f"(carried verbatim)</h3><pre>{esc(text)}</pre></article>"
        for role, text in view.carried
    )
    sections = "".join(_section(s) for s in view.sections)
    return (
        '<section class="side replacement" aria-labelledby="replacement-heading">'
        '<h2 id="replacement-heading">What the next request holds instead</h2>'
        f'{carried}<div class="summary"><h3>The summary</h3>{sections}</div></section>'
    )


def _section(s: Section) -> str:
    sources = ", ".join(
        f'<a href="#{esc(path_part(message_anchor(mid)))}">{esc(mid)}</a>' for mid in s.source_ids
    )
    more = f" and {s.omitted_ids} more" if s.omitted_ids else ""
    title = s.title or "(before the first heading)"
    drawn = f"Drawn from: {sources}{more}" if sources else "Drawn from no listed message."
    return (
        f'<section class="summary-section" id="s-{s.number}" aria-labelledby="s-{s.number}-h">'
        f'<h4 id="s-{s.number}-h">§{s.number} {esc(title)}</h4>'
        f'<p class="sources">{drawn}</p><pre>{esc(s.text)}</pre></section>'
    )


def _fidelity(view: CompactionView) -> str:
    f = view.fidelity
    if f is None:
        return "<h2>Fidelity</h2><p>This event predates fidelity checks.</p>"
    dropped = ", ".join(f"{k}: {v}" for k, v in sorted(f.dropped.items())) or "none"
    rows = [
        ("Facts checked", f.checked),
        ("Kept as written", f.kept),
        ("Repaired (added to Kept facts)", f.repaired),
        ("Dropped (did not fit), by kind", dropped),
        ("Score (kept / checked before repair)", f"{f.score:.2f}"),
    ]
    return (
        '<h2 id="fidelity">Fidelity</h2><div class="table-wrap"><table class="fidelity">'
        + "".join(f'<tr><th scope="row">{esc(k)}</th><td>{esc(v)}</td></tr>' for k, v in rows)
        + "</table></div>"
    )


def _dropped(view: CompactionView) -> str:
    if not view.dropped:
        return '<h2 id="dropped">Dropped outright</h2><p>Nothing.</p>'
    rows = "".join(
        f'<tr><td><a href="#{esc(path_part(message_anchor(d.message_id)))}">'
        f"{esc(d.message_id)}</a></td><td>{esc(d.kind)}</td><td>{esc(d.tool or '')}</td>"
        f"<td>{esc(d.call_id or d.attachment or '')}</td>"
        f"<td>{'' if d.bytes is None else f'{d.bytes:,}'}</td></tr>"
        for d in view.dropped
    )
    return (
        '<h2 id="dropped">Dropped outright</h2><div class="table-wrap"><table class="dropped">'
        '<thead><tr><th scope="col">Message</th><th scope="col">What</th>'
        '<th scope="col">Tool</th><th scope="col">Call or attachment</th>'
        f'<th scope="col">Bytes</th></tr></thead><tbody>{rows}</tbody></table></div>'
    )


def _redactions(view: CompactionView) -> str:
    if view.redactions is None:
        return ""
    rows = (
        "".join(
            f'<tr><th scope="row">{esc(k)}</th><td>{v:,}</td></tr>'
            for k, v in sorted(view.redactions.items())
        )
        or '<tr><td colspan="2">None.</td></tr>'
    )
    return (
        '<h2 id="redactions">Redactions</h2><div class="table-wrap"><table class="redactions">'
        f"{rows}</table></div>"
    )


# --- recall -----------------------------------------------------------------------------------


def recall_page(conversation_id: str, found: dict[str, Any], frame: Frame) -> str:
    message_id = str(found["message_id"])
    api = f"/v1/conversations/{path_part(conversation_id)}/messages/{path_part(message_id)}"
    back = compaction_url(conversation_id, str(found["event_id"]))
    body = (
        f"<p>The original of <code>{esc(message_id)}</code>, as the transcript of the compaction "
        f"of revision {esc(found['revision'])} keeps it (sha256-checked). "
        f'<a href="{esc(back)}#{esc(path_part(message_anchor(message_id)))}">Back to the '
        "compaction</a>.</p>"
        f'<pre class="json">{esc(json.dumps(found["message"], indent=2, ensure_ascii=False))}</pre>'
        f"<p>As JSON: <code>GET {esc(api)}</code> with the API key (Bearer).</p>"
    )
    crumbs = [(conversation_url(conversation_id), conversation_id), (back, "compaction")]
    return layout(f"Message {message_id}", body, frame, crumbs=crumbs)
