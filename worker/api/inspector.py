"""The inspector: ``compactor serve``'s pages under ``/ui`` (docs/inspector.md).

Server-rendered HTML (:mod:`worker.api.pages`) over the data of the JSON API
(:mod:`worker.api.conversations`), behind the same keys and tenants as ``/v1``, without ever
putting a key in a URL or a page:

- ``POST /ui/login`` takes an API key once and answers with a session cookie (HttpOnly,
  SameSite=Strict, Secure over https) holding a random session id; Redis keeps
  ``cw:ui:session:{sha256(id)}`` -> the tenant, the CSRF token of its forms and the sha256 of
  the key (so a key removed from the configuration ends its sessions), for
  :data:`SESSION_TTL_S`. ``POST /ui/logout`` deletes it.
- Every POST checks the session's CSRF token (a hidden form field) and, when the browser sends
  one, the ``Origin``; the login form has a token of its own in a cookie (double submit).
- Pages carry a strict Content-Security-Policy (self only, no inline script or style) and are
  never cached.

A conversation of another tenant is answered 404, like one that does not exist.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import posixpath
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from worker.api import pages
from worker.api.auth import Tenant
from worker.api.common import (
    NOT_FOUND,
    ApiError,
    after_param,
    aredis_errors,
    int_param,
    known_id,
)
from worker.api.conversations import (
    EVENT_ID,
    MAX_PAGE,
    MAX_REASON,
    approve,
    compaction_page,
    conversation_timeline,
    conversations_page,
    cursor_param,
    decline,
    restore,
)
from worker.api.review import MAX_EDIT_CHARS, Preview
from worker.api.sse import sse_response
from worker.api.state import Api, api_of
from worker.backend import keys
from worker.errors import (
    CompactorError,
    EventMismatch,
    InvalidRequest,
    RedisUnavailable,
    StorageError,
)
from worker.wire.requests import user_text

log = logging.getLogger(__name__)

SESSION_TTL_S = 8 * 3600
COOKIE = "cw_ui"
SECURE_COOKIE = "__Host-cw_ui"  # over https: bound to this host, Secure, Path=/
LOGIN_COOKIE = "cw_ui_login"
MAX_FORM_BYTES = 16_384
# A form carrying an edited summary: MAX_EDIT_CHARS characters, each percent-encoded at most
# 12 bytes (%XX for each of 4 UTF-8 bytes), and the other fields.
MAX_EDIT_FORM_BYTES = 12 * MAX_EDIT_CHARS + MAX_FORM_BYTES
MAX_FORM_FIELDS = 32  # the most fields a form may have (every form of the inspector has a few)
_FIELD_NAME = re.compile(r"[a-z_]{1,32}")
# Who decided a held compaction from these pages (events' approved_by / declined_by).
DECIDED_BY = "inspector"
STATIC = {"inspector.css": "text/css", "inspector.js": "text/javascript"}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class Session:
    """A logged-in browser: its tenant and the CSRF token of its forms."""

    digest: str  # sha256 of the session id: the Redis key's name
    tenant: Tenant
    csrf: str

    def frame(self, notice: str | None = None) -> pages.Frame:
        return pages.Frame(tenant=self.tenant.name, csrf=self.csrf, notice=notice)


class LoginRequired(Exception):
    """No valid session: the browser is sent to the login form."""


# --- responses ---------------------------------------------------------------------------------


def html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers=HEADERS)


def _see(location: str) -> RedirectResponse:
    return RedirectResponse(location, status_code=303, headers=HEADERS)


def wants_html(request: Request) -> bool:
    return "text/html" in request.headers.get("accept", "")


async def ui_error(request: Request, exc: ApiError) -> Response:
    """An error under /ui: a page for a browser, the JSON error for anything else."""
    if not wants_html(request):
        return Response(json.dumps(exc.body), status_code=exc.status, media_type="application/json")
    session = request.scope.get("ui_session")
    frame = session.frame() if isinstance(session, Session) else None
    message = str(exc.body.get("message") or exc.body.get("reason") or exc.body.get("error"))
    return html(pages.error_page(exc.status, message, frame), exc.status)


# --- sessions -------------------------------------------------------------------------------------


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


async def _session(api: Api, request: Request) -> Session:
    """The request's session; LoginRequired when it has none (or it ended)."""
    sid = request.cookies.get(SECURE_COOKIE) or request.cookies.get(COOKIE)
    if not sid or len(sid) > 128:
        raise LoginRequired
    digest = _digest(sid)
    with aredis_errors("reading the session"):
        stored = await api.aredis.get(keys.ui_session(digest))
    if stored is None:
        raise LoginRequired
    doc = json.loads(stored)
    tenant = Tenant(doc["tenant"])
    if not api.keys.has_digest(doc["key"], tenant):  # the key was removed since
        raise LoginRequired
    session = Session(digest=digest, tenant=tenant, csrf=doc["csrf"])
    request.scope["ui_session"] = session
    return session


async def _form(request: Request, api: Api, limit: int = MAX_FORM_BYTES) -> dict[str, str]:
    """A url-encoded form of at most ``limit`` bytes; the last value of each name. Every name
    and value is UTF-8 once percent-decoded (400 naming the field otherwise)."""
    body = await api.body(request) if request.method == "POST" else b""
    if len(body) > limit:
        raise ApiError.of(413, "invalid_request", f"the form is over {limit:,} bytes")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError.of(400, "invalid_request", "the form is not UTF-8") from None
    try:
        # surrogateescape: bytes that are not UTF-8 become lone surrogates, found below
        pairs = parse_qsl(
            text,
            keep_blank_values=True,
            max_num_fields=MAX_FORM_FIELDS,
            errors="surrogateescape",
        )
    except ValueError:  # more fields than any of our forms has
        raise ApiError.of(
            413, "invalid_request", f"the form has more than {MAX_FORM_FIELDS} fields"
        ) from None
    for name, value in pairs:
        if not _utf8(name) or not _utf8(value):
            # Named only when it is a name our forms could have: no sender's text is echoed.
            field = name if _FIELD_NAME.fullmatch(name) else "(a field name)"
            reason = "not UTF-8 once percent-decoded"
            raise ApiError(400, InvalidRequest(field, reason).to_dict())
    return dict(pairs)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _same_origin(request: Request) -> None:
    """A POST whose browser says it comes from another site is refused (CSRF, with the token)."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return  # no Origin (older browsers): the token decides
    host = request.headers.get("host", "")
    if urlsplit(origin).netloc != host:
        raise ApiError.of(403, "forbidden", "the form was posted from another site")


def _check_csrf(session: Session, form: dict[str, str]) -> None:
    if not hmac.compare_digest(form.get("csrf", "").encode(), session.csrf.encode()):
        raise ApiError.of(
            403, "forbidden", "the form is stale or not from this page (CSRF): reload it"
        )


def _next_path(raw: str | None) -> str:
    """Where to go after the login: a path of the inspector only (never another site)."""
    if raw and raw.startswith(pages.UI + "/") and "\\" not in raw:
        path, sep, query = raw.partition("?")
        # Dot segments resolved as a browser resolves them: the target stays under /ui.
        normal = posixpath.normpath(unquote(path))
        if normal.startswith(pages.UI + "/") and not normal.startswith("//"):
            return quote(normal) + sep + query
    return f"{pages.UI}/conversations"


# --- routes ---------------------------------------------------------------------------------------

Handler = Callable[[Request, Api, Session], Awaitable[Response]]


def page(
    handler: Handler, *, form_bytes: int = MAX_FORM_BYTES
) -> Callable[[Request], Awaitable[Response]]:
    """A route of a logged-in tenant: the session found (else the login form), its errors as
    pages, and every POST checked for CSRF (its form at most ``form_bytes``)."""

    async def route(request: Request) -> Response:
        api = api_of(request)
        try:
            session = await _session(api, request)
            if request.method == "POST":
                _same_origin(request)
                form = await _form(request, api, form_bytes)
                _check_csrf(session, form)
                request.scope["ui_form"] = form
            return await handler(request, api, session)
        except LoginRequired:
            if request.method != "GET" or not wants_html(request):
                return await ui_error(
                    request, ApiError.of(401, "unauthorized", "sign in at /ui/login first")
                )
            target = quote(
                request.url.path + (f"?{request.url.query}" if request.url.query else "")
            )
            return _see(f"{pages.UI}/login?next={target}")
        except ApiError as exc:
            return await ui_error(request, exc)
        except CompactorError as exc:
            return await ui_error(request, _as_api_error(exc))

    return route


def _as_api_error(exc: CompactorError) -> ApiError:
    """The answer ``/v1`` gives the same error (worker.api.app)."""
    status = 503 if isinstance(exc, RedisUnavailable | StorageError) else 500
    if isinstance(exc, EventMismatch):
        status = 409
    return ApiError.of(status, exc.code, exc.message)


def form_of(request: Request) -> dict[str, str]:
    form: dict[str, str] = request.scope.get("ui_form", {})
    return form


async def login_form(request: Request) -> Response:
    token = secrets.token_urlsafe(24)
    text = pages.login_page(token, next_path=_next_path(request.query_params.get("next")))
    response = html(text)
    _set_login_cookie(request, response, token)
    return response


def _set_login_cookie(request: Request, response: Response, token: str) -> None:
    response.set_cookie(
        LOGIN_COOKIE,
        token,
        max_age=3600,
        path=f"{pages.UI}/login",
        httponly=True,
        samesite="strict",
        secure=_secure(request),
    )


async def login(request: Request) -> Response:
    api = api_of(request)
    try:
        _same_origin(request)
        form = await _form(request, api)
    except ApiError as exc:
        return await ui_error(request, exc)
    expected = request.cookies.get(LOGIN_COOKIE, "")
    given = form.get("login_token", "")
    next_path = _next_path(form.get("next"))
    if not expected or not hmac.compare_digest(expected.encode(), given.encode()):
        return _login_again(request, "The sign-in form expired: try again.", next_path, 403)
    key = form.get("key", "")
    tenant = api.keys.tenant(key)
    if tenant is None:
        log.warning("inspector sign-in refused: not a valid API key")
        return _login_again(request, "That is not a valid API key.", next_path, 401)
    sid = secrets.token_urlsafe(32)
    record = {"tenant": tenant.name, "csrf": secrets.token_urlsafe(32), "key": _digest(key)}
    with aredis_errors("starting a session"):
        await api.aredis.set(keys.ui_session(_digest(sid)), json.dumps(record), ex=SESSION_TTL_S)
    log.info("inspector sign-in for tenant %s", tenant.name)
    response = _see(next_path)
    secure = _secure(request)
    response.set_cookie(
        SECURE_COOKIE if secure else COOKIE,
        sid,
        max_age=SESSION_TTL_S,
        path="/",
        httponly=True,
        samesite="strict",
        secure=secure,
    )
    response.delete_cookie(LOGIN_COOKIE, path=f"{pages.UI}/login")
    return response


def _login_again(request: Request, error: str, next_path: str, status: int) -> Response:
    token = secrets.token_urlsafe(24)
    response = html(pages.login_page(token, error=error, next_path=next_path), status)
    _set_login_cookie(request, response, token)
    return response


async def _logout(request: Request, api: Api, session: Session) -> Response:
    with aredis_errors("ending the session"):
        await api.aredis.delete(keys.ui_session(session.digest))
    response = _see(f"{pages.UI}/login")
    # Deleted with the attributes they were set with: a browser ignores the deletion of a
    # __Host- cookie that is not Secure.
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    response.delete_cookie(SECURE_COOKIE, path="/", secure=True, httponly=True, samesite="strict")
    return response


async def _home(request: Request, api: Api, session: Session) -> Response:
    return _see(f"{pages.UI}/conversations")


async def _conversations(request: Request, api: Api, session: Session) -> Response:
    limit = int_param(request, "limit", 50, 1, MAX_PAGE)
    page_ = await conversations_page(api, session.tenant, limit, cursor_param(request))
    return html(pages.conversations_page(page_, session.frame(), now=time.time()))


def _internal(session: Session, request: Request) -> tuple[str, str]:
    external = request.path_params["conversation_id"]
    return external, known_id(session.tenant, request)


async def _timeline(request: Request, api: Api, session: Session) -> Response:
    external, internal = _internal(session, request)
    show = _show(request)
    line = await conversation_timeline(api, session.tenant, internal)
    notice = _notice(request)
    return html(pages.timeline_page(external, line, session.frame(notice), show))


def _show(request: Request) -> pages.Show:
    raw = request.query_params.get("show", "all")
    for option in pages.SHOWS:
        if raw == option:
            return option
    raise ApiError.of(422, "invalid_request", "show: all or compactions")


def _event_id(request: Request) -> str:
    event_id: str = request.path_params["event_id"]
    if not EVENT_ID.fullmatch(event_id):
        raise ApiError.of(422, "invalid_request", "event_id: not an event id")
    return event_id


async def _compaction(request: Request, api: Api, session: Session) -> Response:
    external, internal = _internal(session, request)
    view, line = await compaction_page(api, session.tenant, internal, _event_id(request))
    frame = session.frame(_notice(request))
    return html(pages.compaction_page(external, view, line, frame))


async def _recall(request: Request, api: Api, session: Session) -> Response:
    external, internal = _internal(session, request)
    found = await api.recall(internal, request.path_params["message_id"])
    return html(pages.recall_page(external, found, session.frame()))


async def _restore(request: Request, api: Api, session: Session) -> Response:
    external, internal = _internal(session, request)
    reason = _reason(form_of(request))
    await restore(api, session.tenant, internal, _event_id(request), reason)
    return _see(f"{pages.conversation_url(external)}?done=restored")


async def _approve(request: Request, api: Api, session: Session) -> Response:
    external, internal = _internal(session, request)
    summary = _summary(form_of(request))
    event_id = _event_id(request)
    await approve(api, session.tenant, internal, event_id, summary, by=DECIDED_BY)
    return _see(f"{pages.conversation_url(external)}?done=approved")


async def _preview(request: Request, api: Api, session: Session) -> Response:
    """An edit counted as approving it would count it, nothing published: JSON for the page's
    script, the review page again (the edit kept in its editor) for a browser without one."""
    _external, internal = _internal(session, request)
    event_id = _event_id(request)
    summary = _summary(form_of(request))
    if not await api.known(internal):
        raise ApiError.of(404, "not_found", NOT_FOUND)
    try:
        preview = await api.reviewer.preview(internal, event_id, summary)
    except ApiError as exc:
        if exc.status != 422 or not wants_html(request):
            raise
        return await _review_again(request, api, session, summary or "", problem=exc)
    if not wants_html(request):
        return JSONResponse(_figures(preview), headers=HEADERS)
    return await _review_again(request, api, session, summary or "", preview=preview)


def _figures(preview: Preview) -> dict[str, object]:
    cost = preview.cost
    return {
        "text": pages.edit_figures(preview),
        "edited": preview.edited,
        "tokens": preview.summary.tokens,
        "proposed_tokens": preview.proposed_tokens,
        "tokens_before": preview.tokens_before,
        "tokens_after": preview.tokens_after,
        "saved_tokens_per_turn": None if cost is None else cost.saved_tokens_per_turn,
    }


async def _review_again(
    request: Request,
    api: Api,
    session: Session,
    text: str,
    *,
    preview: Preview | None = None,
    problem: ApiError | None = None,
) -> Response:
    external, internal = _internal(session, request)
    view, line = await compaction_page(api, session.tenant, internal, _event_id(request))
    said = None if problem is None else str(problem.body.get("message") or problem)
    review = pages.Review(text, preview, said)
    page_ = pages.compaction_page(external, view, line, session.frame(), review)
    return html(page_, 200 if problem is None else problem.status)


async def _reject(request: Request, api: Api, session: Session) -> Response:
    external, internal = _internal(session, request)
    reason = _reason(form_of(request))
    event_id = _event_id(request)
    await decline(api, session.tenant, internal, event_id, reason, by=DECIDED_BY)
    return _see(f"{pages.conversation_url(external)}?done=rejected")


def _summary(form: dict[str, str]) -> str | None:
    """The edited summary of a form: a browser sends a text area's line breaks as CRLF
    (the HTML standard), which the summary writes as LF; empty: none."""
    return form.get("summary", "").replace("\r\n", "\n") or None


def _reason(form: dict[str, str]) -> str | None:
    reason = form.get("reason", "").strip()
    if len(reason) > MAX_REASON:
        raise ApiError.of(422, "invalid_request", f"reason: at most {MAX_REASON} characters")
    try:
        return user_text("reason", reason) or None
    except InvalidRequest as exc:
        raise ApiError(422, exc.to_dict()) from None


_NOTICES = {
    "restored": "The compaction was restored: the conversation's next request holds what it "
    "had replaced.",
    "approved": "The compaction was approved.",
    "rejected": "The compaction was rejected.",
}


def _notice(request: Request) -> str | None:
    return _NOTICES.get(request.query_params.get("done", ""))


async def _events(request: Request, api: Api, session: Session) -> Response:
    """The conversation's live events for the page's script (SSE, as ``/v1``'s stream)."""
    _external, internal = _internal(session, request)
    after = after_param(request)
    if not await api.known(internal):
        raise ApiError.of(404, "not_found", NOT_FOUND)
    return sse_response(api, keys.events(internal), session.tenant, after)


async def static(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in STATIC:
        return await ui_error(request, ApiError.of(404, "not_found", "no such file"))
    data = resources.files("worker.api").joinpath("static", name).read_bytes()
    headers = HEADERS | {"Cache-Control": "no-cache"}
    return Response(data, media_type=STATIC[name], headers=headers)


def ui_routes() -> list[Route]:
    conv = f"{pages.UI}/conversations/{{conversation_id}}"
    comp = f"{conv}/compactions/{{event_id}}"
    return [
        Route(pages.UI, page(_home), methods=["GET"]),
        Route(f"{pages.UI}/login", login_form, methods=["GET"]),
        Route(f"{pages.UI}/login", login, methods=["POST"]),
        Route(f"{pages.UI}/logout", page(_logout), methods=["POST"]),
        Route(f"{pages.UI}/static/{{name}}", static, methods=["GET"]),
        Route(f"{pages.UI}/conversations", page(_conversations), methods=["GET"]),
        Route(conv, page(_timeline), methods=["GET"]),
        Route(f"{conv}/events", page(_events), methods=["GET"]),
        Route(comp, page(_compaction), methods=["GET"]),
        Route(f"{comp}/restore", page(_restore), methods=["POST"]),
        Route(f"{conv}/messages/{{message_id}}", page(_recall), methods=["GET"]),
        Route(
            f"{conv}/proposals/{{event_id}}/approve",
            page(_approve, form_bytes=MAX_EDIT_FORM_BYTES),
            methods=["POST"],
        ),
        Route(
            f"{conv}/proposals/{{event_id}}/preview",
            page(_preview, form_bytes=MAX_EDIT_FORM_BYTES),
            methods=["POST"],
        ),
        Route(f"{conv}/proposals/{{event_id}}/reject", page(_reject), methods=["POST"]),
    ]
