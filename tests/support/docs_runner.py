"""Runs the code blocks of one Markdown page as a reader would: in order, each ``sh`` block in
bash (``set -e``; what it exports and where it ``cd``s carry over to the next blocks, as in one
terminal), each ``python`` block as a program, in a scratch copy of the checkout.

tests/integration/test_docs.py runs it in a network namespace of its own with only loopback up::

    unshare --user --map-root-user --net python tests/support/docs_runner.py README.md

so a block that reaches for the network fails, and the ports the pages name (Redis on 6390,
``compactor serve`` on 8080, the stand-in provider on 8808) are the page's alone.

What a page may say about its blocks, in an HTML comment on the line before the fence:

- ``<!-- not run: REASON -->``: the block is not run (a diagram, an install, the suite itself);
- ``<!-- in the background; ready when it prints "TEXT" -->`` or ``<!-- in the background;
  ready when URL answers -->``: a command that runs until stopped (a server); the next blocks
  run once it printed TEXT or URL answered 200, and it gets Ctrl-C when the page ends;
- ``<!-- the service is running: ... -->`` (anywhere): before its first block, the page gets
  the service the README's *Using it* starts (``compactor up --redis-port 6390``) and
  ``COMPACTOR_REDIS_URL`` pointing at it.

Every page also gets what a reader with an LLM provider and, where a block names ``s3://``,
an S3 store has in their environment: ``OPENAI_API_KEY``/``OPENAI_BASE_URL`` and
``ANTHROPIC_API_KEY``/``ANTHROPIC_BASE_URL`` of the stand-in provider (worker/testing/), and
``AWS_ENDPOINT_URL`` and credentials of moto's S3 server with the buckets the blocks name.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
RUN = ("python", "sh")
BLOCK_TIMEOUT_S = 600.0
READY_TIMEOUT_S = 240.0
SERVICE_REDIS_PORT = 6390
SERVICE_MARKER = "<!-- the service is running:"
_FENCE = re.compile(r"^```([\w+-]*)\s*$")
_COMMENT = re.compile(r"^<!--\s*(.*?)\s*-->$")
_BACKGROUND = re.compile(
    r'in the background; ready when (?:it prints "(?P<text>[^"]+)"|(?P<url>\S+) answers)$'
)
#: Environment a reader's shell would not have, or that would point a block elsewhere.
_DROPPED = re.compile(r"(COMPACTOR_|AWS_|OPENAI_|ANTHROPIC_|PG|VIRTUAL_ENV$|PYTHONPATH$)")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    directive: str | None  # the HTML comment on the line before the fence, if any

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def not_run_reason(self) -> str | None:
        if self.directive and self.directive.startswith("not run:"):
            return self.directive.removeprefix("not run:").strip()
        return None

    @property
    def background(self) -> re.Match[str] | None:
        return _BACKGROUND.fullmatch(self.directive) if self.directive else None

    @property
    def runs(self) -> bool:
        return self.lang in RUN and self.not_run_reason is None


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown page, with the directive before it."""
    found: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    page = path.relative_to(REPO_ROOT).as_posix()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```")
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        comment = _COMMENT.match(before.strip())
        text = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(Block(page, i + 1, opening.group(1), text, comment and comment.group(1)))
        i = end + 1
    return found


# --- the page's world --------------------------------------------------------------------------


def loopback_up() -> None:
    """A new network namespace starts with ``lo`` down: bring it up (SIOCGIFFLAGS /
    SIOCSIFFLAGS), so 127.0.0.1 works and nothing else exists."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(s, siocgifflags, request))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sh", b"lo", flags | iff_up))


def scratch_checkout(directory: Path) -> None:
    """The checkout as a reader has it after ``make``, without writing into this one: every
    top-level entry a link, except docs/ (``make schemas`` writes there), copied, and .venv,
    whose entries are links but whose set-up stamp is the scratch's own and new, so that no
    ``make`` target reinstalls into the real one."""
    for entry in REPO_ROOT.iterdir():
        if entry.name in (".git", "transcripts") or entry.name.endswith("_cache"):
            continue
        if entry.name == "docs":
            shutil.copytree(entry, directory / "docs")
        elif entry.name == ".venv":
            (directory / ".venv").mkdir()
            stamps = (".installed", ".installed-demo")  # the Makefile's set-up stamps
            for part in entry.iterdir():
                if part.name not in stamps:
                    (directory / ".venv" / part.name).symlink_to(part)
            for stamp in stamps:
                (directory / ".venv" / stamp).touch()
        else:
            (directory / entry.name).symlink_to(entry)


def reader_environment(scratch: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not _DROPPED.match(k)}
    venv = scratch / ".venv"
    env.update(
        HOME=str(scratch / "home"),
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(venv),
        PYTHONUNBUFFERED="1",
        OPENAI_AGENTS_DISABLE_TRACING="1",  # the Agents SDK would export traces to OpenAI
    )
    (scratch / "home").mkdir()
    return env


@contextlib.contextmanager
def llm_provider(env: dict[str, str]) -> Iterator[None]:
    from worker.testing.standin_llm import StandinLLM

    with StandinLLM() as llm:
        env.update(
            OPENAI_API_KEY="sk-docs-test-key",
            OPENAI_BASE_URL=llm.openai_base_url,
            ANTHROPIC_API_KEY="sk-ant-docs-test-key",
            ANTHROPIC_BASE_URL=llm.anthropic_base_url,
        )
        yield


@contextlib.contextmanager
def s3_store(env: dict[str, str], buckets: set[str], logs: Path) -> Iterator[None]:
    if not buckets:
        yield
        return
    from store_support import S3_ENVIRONMENT, S3Server  # run as a script: its folder is on the path

    env.update(S3_ENVIRONMENT)
    os.environ.update(S3_ENVIRONMENT)  # for the buckets made here
    server = S3Server(logs)
    server.start()
    try:
        for bucket in sorted(buckets):
            server.new_bucket(bucket)
        env["AWS_ENDPOINT_URL"] = server.endpoint
        yield
    finally:
        server.stop()


@contextlib.contextmanager
def service(env: dict[str, str], scratch: Path) -> Iterator[None]:
    """What the README's *Using it* starts, started the public way, from the checkout."""
    from worker.local import local_stack

    with local_stack(workdir=scratch / ".service", redis_port=SERVICE_REDIS_PORT) as stack:
        env["COMPACTOR_REDIS_URL"] = stack.redis_url
        yield


# --- running blocks ----------------------------------------------------------------------------


class Failed(Exception):
    pass


class Page:
    def __init__(self, scratch: Path, env: dict[str, str], work: Path) -> None:
        self.cwd, self.env, self.work = scratch, env, work
        self.background: list[tuple[Block, subprocess.Popen[bytes], Path]] = []

    def run(self, block: Block) -> None:
        path = self.work / f"block-{block.line}.{'py' if block.lang == 'python' else 'sh'}"
        path.write_text(block.text, encoding="utf-8")
        if block.background:
            self.start(block, path)
        elif block.lang == "python":
            self.wait(block, [sys.executable, str(path)])
        else:
            self.wait(block, ["bash", "-c", self.shell(path)])
            self.carry_over()

    def shell(self, path: Path) -> str:
        """Run the block in this page's terminal state, and save that state after it."""
        state = self.work / "state"
        return (
            f"set -e\nsource {path}\n"
            f"env -0 > {state}.env\npwd > {state}.cwd\n"  # reached only when every line passed
        )

    def carry_over(self) -> None:
        state = self.work / "state"
        pairs = (item.split("=", 1) for item in (state.with_suffix(".env").read_text().split("\0")))
        self.env = {
            k: v for k, v in (p for p in pairs if len(p) == 2) if k not in ("_", "SHLVL", "OLDPWD")
        }
        self.cwd = Path(state.with_suffix(".cwd").read_text().strip())

    def wait(self, block: Block, cmd: list[str]) -> None:
        started = time.monotonic()
        out = self.work / f"block-{block.line}.out"
        with out.open("wb") as sink:
            proc = subprocess.Popen(
                cmd,
                cwd=self.cwd,
                env=self.env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                code = proc.wait(timeout=BLOCK_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise Failed(
                    f"{block.where}: still running after {BLOCK_TIMEOUT_S:g} s\n" + tail(out)
                ) from None
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # whatever it left running
        if code != 0:
            raise Failed(f"{block.where} ({block.lang}) exited {code}:\n{tail(out)}")
        print(f"ok {block.where} {block.lang} ({time.monotonic() - started:.1f} s)", flush=True)
        print(indented(tail(out, 1500)), flush=True)

    def start(self, block: Block, path: Path) -> None:
        ready = block.background
        assert ready is not None
        out = self.work / f"block-{block.line}.out"
        with out.open("wb") as sink:
            proc = subprocess.Popen(
                ["bash", "-c", f"set -e\nsource {path}"],
                cwd=self.cwd,
                env=self.env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.background.append((block, proc, out))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise Failed(
                    f"{block.where}: exited {proc.returncode} before it was ready:\n" + tail(out)
                )
            if ready["text"] and ready["text"] in out.read_text(errors="replace"):
                break
            if ready["url"] and answers(ready["url"]):
                break
            time.sleep(0.1)
        else:
            raise Failed(f"{block.where}: not ready within {READY_TIMEOUT_S:g} s\n" + tail(out))
        print(f"ok {block.where} running in the background", flush=True)

    def stop_background(self) -> list[str]:
        """Ctrl-C to each background command, newest first; what did not stop cleanly."""
        problems = []
        for block, proc, out in reversed(self.background):
            if proc.poll() is not None:
                problems.append(
                    f"{block.where}: exited {proc.returncode} while the page ran\n" + tail(out)
                )
                continue
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                problems.append(f"{block.where}: still running 120 s after Ctrl-C\n" + tail(out))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return problems


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def indented(text: str) -> str:
    return "\n".join("    " + line[:300] for line in text.splitlines()[-12:])


def tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:]


def run_page(page: Path) -> int:
    loopback_up()
    page_blocks = blocks(page)
    runnable = [b for b in page_blocks if b.runs]
    text = page.read_text(encoding="utf-8")
    buckets = {m for b in runnable for m in re.findall(r"s3://([a-z0-9][a-z0-9.-]+)", b.text)}
    with tempfile.TemporaryDirectory(prefix="docs-page-") as tmp:
        scratch, work = Path(tmp) / "checkout", Path(tmp) / "run"
        scratch.mkdir()
        work.mkdir()
        scratch_checkout(scratch)
        env = reader_environment(scratch)
        os.chdir(scratch)  # where a reader starts, and where the service's transcripts go
        page_run = Page(scratch, env, work)
        problems: list[str] = []
        with contextlib.ExitStack() as world:
            world.enter_context(llm_provider(env))
            world.enter_context(s3_store(env, buckets, work))
            if SERVICE_MARKER in text:
                world.enter_context(service(env, scratch))
            page_run.env = env
            try:
                for block in runnable:
                    page_run.run(block)
            except Failed as exc:
                problems.append(str(exc))
            finally:
                problems += page_run.stop_background()
        for problem in problems:
            print("FAILED " + problem, flush=True)
        return 1 if problems else 0


def main() -> int:
    page = (REPO_ROOT / sys.argv[1]).resolve()
    print(json.dumps({"page": sys.argv[1]}), flush=True)
    return run_page(page)


if __name__ == "__main__":
    sys.exit(main())
