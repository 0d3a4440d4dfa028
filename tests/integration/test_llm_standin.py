"""The stand-in provider itself: concurrency, keep-alive, shutdown under hangs, the CLI."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time

import httpx
import pytest

from worker.testing.llm_schema import openai_chat_errors
from worker.testing.standin_llm import Fault, StandinLLM

BODY = {"model": "m", "max_tokens": 200, "messages": [{"role": "user", "content": "see a/b.py"}]}


def _raw_request(body: bytes) -> bytes:
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
    writer.write(_raw_request(json.dumps(BODY).encode()))
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(re.search(rb"Content-Length: (\d+)", head)[1])  # type: ignore[index]
    await reader.readexactly(length)
    return int(head.split(b" ", 2)[1])


async def _two_waves(llm: StandinLLM, count: int) -> list[int]:
    """``count`` connections, each sending two requests (keep-alive); a plain stdlib client.
    The first wave is held at the stand-in until all ``count`` requests are in flight."""
    conns = await asyncio.gather(
        *(asyncio.open_connection("127.0.0.1", llm.port) for _ in range(count))
    )
    try:
        llm.hold()
        first = asyncio.gather(*(_exchange(r, w) for r, w in conns))
        deadline = time.monotonic() + 60
        while llm.stats()["in_flight"] < count and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        llm.release()
        statuses = list(await first)
        statuses += await asyncio.gather(*(_exchange(r, w) for r, w in conns))
        return statuses
    finally:
        for _, writer in conns:
            writer.close()
        await asyncio.gather(*(w.wait_closed() for _, w in conns), return_exceptions=True)


@pytest.mark.slow
def test_it_serves_250_concurrent_keep_alive_connections(sockets: None) -> None:
    with StandinLLM(latency_s=0.3) as llm:
        start = time.monotonic()
        statuses = asyncio.run(_two_waves(llm, 250))
        elapsed = time.monotonic() - start
        stats = llm.stats()
    assert statuses == [200] * 500
    assert stats["in_flight_peak"] == 250 and stats["connections_peak"] == 250
    assert stats["connections_accepted"] == 250  # the second wave reused every connection
    assert elapsed < 30.0  # one request at a time would take 500 * 0.3 = 150 s


def test_it_stops_at_once_while_requests_hang(sockets: None) -> None:
    llm = StandinLLM().start()
    llm.default_fault = Fault(hang=True)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            httpx.post(llm.url + "/v1/chat/completions", json=BODY, timeout=30)
        except httpx.HTTPError as exc:
            errors.append(exc)

    callers = [threading.Thread(target=call) for _ in range(5)]
    for caller in callers:
        caller.start()
    deadline = time.monotonic() + 60
    while llm.stats()["in_flight"] < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert llm.stats()["in_flight"] == 5
    start = time.monotonic()
    llm.stop()
    assert time.monotonic() - start < 5.0  # stop() itself gives up waiting after 10 s
    for caller in callers:
        caller.join(20)  # before the callers' own 30 s timeout: the server closed on them
    assert len(errors) == 5  # each hung client saw its connection closed, no answer


def test_it_answers_deterministically_and_records_requests(sockets: None) -> None:
    with StandinLLM() as llm, httpx.Client() as client:
        url = llm.url + "/chat/completions"
        first = client.post(url, json=BODY, headers={"Authorization": "Bearer sk-x"}).json()
        second = client.post(url, json=BODY).json()
        missing = client.get(llm.url + "/nowhere")
        stats = client.get(llm.url + "/_stats").json()
    assert first["choices"][0]["message"] == second["choices"][0]["message"]
    assert "`a/b.py`" in first["choices"][0]["message"]["content"]
    assert missing.status_code == 404
    assert stats["requests"] == 2
    recorded = llm.requests
    assert recorded[0].headers["authorization"] == "[redacted]" and recorded[0].auth_present
    assert not recorded[1].auth_present
    assert openai_chat_errors(recorded[0].body) == []


@pytest.mark.slow
def test_it_runs_on_its_own_from_the_command_line(subprocesses: None) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.testing.standin_llm", "--port", "0", "--latency-s", "0.01"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("standin-llm listening on http://127.0.0.1:")
        url = line.rsplit(" ", 1)[1].strip()
        answer = httpx.post(
            url + "/v1/messages", json=BODY, headers={"anthropic-version": "2023-06-01"}
        )
        assert answer.json()["type"] == "message"
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
        if proc.stdout is not None:
            proc.stdout.close()
