"""Planted secrets, one per kind of worker.core.redaction, for the redaction tests.

Built from pieces at run time (none is a real credential, and no scanner should mistake this
file for one): ``text`` holds the secret in the context it is found in, ``secret`` is what must
never come out, ``kept`` what stays around it."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Planted:
    kind: str
    text: str
    secret: str
    kept: str  # context that must survive the redaction


def _chars(n: int, alphabet: str = "aB3dE5fG7hJ9kL2mN4pQ6rS8tU0vW1xY") -> str:
    """``n`` characters of ``alphabet`` in a fixed order that looks random (its length must be
    prime to 7, or the order repeats after a few characters)."""
    return "".join(alphabet[(i * 7 + 3) % len(alphabet)] for i in range(n))


_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_HEX = "0123456789abcdef"
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
_GITLAB = "gl" + "pat-" + _chars(20, _B64URL)
_NPM = "np" + "m_" + _chars(36)
_HUGGINGFACE = "h" + "f_" + _chars(34, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJ")
_SENDGRID = "S" + "G." + _chars(22, _B64URL) + "." + _chars(43, _B64URL)
_TWILIO = "S" + "K" + _chars(32, _HEX)
_PYPI = "py" + "pi-AgEIcHlwaS5vcmc" + _chars(72, _B64URL)
_AZURE_KEY = _chars(86, _B64) + "=="
_SQUARE = "sq0" + "csp-" + _chars(43, _B64URL)
_MAILCHIMP = _chars(32, _HEX) + "-us" + "12"
_TELEGRAM = "110201543:" + "AA" + _chars(33, _B64URL)
_ALNUM = _B64[:62]  # 62 characters: prime to the step, so no run repeats early
_HEADER_KEY = _chars(40, _ALNUM)
_PASSWORD = "Tr0ub4dor-" + _chars(10)

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
    Planted("gitlab_token", f"git remote set-url origin with {_GITLAB} (CI)", _GITLAB, "(CI)"),
    Planted("slack_token", f"SLACK_BOT={_SLACK}", _SLACK, "SLACK_BOT="),
    Planted("google_api_key", f"maps?key={_GOOGLE}&q=berlin", _GOOGLE, "&q=berlin"),
    Planted("npm_token", f"//registry.npmjs.org/:_authToken {_NPM} in .npmrc", _NPM, ".npmrc"),
    Planted(
        "huggingface_token", f"huggingface-cli login --token {_HUGGINGFACE}", _HUGGINGFACE, "cli"
    ),
    Planted("sendgrid_api_key", f"mailer ready with {_SENDGRID} loaded", _SENDGRID, "loaded"),
    Planted("twilio_key", f"twilio api key sid {_TWILIO} created", _TWILIO, "created"),
    Planted("pypi_token", f"twine upload -u __token__ with {_PYPI} ok", _PYPI, "twine upload"),
    Planted("square_token", f"square client built with {_SQUARE} in prod", _SQUARE, "in prod"),
    Planted("mailchimp_api_key", f"mailchimp: {_MAILCHIMP} (list sync)", _MAILCHIMP, "(list sync)"),
    Planted("telegram_bot_token", f"bot {_TELEGRAM} polling", _TELEGRAM, "polling"),
    Planted(
        "azure_storage_key",
        "DefaultEndpointsProtocol=https;AccountName=devstore;AccountKey="
        + _AZURE_KEY
        + ";EndpointSuffix=core.windows.net",
        _AZURE_KEY,
        "AccountName=devstore;AccountKey=",
    ),
    Planted(
        "authorization_header",
        f"curl -H 'Authorization: Bearer {_BEARER}' http://127.0.0.1:9/v1",
        _BEARER,
        "Authorization: Bearer",
    ),
    Planted(
        "api_key_header",
        f"curl -H 'X-API-Key: {_HEADER_KEY}' https://api.example.com/v1/items",
        _HEADER_KEY,
        "X-API-Key:",
    ),
    Planted("jwt", f"session cookie is {_JWT}; expires soon", _JWT, "expires soon"),
    Planted(
        "url_password",
        f"DATABASE_URL=postgres://app:{_URL_PASSWORD}@db.internal:5432/app",
        _URL_PASSWORD,
        "postgres://app:",
    ),
    Planted(
        "command_line_password",
        f"sshpass -p '{_PASSWORD}' ssh deploy@10.0.0.5 uptime",
        _PASSWORD,
        "ssh deploy@10.0.0.5",
    ),
    Planted(
        "secret_assignment",
        f'{{"name": "svc", "api_token": "{_ASSIGNED}"}}',
        _ASSIGNED,
        '"name": "svc"',
    ),
)

# The kinds docs/summaries.md documented when issue 36 was filed.
DOCUMENTED_KINDS = (
    "private_key",
    "anthropic_api_key",
    "openai_api_key",
    "stripe_secret_key",
    "aws_access_key_id",
    "aws_secret_access_key",
    "github_token",
    "slack_token",
    "google_api_key",
    "authorization_header",
    "jwt",
    "url_password",
    "secret_assignment",
)


def _service_account() -> tuple[str, str, str]:
    """A GCP service account key file as JSON text (its line breaks escaped), its private key's
    id and its key's body."""
    body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" + _chars(32) + "\n" + _chars(64)
    pem = "-----BEGIN " + "PRIVATE KEY-----\n" + body + "\n-----END " + "PRIVATE KEY-----\n"
    key_id = _chars(40, _HEX)
    doc = {
        "type": "service_account",
        "project_id": "demo-project",
        "private_key_id": key_id,
        "private_key": pem,
        "client_email": "ci@demo-project.iam.gserviceaccount.com",
    }
    return json.dumps(doc, indent=2), key_id, body


_GCP_FILE, _GCP_KEY_ID, _GCP_BODY = _service_account()
_OPENSSH_BODY = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ" + "\n" + _chars(70)
_OPENSSH = (
    "-----BEGIN OPENSSH "
    + "PRIVATE KEY-----\n"
    + _OPENSSH_BODY
    + "\n-----END OPENSSH "
    + "PRIVATE KEY-----"
)
_WEBHOOK_PATH = (
    "T"
    + _chars(10, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    + "/B"
    + _chars(10, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    + "/"
    + _chars(24)
)
_WRAPPED = base64.b64encode(f"OPENAI_API_KEY={_OPENAI}\n".encode()).decode()
_QUERY_VALUE = _chars(32, _ALNUM)


def _shape(kind: str, text: str, secret: str, kept: str) -> Planted:
    return Planted(kind, text, secret, kept)


# The secret shapes of the conversation issue 36 was filed with (18 of its 31 reached the LLM,
# 8 the digest), and more: every kind as a coding session writes it, and the positions the
# issue found missed (a first query parameter, a key after a `-`).
SHAPES: dict[str, Planted] = {
    "openai_project_key": PLANTED[1],
    "anthropic_key": PLANTED[2],
    "stripe_live_key": PLANTED[3],
    "aws_access_key_id": PLANTED[4],
    "aws_secret_access_key": PLANTED[5],
    "github_classic_token": PLANTED[6],
    "github_fine_grained_token": PLANTED[7],
    "slack_bot_token": PLANTED[9],
    "slack_webhook": _shape(
        "slack_token",
        f"curl -X POST https://hooks.slack.com/services/{_WEBHOOK_PATH} -d @msg.json",
        _WEBHOOK_PATH,
        "-d @msg.json",
    ),
    "google_api_key": PLANTED[10],
    "jwt": PLANTED[22],
    "rsa_private_key": PLANTED[0],
    "openssh_private_key": _shape(
        "private_key", f"cat ~/.ssh/id_ed25519\n{_OPENSSH}\n$ ls", _OPENSSH_BODY, "$ ls"
    ),
    "postgres_url_password": PLANTED[23],
    "bearer_header": PLANTED[20],
    "query_api_key": _shape(
        "secret_assignment",
        f"GET https://api.example.com/v1/items?api_key={_QUERY_VALUE}&page=2 -> 200",
        _QUERY_VALUE,
        "&page=2 -> 200",
    ),
    "query_token": _shape(
        "secret_assignment",
        f"wget 'https://files.example.com/export.csv?token={_QUERY_VALUE}'",
        _QUERY_VALUE,
        "export.csv?token=",
    ),
    "query_access_token": _shape(
        "secret_assignment",
        f"redirected to /callback?access_token={_QUERY_VALUE}#state=1",
        _QUERY_VALUE,
        "#state=1",
    ),
    "query_password": _shape(
        "secret_assignment",
        f"POST https://admin.example.com/login?password={_PASSWORD}&user=root",
        _PASSWORD,
        "&user=root",
    ),
    "github_token_after_dash": _shape(
        "github_token", f"wrote creds-{_GITHUB} to the vault", _GITHUB, "wrote creds-"
    ),
    "openai_key_after_dash": _shape(
        "openai_api_key", f"header x-{_OPENAI} was rejected", _OPENAI, "was rejected"
    ),
    "npm_token": PLANTED[11],
    "huggingface_token": PLANTED[12],
    "sendgrid_key": PLANTED[13],
    "twilio_api_key": PLANTED[14],
    "gitlab_token": PLANTED[8],
    "pypi_token": PLANTED[15],
    "azure_connection_string": PLANTED[19],
    "square_oauth_secret": PLANTED[16],
    "mailchimp_key": PLANTED[17],
    "telegram_bot_token": PLANTED[18],
    "docker_login": _shape(
        "command_line_password",
        f"docker login -u ci -p {_PASSWORD} registry.example.com",
        _PASSWORD,
        "registry.example.com",
    ),
    "mysql_password": _shape(
        "command_line_password",
        f"mysql -h db.internal -u root -p{_PASSWORD} shop < dump.sql",
        _PASSWORD,
        "shop < dump.sql",
    ),
    "sshpass": PLANTED[24],
    "any_key_name": _shape(
        "secret_assignment", f"SIGNING_KEY={_ASSIGNED}\nDEBUG=0", _ASSIGNED, "DEBUG=0"
    ),
    "any_token_name": _shape(
        "secret_assignment", f"export DEPLOY_TOKEN={_QUERY_VALUE}", _QUERY_VALUE, "DEPLOY_TOKEN="
    ),
    "any_secret_name": _shape(
        "secret_assignment", f"WEBHOOK_SECRET: '{_ASSIGNED}'", _ASSIGNED, "WEBHOOK_SECRET:"
    ),
    "any_password_name": _shape(
        "secret_assignment",
        f"POSTGRES_PASSWORD={_PASSWORD}\nPOSTGRES_DB=shop",
        _PASSWORD,
        "POSTGRES_DB=shop",
    ),
    "x_api_key_header": PLANTED[21],
    "gcp_private_key": _shape("private_key", _GCP_FILE, _GCP_BODY, "service_account"),
    "gcp_private_key_id": _shape("secret_assignment", _GCP_FILE, _GCP_KEY_ID, "demo-project"),
    "base64_wrapped_key": _shape(
        "openai_api_key",
        f"echo {_WRAPPED} | base64 -d >> .env",
        _WRAPPED,
        "| base64 -d >> .env",
    ),
}

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
