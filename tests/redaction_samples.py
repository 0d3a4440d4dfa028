"""Planted secrets, one per kind of worker.core.redaction, for the redaction tests.

Built from pieces at run time (none is a real credential, and no scanner should mistake this
file for one): ``text`` holds the secret in the context it is found in, ``secret`` is what must
never come out, ``kept`` what stays around it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Planted:
    kind: str
    text: str
    secret: str
    kept: str  # context that must survive the redaction


def _chars(n: int, alphabet: str = "aB3dE5fG7hJ9kL2mN4pQ6rS8tU0vW1xY") -> str:
    return "".join(alphabet[(i * 7 + 3) % len(alphabet)] for i in range(n))


_PEM_BODY = "\n".join(["MIIEowIBAAKCAQEA" + _chars(48)] + [_chars(64) for _ in range(4)])
_PEM = "-----BEGIN RSA " + "PRIVATE KEY-----\n" + _PEM_BODY + "\n-----END RSA " + "PRIVATE KEY-----"
_OPENAI = "sk-" + "proj-" + _chars(40)
_ANTHROPIC = "sk-" + "ant-api03-" + _chars(60)
_STRIPE = "sk_" + "live_" + _chars(24, "abcdefghijklmnop0123456789ABCD")
_AWS_ID = "AK" + "IA" + _chars(16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")
_AWS_SECRET = _chars(40, "abcdefghijklmnopqrstuvwxyzABCDEF0123456789/+")
_GITHUB = "gh" + "p_" + _chars(36)
_GITHUB_PAT = "github" + "_pat_" + _chars(22) + "_" + _chars(59)
_SLACK = "xo" + "xb-" + "1234567890-" + _chars(24)
_GOOGLE = "AI" + "za" + _chars(35)
_BEARER = _chars(32)
_JWT = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9" + ".eyJzdWIiOiIxMjM0NTY3ODkwIn0." + _chars(43)
_URL_PASSWORD = "Pa55w0rd" + _chars(8)
_ASSIGNED = _chars(32, "0123456789abcdef")

PLANTED: tuple[Planted, ...] = (
    Planted("private_key", f"the deploy key:\n{_PEM}\nend of key file", _PEM_BODY, "end of key"),
    Planted("openai_api_key", f"export OPENAI_API_KEY={_OPENAI}", _OPENAI, "OPENAI_API_KEY="),
    Planted("anthropic_api_key", f'client = Anthropic(api_key="{_ANTHROPIC}")', _ANTHROPIC, "("),
    Planted("stripe_secret_key", f"stripe.api_key = '{_STRIPE}'", _STRIPE, "stripe.api_key"),
    Planted("aws_access_key_id", f"aws_access_key_id = {_AWS_ID}", _AWS_ID, "aws_access_key_id"),
    Planted(
        "aws_secret_access_key",
        f"AWS_SECRET_ACCESS_KEY={_AWS_SECRET}\nregion=eu-west-1",
        _AWS_SECRET,
        "region=eu-west-1",
    ),
    Planted("github_token", f"git clone with token {_GITHUB} done", _GITHUB, "done"),
    Planted("github_token", f"GH_PAT: {_GITHUB_PAT}", _GITHUB_PAT, "GH_PAT"),
    Planted("slack_token", f"SLACK_BOT={_SLACK}", _SLACK, "SLACK_BOT="),
    Planted("google_api_key", f"maps?key={_GOOGLE}&q=berlin", _GOOGLE, "&q=berlin"),
    Planted(
        "authorization_header",
        f"curl -H 'Authorization: Bearer {_BEARER}' http://127.0.0.1:9/v1",
        _BEARER,
        "Authorization: Bearer",
    ),
    Planted("jwt", f"session cookie is {_JWT}; expires soon", _JWT, "expires soon"),
    Planted(
        "url_password",
        f"DATABASE_URL=postgres://app:{_URL_PASSWORD}@db.internal:5432/app",
        _URL_PASSWORD,
        "postgres://app:",
    ),
    Planted(
        "secret_assignment",
        f'{{"name": "svc", "api_token": "{_ASSIGNED}"}}',
        _ASSIGNED,
        '"name": "svc"',
    ),
)

# Ordinary text of a coding session that must come out unchanged.
ORDINARY: tuple[str, ...] = (
    "commit 3f2a9c4e1b7d8a6f5e4d3c2b1a0f9e8d7c6b5a49 (HEAD -> main)",
    "sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "request id 550e8400-e29b-41d4-a716-446655440000 took 12ms",
    "edited /home/dev/project/src/sk-learn_wrapper/model_selection_v2.py and tests/test_api_key.py",
    "max_tokens: 4096, token_count=12345, tokens = tokenizer.encode(text)",
    'api_key = os.environ["OPENAI_API_KEY"]  # read from the environment',
    "password = getpass.getpass()",
    "curl -H 'Authorization: Bearer $TOKEN' https://api.example.com/v1/models",
    "redis://localhost:6379/0 and https://user@example.com/path?x=1#frag and ssh://git@github.com/o/r",
    "git@github.com:org/repo.git at http://127.0.0.1:8080/health",
    "URLValidator accepts http://user:pass@host, http://:pass@host and http://user:pass%40word@h",
    "see risk-assessment-2024-report-final-v2 and disk-usage-summary-2024-11-30-x86_64",
    "The secret: keep the tests green. Token: the next step is the parser.",
    "ValueError: invalid literal for int() with base 10: 'abc' at line 42, col 7",
)
