"""The kinds of secret: one :class:`Pattern` each, in the order they run (:data:`PATTERNS`).

Every pattern is linear in the text: it starts with a literal or where a run of its
characters starts (a lookbehind), and its variable parts are possessive or bounded, so a failed
match is never retried inside the same run (Python >= 3.11)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from worker.core.redaction.randomness import entropy

# A JSON string's escaped line break or tab ends a word too: a secret on a line of its own in a
# tool call's arguments (``"cat <<EOF\\nsshpass -p …"``).
_ESCAPED_BREAK = r"\\[nrt]"


def _run_starts_before(prefix: int) -> str:
    """Written after a literal of ``prefix`` characters: the literal starts a token, or follows
    a ``-`` (``x-sk-proj-…``, ``creds-ghp_…``), never the inside of a word (``risk-…`` is not
    ``sk-…``). After the literal, so that the regex engine still searches for it (fast)."""
    return rf"(?:(?<![A-Za-z0-9_][\s\S]{{{prefix}}})|(?<={_ESCAPED_BREAK}[\s\S]{{{prefix}}}))"


_TOKEN_START = rf"(?:(?<![A-Za-z0-9_])|(?<={_ESCAPED_BREAK}))"
_END = r"(?![A-Za-z0-9_-])"
# An optional quote, escaped or not: a secret in JSON inside a JSON string (tool arguments).
_QUOTE = r"(?:\\?[\"'])?"


@dataclass(frozen=True)
class Pattern:
    """One kind of secret. ``regex``'s group ``secret`` is what is replaced (the whole match when
    it has none, or when it took no part); ``accept`` vets a candidate (its full match) and
    ``needles`` skip the regex when none of them is in the text. A refused candidate is skipped
    from the end of its group ``name`` when it has one (else from its end)."""

    kind: str
    regex: re.Pattern[str]
    description: str
    accept: Callable[[re.Match[str]], bool] | None = None
    needles: tuple[str, ...] = ()
    folded: bool = False  # the needles are lower case, looked for in the lower-cased text
    gate: re.Pattern[str] | None = None  # then searched for where the needles were
    # What a range is searched for: the needles (one regex), or the gate's alternatives (one
    # regex each, starting with its needle: a literal start lets ``re`` skip ahead fast).
    finders: tuple[re.Pattern[str], ...] = ()


def placeholder(kind: str) -> str:
    return f"[redacted: {kind}]"


PLACEHOLDER = re.compile(r"\[redacted: [a-z0-9_]+\]")
_PLACEHOLDER_PREFIXES = ("[redacted", "$", "<", "{", "%", "*", "…", "...", "xxx", "XXX")


def _placeholder_value(value: str) -> bool:
    """A value that stands for a secret rather than being one (``$TOKEN``, ``<key>``, ``***``)."""
    return value.startswith(_PLACEHOLDER_PREFIXES) or value.lower() in {
        "none",
        "null",
        "true",
        "false",
        "password",
        "changeme",
        "redacted",
    }


# An expression rather than a literal: a call, an index, an attribute of a name.
_CODE = re.compile(r"[()\[\]{}]|^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")
# A name in code (``api_key``, ``API_KEY``, ``apiKey``): no digit, so no generated secret.
_IDENTIFIER = re.compile(r"[A-Za-z_]+")
# A path to a file (``uploads/2024/a1b2.png``: an S3 object's ``Key``), not a secret.
_FILE_PATH = re.compile(r"/[^/]*\.[A-Za-z][A-Za-z0-9]{0,5}$")


def _random_looking(value: str, *, min_length: int) -> bool:
    """Letters and digits mixed, long enough and varied enough to be a generated secret (an
    identifier such as ``max_tokens`` or ``getApiKey`` has no digits; ``token_v2`` is short)."""
    if len(value) < min_length or _placeholder_value(value):
        return False
    has_digit = any(c.isdigit() for c in value)
    has_alpha = any(c.isalpha() for c in value)
    if not (has_digit and has_alpha) or _CODE.search(value) or _FILE_PATH.search(value):
        return False
    return entropy(value) >= 3.0


def secret_span(match: re.Match[str]) -> tuple[int, int]:
    """Where the secret is: its group, or the whole match (no such group, or it took no part)."""
    if "secret" in match.re.groupindex and match.start("secret") >= 0:
        return match.span("secret")
    return match.span()


def _secret(match: re.Match[str]) -> str:
    start, end = secret_span(match)
    return match.string[start:end]


def _with_digit(match: re.Match[str]) -> bool:
    return any(c.isdigit() for c in _secret(match))


def _mixed_case(match: re.Match[str]) -> bool:
    value = _secret(match)
    return value.lower() != value and value.upper() != value


# Key names an assignment's value is a secret for: `api_key`, `OPENAI_API_KEY`, `SIGNING_KEY`,
# `signingKey`, `x-auth-token`, `client_secret`, `DB_PASSWORD`, `private_key_id`; not
# `max_tokens`, `token_count` or `monkey` (the word must end the name, `key` as a word of it).
_SECRET_NAME = re.compile(
    r"(?:(?:^|[_.-])(?i:keys?)|(?<=[a-z0-9])Keys?"
    r"|(?i:apikey|secret|token|password|passwd|passphrase|pwd|credentials?"
    r"|private[_-]?key[_-]?id|authtoken))$"
)
_PASSWORD_NAME = re.compile(r"(?i:password|passwd|passphrase|pwd)$")
_PUBLIC_NAME = re.compile(r"(?i:public[_-]?keys?)$")  # public key material is no secret
_UPPER_NAME = re.compile(r"[A-Z0-9_]+")
# Stand-ins of examples, tests and help texts (`http://user:pass@host`, `--password PASSWORD`):
# not secrets, and a conversation about URL parsing or a CLI's options needs them to stay.
_STAND_IN_PASSWORDS = {"p", "pw", "pwd", "pass", "passwd", "password", "secret", "x", "xxx"}
_STAND_IN_VALUES = _STAND_IN_PASSWORDS | {"text", "string", "str", "value", "-", "***"}
_ESCAPES = re.compile(r"%[0-9A-Fa-f]{2}|:")


def _assignment(match: re.Match[str]) -> bool:
    name, value = match.group("name"), match.group("secret")
    if not _SECRET_NAME.search(name) or _PUBLIC_NAME.search(name):
        return False
    if _PASSWORD_NAME.search(name):
        return _password(value, quoted=match.group("quote") is not None, upper=name)
    return _random_looking(value, min_length=10)


def _password(value: str, *, quoted: bool, upper: str) -> bool:
    """A password assigned to a password's name: any literal of 8+ characters (people choose
    them: no randomness asked), but not a name in code (``password = user_password``) unless
    quoted or in an environment file (``DB_PASSWORD=correcthorse``)."""
    if len(value) < 8 or _placeholder_value(value) or _CODE.search(value):
        return False
    if value.lower() in _STAND_IN_VALUES or _stand_in_word(value):
        return False
    literal = quoted or _UPPER_NAME.fullmatch(upper) is not None
    return literal or not _IDENTIFIER.fullmatch(value)


# Words a made-up password of an example or a test is built from (`somepassword`,
# `wrongpassword`, `dummysecret`): in a word of letters alone, a stand-in.
_STAND_IN_WORDS = re.compile(r"(?i:pass(?:wo?r)?d|secret|example|dummy|changeme|test)")


def _stand_in_word(value: str) -> bool:
    return value.isalpha() and _STAND_IN_WORDS.search(value) is not None


def _url_password(match: re.Match[str]) -> bool:
    value = match.group("secret")
    if _ESCAPES.sub("", value).lower() in _STAND_IN_PASSWORDS:
        return False
    return not _placeholder_value(value)


def _authorization(match: re.Match[str]) -> bool:
    value = match.group("secret")
    return len(value) >= 6 and not _placeholder_value(value)


def _header_key(match: re.Match[str]) -> bool:
    """An API key header's value: 8+ characters, not a name in code (``api_key``, ``API_KEY``)
    unless long and of mixed case as keys are."""
    value = match.group("secret")
    if _placeholder_value(value) or _CODE.search(value):
        return False
    if _IDENTIFIER.fullmatch(value):
        return len(value) >= 24 and _mixed_case(match)
    return True


def _command_password(match: re.Match[str]) -> bool:
    value = match.group("secret").strip("\\\"'")
    if not value or _placeholder_value(value) or value.lower() in _STAND_IN_VALUES:
        return False
    if match.group("option") is not None and value.isalpha() and value.islower():
        return False  # prose about an option (`--password suffers from the same flaw`)
    # A metavar of a help text (`-p PASSWORD`, `--password TEXT`), not a password.
    return not _UPPER_NAME.fullmatch(value) and not _stand_in_word(value)


def _p(
    kind: str,
    pattern: str,
    description: str,
    *,
    accept: Callable[[re.Match[str]], bool] | None = None,
    needles: tuple[str, ...] = (),
    folded: bool = False,
    gate: Mapping[str, str] | None = None,
    finders: tuple[str, ...] = (),
) -> Pattern:
    """``gate``: for each needle, what must follow it (a regex) for the full pattern to be tried.
    ``finders``: what a range is searched for instead of each needle apart (regexes that start
    with a literal, together finding every text a needle is in: ``gl`` and the letters after
    it for GitLab's ten prefixes)."""
    after = dict.fromkeys(needles, "") if gate is None else gate
    if set(after) != set(needles):
        raise ValueError(f"{kind}: the gate must give what follows each needle, and only those")
    alternatives = [f"{re.escape(needle)}(?:{rest})" for needle, rest in after.items()]
    # Each needle (with what its gate wants after it) is searched for apart: one that starts
    # with a literal is skipped to as fast as str.find finds it, where an alternation of them
    # tries each of their first letters at every character of the text.
    compiled_gate = re.compile("|".join(alternatives)) if gate is not None else None
    compiled = tuple(map(re.compile, finders or alternatives))
    return Pattern(
        kind, re.compile(pattern), description, accept, needles, folded, compiled_gate, compiled
    )


# A password on a command line: quoted (JSON-escaped quotes included) or up to a shell
# separator. The command words that take one, each with the flag right before the value.
_COMMAND_VALUE = r"(?P<secret>\\?\"[^\"\\\n]{1,200}+\\?\"|'[^'\n]{1,200}+'|[^\s\"'`;|&<>()\\]{2,}+)"
_ARGUMENTS_BEFORE = r"(?:\s++(?!{flags})[^\s;|&]++){{0,12}}+\s++"  # at most 12, then the flag
_GITLAB_PREFIXES = ("pat", "dt", "ft", "soat", "rt", "cbt", "imt", "ptt", "agent", "oas")
_HEADER_KEYS = (
    "api-key",
    "api-token",
    "auth-token",
    "access-token",
    "subscription-key",
    "private-token",
    "vault-token",
)

PATTERNS: tuple[Pattern, ...] = (
    _p(
        "private_key",
        # The body stops at the next "-----" (its END line, or the next BEGIN of a truncated
        # key), so a block is scanned once; a key cut off before its END line is redacted to
        # the end of its base64.
        r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
        r"(?:[A-Za-z0-9+/=\s,:\\]|-(?!----))*+"
        r"(?:-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----)?",
        "a PEM private key (RSA, EC, OpenSSH, PKCS#8, PGP), the whole block",
        needles=("PRIVATE KEY",),
    ),
    _p(
        "anthropic_api_key",
        r"sk-ant-" + _run_starts_before(7) + r"[A-Za-z0-9_-]{20,}+",
        "`sk-ant-…`",
        needles=("sk-ant-",),
    ),
    _p(
        "openai_api_key",
        r"sk-" + _run_starts_before(3) + r"(?!ant-)(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}+",
        "`sk-…`, `sk-proj-…`, `sk-svcacct-…` (with a digit in it)",
        accept=_with_digit,
        needles=("sk-",),
    ),
    _p(
        "stripe_secret_key",
        _TOKEN_START + r"(?:(?:sk|rk)_(?:live|test)|whsec)_[A-Za-z0-9]{16,}+" + _END,
        "`sk_live_…`, `sk_test_…`, `rk_live_…` (secret and restricted keys), `whsec_…` "
        "(webhook signing secrets)",
        needles=("_live_", "_test_", "whsec_"),
    ),
    _p(
        "aws_access_key_id",
        r"A(?:KIA|SIA|BIA|CCA)"
        + rf"(?:(?<![A-Za-z0-9][\s\S]{{4}})|(?<={_ESCAPED_BREAK}[\s\S]{{4}}))"
        + r"[A-Z0-9]{16}(?![A-Za-z0-9])",
        "`AKIA…`, `ASIA…` (20 characters)",
        needles=("AKIA", "ASIA", "ABIA", "ACCA"),
        finders=("A(?:KIA|SIA|BIA|CCA)",),
    ),
    _p(
        "aws_secret_access_key",
        r"(?i:aws_?secret_?access_?key|aws_?secret_?key|secret_?access_?key)" + _QUOTE + r"\s{0,8}+"
        r"[:=]\s{0,8}+" + _QUOTE + r"(?P<secret>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])",
        "40 characters assigned to `aws_secret_access_key` (any case, `=` or `:`)",
        needles=("secret",),
        folded=True,
    ),
    _p(
        "github_token",
        r"(?:gh[pousr]_"
        + _run_starts_before(4)
        + r"[A-Za-z0-9]{30,}+|github_pat_"
        + _run_starts_before(11)
        + r"[A-Za-z0-9_]{22,}+)"
        + _END,
        "`ghp_…`, `gho_…`, `ghs_…`, `ghu_…`, `ghr_…`, `github_pat_…`",
        needles=("ghp_", "gho_", "ghs_", "ghu_", "ghr_", "github_pat_"),
        finders=("gh[pousr]_", "github_pat_"),
    ),
    _p(
        "gitlab_token",
        r"(?:gl"
        + _run_starts_before(2)
        + "(?:"
        + "|".join(_GITLAB_PREFIXES)
        + r")-|GR1348941"
        + _run_starts_before(9)
        + r")[A-Za-z0-9_-]{20,}+"
        + _END,
        "`glpat-…` and GitLab's other tokens (`gldt-`, `glrt-`, `glcbt-`, `gloas-`, …), "
        "runner registration tokens (`GR1348941…`)",
        needles=(*(f"gl{p}-" for p in _GITLAB_PREFIXES), "GR1348941"),
        finders=("gl(?:" + "|".join(_GITLAB_PREFIXES) + ")-", "GR1348941"),
    ),
    _p(
        "slack_token",
        r"xox"
        + _run_starts_before(3)
        + r"[a-z]-[A-Za-z0-9-]{10,}+"
        + r"|hooks\.slack\.com/services/(?P<secret>T[A-Za-z0-9_]++/B[A-Za-z0-9_]++/[A-Za-z0-9_]++)",
        "`xoxb-…`, `xoxp-…`, `xoxa-…` and the other `xox?-` tokens; an incoming webhook's "
        "`hooks.slack.com/services/T…/B…/…` path",
        needles=("xox", "hooks.slack.com/services/"),
    ),
    _p(
        "google_api_key",
        r"AIza" + _run_starts_before(4) + r"[A-Za-z0-9_-]{35}" + _END,
        "`AIza…` (39 characters)",
        needles=("AIza",),
    ),
    _p(
        "npm_token",
        r"npm_" + _run_starts_before(4) + r"[A-Za-z0-9]{36}" + _END,
        "`npm_…` (36 letters and digits)",
        needles=("npm_",),
    ),
    _p(
        "huggingface_token",
        r"(?:hf_" + _run_starts_before(3) + r"|api_org_" + _run_starts_before(8) + ")"
        r"[A-Za-z0-9]{30,}+" + _END,
        "`hf_…` and `api_org_…` (30+ letters and digits, both cases)",
        accept=_mixed_case,
        needles=("hf_", "api_org_"),
    ),
    _p(
        "sendgrid_api_key",
        r"SG\." + _run_starts_before(3) + r"[A-Za-z0-9_-]{16,32}\.[A-Za-z0-9_-]{30,}+" + _END,
        "`SG.…` `.…` (SendGrid's two base64url parts)",
        needles=("SG.",),
    ),
    _p(
        "twilio_key",
        r"(?:AC|SK)" + _run_starts_before(2) + r"[0-9a-f]{32}(?![A-Za-z0-9_])",
        "an account SID `AC…` or API key SID `SK…` (32 lower-case hex digits)",
        needles=("AC", "SK"),
        gate={"AC": "[0-9a-f]{32}", "SK": "[0-9a-f]{32}"},
    ),
    _p(
        "pypi_token",
        r"pypi-" + _run_starts_before(5) + r"AgE[A-Za-z0-9_-]{50,}+",
        "`pypi-AgE…` (PyPI's and TestPyPI's upload tokens)",
        needles=("pypi-AgE",),
    ),
    _p(
        "square_token",
        r"sq0(?:csp|atp)-" + _run_starts_before(7) + r"[A-Za-z0-9_-]{22,}+" + _END,
        "`sq0csp-…` (Square OAuth secrets) and `sq0atp-…` (access tokens)",
        needles=("sq0csp-", "sq0atp-"),
    ),
    _p(
        "mailchimp_api_key",
        # Starts where a run of hex digits starts: a 40-digit commit is scanned once.
        _TOKEN_START + r"[0-9a-f]{32}-us[0-9]{1,2}(?![A-Za-z0-9_])",
        "32 hex digits then the data center, `-us1` to `-us99`",
        needles=("-us",),
        gate={"-us": "[0-9]{1,2}"},
    ),
    _p(
        "telegram_bot_token",
        r"(?<![0-9])[0-9]{8,10}:AA[A-Za-z0-9_-]{33}" + _END,
        "a bot's id, `:` and `AA` then 33 characters (`123456789:AA…`)",
        needles=(":AA",),
    ),
    _p(
        "azure_storage_key",
        r"(?i:accountkey|sharedaccesskey)\s{0,8}+=\s{0,8}+"
        r"(?P<secret>[A-Za-z0-9+/]{20,}+={0,2})",
        "the `AccountKey=` or `SharedAccessKey=` of an Azure connection string",
        needles=("accountkey", "sharedaccesskey"),
        folded=True,
    ),
    _p(
        "authorization_header",
        r"(?i:(?:proxy-)?authorization)"
        + _QUOTE
        + r"\s{0,8}+[:=]\s{0,8}+"
        + _QUOTE
        + r"(?i:bearer|basic|token|digest|apikey)\s{1,8}+(?P<secret>[^\s\"',;`\\]++)",
        "the credentials of an `Authorization:` (or `Proxy-Authorization:`) header with a "
        "`Bearer`, `Basic`, `Token`, `Digest` or `ApiKey` scheme; the scheme stays",
        accept=_authorization,
        needles=("authorization",),
        folded=True,
    ),
    _p(
        "api_key_header",
        # The name's last words (`X-API-Key`, `X-Goog-Api-Key`: a `-` may come before).
        _TOKEN_START
        + "(?i:"
        + "|".join(_HEADER_KEYS)
        + ")"
        + _QUOTE
        + r"\s{0,8}+:\s{0,8}+"
        + _QUOTE
        + r"(?P<secret>[^\s\"'`,;:\\(){}\[\]<>]{8,}+)",
        "the value of a header named `X-API-Key`, `Api-Key`, `X-Auth-Token`, `X-Access-Token`, "
        "`Ocp-Apim-Subscription-Key`, `Private-Token` (GitLab), `X-Vault-Token` and the like",
        accept=_header_key,
        needles=_HEADER_KEYS,
        finders=("-key", "-token"),  # the last word of every header name
        folded=True,
    ),
    _p(
        "jwt",
        r"eyJ"
        + _run_starts_before(3)
        + r"[A-Za-z0-9_-]{8,}+\.eyJ[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]*+",
        "a JSON Web Token (`eyJ….eyJ….…`)",
        needles=("eyJ",),
    ),
    _p(
        "url_password",
        rf"(?:(?<![A-Za-z0-9+.-])|(?<={_ESCAPED_BREAK}))"
        r"[A-Za-z][A-Za-z0-9+.-]{0,30}+://[^\s:/?#@\"'<>\\]*+:"
        r"(?P<secret>[^\s/?#@\"'<>\\]++)@",
        "the password of `scheme://user:password@host` (the user and host stay)",
        accept=_url_password,
        needles=("://",),
    ),
    _p(
        "command_line_password",
        _TOKEN_START
        + "(?:"
        + r"sshpass\s++-p\s*+"
        + r"|(?:docker|podman|nerdctl|buildah|skopeo)\s++login"
        + _ARGUMENTS_BEFORE.format(flags="-p|--password")
        + r"-p\s*+"
        + r"|(?:mysql|mariadb|mysqldump|mysqladmin|mysqlimport|mysqlshow|mysqlcheck)"
        + _ARGUMENTS_BEFORE.format(flags="-p")
        + r"-p(?=[^\s-])"
        + r"|redis-cli"
        + _ARGUMENTS_BEFORE.format(flags="-a\\s")
        + r"-a\s++"
        + r"|curl"
        + _ARGUMENTS_BEFORE.format(flags="-u|--user")
        + r"(?:-u\s*+|--user(?:\s++|=))"
        + _QUOTE
        + r"[^\s:\"'\\]*+:"
        + r"|(?P<option>--pass(?:word|wd)?)(?:\s++|=)"
        + ")"
        + _COMMAND_VALUE,
        "the password of `sshpass -p`, `docker login -p` (and podman's, …), `mysql -p…`, "
        "`redis-cli -a`, `curl -u user:…` and of any `--password`/`--passwd` option",
        accept=_command_password,
        needles=("sshpass", "login", "mysql", "mariadb", "redis-cli", "curl", "--pass"),
    ),
    _p(
        "secret_assignment",
        # A URL's query parameter (after `?` or `&`) ends at the next `&` or `#`.
        r"(?:(?<=[?&])(?P<query>)|(?<![?&]))"
        r"(?<![A-Za-z0-9_.-])(?P<name>[A-Za-z0-9_.-]{1,64}+)"
        + _QUOTE
        + r"\s{0,8}+[:=]\s{0,8}+(?P<quote>\\?[\"'])?"
        + r"(?P<secret>(?(query)[^\s\"'`,;:=\\&#]{8,}+|[^\s\"'`,;:=\\]{8,}+={0,2}))",
        "a value assigned with `=` or `:` to a name ending in `key` (as a word: `API_KEY`, "
        "`signingKey`), `token`, `secret`, `password`, `passwd`, `passphrase`, `pwd`, "
        "`credentials` or `private_key_id`: 10+ characters mixing letters and digits (3+ bits "
        "of entropy a character), or for a password's name any literal of 8+ characters",
        accept=_assignment,
        needles=("key", "secret", "token", "pass", "pwd", "credential"),
        folded=True,
        # A secret name's last word right before the `=` or `:` (the full pattern tries every
        # run of name characters: three times slower over ordinary code).
        gate={
            needle: rest + _QUOTE + r"\s{0,8}+[:=]"
            for needle, rest in [
                ("key", "(?:s|[_-]?id)?"),
                ("secret", ""),
                ("token", ""),
                ("pass", "(?:w(?:or)?d|phrase)"),
                ("pwd", ""),
                ("credential", "s?"),
            ]
        },
    ),
)
