"""The LLM summarizer: bounded input, bounded output, incremental, resilient.

Concurrency: one event loop per process, in a background thread
----------------------------------------------------------------
Celery runs tasks as plain synchronous functions, so :meth:`LLMSummarizer.summarize` is a sync
facade, safe to call from many threads at once (run the worker with ``--pool threads`` and a
concurrency of a few hundred to keep that many summaries in flight). Behind it, each process
has one asyncio event loop in a daemon thread holding one long-lived connection pool
(``httpx.AsyncClient`` s, ``max_concurrency`` connections, HTTP/1.1 keep-alive; see
:class:`~worker.summarize.resilience.ClientPool` for why it is sharded); callers hand their
requests over with ``run_coroutine_threadsafe`` and block on the future.

We chose this over the other known-good shape (the threads pool sharing a sync
``httpx.Client``) because:

- **Hard deadlines.** ``asyncio.timeout`` cancels an attempt wherever it is, so a provider that
  hangs or trickles bytes cannot hold a call past ``timeout_s`` or the summary past
  ``deadline_s``; httpx's sync timeouts are per socket operation and a slow drip resets them.
  Cancelling also closes the connection at once instead of leaving it to be garbage collected.
- **Parallel chunks.** A range larger than the input bound becomes several chunk calls; on the
  loop they run together (bounded by ``max_concurrency``), so a 10x range costs about two model
  latencies, not eleven, without a second thread pool.
- **Cheap waiting.** Hundreds of in-flight requests are coroutines and sockets on one thread;
  the calling threads only wait on a future. The same pool serves every caller, so connections
  are reused across tasks.
- **One place for shared state.** The circuit breaker and the connection-slot semaphore live on
  the loop, so every call in the process sees the same provider health.

Measured (``bench/llm_concurrency_bench.py``, BENCHMARKS.md): against a 2 s provider one process
sustains 200 summaries in flight at ~87 summaries/s (ideal 100) with ~2.5 ms of client CPU per
summary, and memory flat across waves.

Fork safety: nothing starts until the first call, and the loop, the client and the breaker
belong to the PID that made them. A child created by ``fork`` (Celery's prefork pool) builds its
own on first use and never touches the parent's sockets (it keeps the inherited objects
referenced, unclosed, since closing them could disturb the parent's connections).

Keep one summarizer per worker process and :meth:`~LLMSummarizer.close` it at shutdown: the
connection pool and the circuit breaker are per instance.

Errors (``code``), besides the transport ones listed in :mod:`.resilience`:
``summary_too_long`` (SummaryError: the summary has more tokens than the text it replaces, or
``max_output_tokens`` leaves no room), ``input_bound_too_small`` (SummaryError:
``max_input_chars`` below :data:`MIN_INPUT_CHARS`), ``llm_bad_config`` (LLMPermanentError: the
key is not a valid header value), ``llm_closed`` (LLMTransientError: used after, or interrupted
by, :meth:`~LLMSummarizer.close`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import weakref
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from worker.config import LLMConfig
from worker.errors import (
    CompactorError,
    ConfigError,
    LLMPermanentError,
    LLMTransientError,
    SummaryError,
)
from worker.summarize import SUMMARY_MARKER, SummaryRequest
from worker.summarize import prompt as P
from worker.summarize.providers import Answer, HttpCall, Prompt, Provider, provider_for
from worker.summarize.resilience import (
    CircuitBreaker,
    ClientPool,
    Deadline,
    ResilientSender,
    RetryPolicy,
    Secret,
    scrub,
)
from worker.tokens import count_tokens, cut_to_tokens, encoding_name_for_model, get_encoding
from worker.tokens.bounds import SEGMENT_CHARS
from worker.wire.events import LLMUsage, Summary

log = logging.getLogger(__name__)
T = TypeVar("T")

MIN_INPUT_CHARS = 512  # below this not even the wrappers and one line of text fit
_GRACE_S = 1.0  # the loop enforces deadlines itself; this only guards against a stuck loop
_CLOSE_TIMEOUT_S = 5.0
# A chunk shorter than this (a split block's tail, typically) is cheaper read verbatim in the
# merge than summarized by a call of its own: a partial summary is about as long.
TAIL_CHARS = 1300
_POLL_S = 5.0  # how often a waiting caller looks again at a deadline its calls may move
_HINT_SHARE = 0.85  # the token budget we *ask* for, leaving room for the marker and repairs
# Runtimes inherited from a parent process: kept referenced so they are never finalized here.
_INHERITED: list[_Runtime] = []


class LLMSummarizer:
    """Summarizes a range with the configured LLM; see the module docstring for concurrency."""

    def __init__(self, config: LLMConfig, *, environ: Mapping[str, str] | None = None) -> None:
        if config.provider == "anthropic" and (config.temperature or 0.0) > 1.0:
            raise ConfigError("llm.temperature", "must be at most 1 for the anthropic provider")
        self._config = config
        self._environ: Mapping[str, str] = os.environ if environ is None else environ
        self._provider: Provider = provider_for(config)
        self._policy = RetryPolicy(
            timeout_s=config.timeout_s,
            max_retries=config.max_retries,
            backoff_base_s=config.backoff_base_s,
            backoff_max_s=config.backoff_max_s,
        )
        self._breaker = self._new_breaker()
        self._templates = prompt_templates(config)
        self._lock = threading.Lock()
        self._runtime: _Runtime | None = None
        self._closed = False
        _reset_in_child(self)

    @property
    def circuit_state(self) -> str:
        """``closed``, ``open`` or ``half_open``: this process's view of the provider."""
        return self._breaker.state

    def summarize(self, request: SummaryRequest) -> Summary:
        """A summary within both bounds of ``request``, or a CompactorError."""
        deadline = Deadline.after(self._config.deadline_s)
        secret = self._api_key()
        if request.max_input_chars < MIN_INPUT_CHARS:
            raise SummaryError(
                f"max_input_chars must be at least {MIN_INPUT_CHARS}", code="input_bound_too_small"
            )
        job = _Job(self, request, deadline=deadline, secret=secret)
        body, chunks = job.run()
        summary = _finish(body, request, chunks=chunks, cut=job.cut)
        summary = summary.model_copy(update={"usage": job.usage, "model": self._config.model})
        log.debug(
            "LLM summary for %s@%d: %d chunks, %d tokens%s",
            request.conversation_id,
            request.revision,
            chunks,
            summary.tokens,
            " (truncated)" if summary.truncated else "",
        )
        return summary

    def close(self) -> None:
        """Close the connections and stop the loop thread (idempotent)."""
        with self._lock:
            self._closed = True
            runtime, self._runtime = self._runtime, None
        if runtime is not None and runtime.pid == os.getpid():
            runtime.close()

    def __enter__(self) -> LLMSummarizer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- internals used by _Job ---------------------------------------------------------------

    @property
    def config(self) -> LLMConfig:
        return self._config

    def template_for(self, conversation_id: str) -> str:
        """The prompt template of the conversation's tenant (its internal id's prefix, as
        ``compactor serve`` names conversations), else ``[llm] prompt_file``'s, else ours."""
        tenant, colon, _ = conversation_id.partition(":")
        if colon and tenant in self._templates:
            return self._templates[tenant]
        return self._templates.get("", P.DEFAULT_TEMPLATE)

    def complete(
        self, prompts: Sequence[Prompt], *, deadline: Deadline, secret: Secret | None
    ) -> list[Answer]:
        """The model's answers to ``prompts`` (sent concurrently), in order."""
        calls = [self._provider.build(p, secret.reveal() if secret else None) for p in prompts]
        runtime = self._runtime_here()
        coro = _send_all(runtime.sender, calls, self._provider, deadline=deadline, secret=secret)
        return runtime.wait(coro, deadline=deadline)

    def _api_key(self) -> Secret | None:
        # Read at call time, so a rotated key is picked up without a restart.
        name = self._config.api_key_env
        value = self._environ.get(name, "").strip()
        if not value:
            return None  # local OpenAI-compatible servers need none; providers answer 401
        if not (value.isascii() and value.isprintable()):
            raise LLMPermanentError(
                f"the API key in ${name} is not a valid HTTP header value", code="llm_bad_config"
            )
        return Secret(value)

    def _runtime_here(self) -> _Runtime:
        runtime = self._runtime
        if runtime is not None and runtime.pid == os.getpid():
            return runtime
        with self._lock:
            if self._closed:
                # Transient: the worker is shutting down; the task can run again elsewhere.
                raise LLMTransientError("the LLM summarizer is closed", code="llm_closed")
            if self._runtime is None or self._runtime.pid != os.getpid():
                if self._runtime is not None:
                    _INHERITED.append(self._runtime)
                self._runtime = _Runtime(self._config, self._policy, self._breaker)
            return self._runtime

    def _new_breaker(self) -> CircuitBreaker:
        return CircuitBreaker(self._config.circuit_failure_threshold, self._config.circuit_reset_s)

    def _after_fork_in_child(self) -> None:
        # Runs in the child right after fork, before any other thread exists there: a lock held
        # by a parent thread at fork time would otherwise never be released.
        self._lock = threading.Lock()
        self._breaker = self._new_breaker()
        if self._runtime is not None:
            _INHERITED.append(self._runtime)
            self._runtime = None


def _reset_in_child(summarizer: LLMSummarizer) -> None:
    ref = weakref.ref(summarizer)

    def after_fork() -> None:
        alive = ref()
        if alive is not None:
            alive._after_fork_in_child()

    os.register_at_fork(after_in_child=after_fork)


# --- the loop thread -----------------------------------------------------------------------


class _Runtime:
    """One process's event loop thread, connection pool and sender."""

    def __init__(self, config: LLMConfig, policy: RetryPolicy, breaker: CircuitBreaker) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="llm-summarizer-loop", daemon=True)
        self.thread.start()
        self.sender: ResilientSender = self.submit(self._open(config, policy, breaker)).result()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def _open(
        self, config: LLMConfig, policy: RetryPolicy, breaker: CircuitBreaker
    ) -> ResilientSender:
        # Made on the loop thread: the clients and the semaphore belong to this loop.
        self.pool = ClientPool(
            max_concurrency=config.max_concurrency,
            timeout_s=config.timeout_s,
            connect_timeout_s=config.connect_timeout_s,
        )
        return ResilientSender(self.pool, policy, breaker, max_concurrency=config.max_concurrency)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def wait(self, coro: Coroutine[Any, Any, T], *, deadline: Deadline) -> T:
        future = self.submit(coro)
        while True:
            remaining = deadline.remaining()  # infinite while a call waits for our own slot
            try:
                return future.result(timeout=max(0.0, min(remaining, _POLL_S)) + _GRACE_S)
            except concurrent.futures.TimeoutError:
                if deadline.remaining() > -_GRACE_S:
                    continue  # not yet, or moved on by time its calls spent queued
                future.cancel()
                raise LLMTransientError("the summary deadline passed", code="llm_timeout") from None
            except concurrent.futures.CancelledError:  # close() ran while this call was in flight
                raise LLMTransientError(
                    "the LLM summarizer was closed", code="llm_closed"
                ) from None

    def close(self) -> None:
        try:
            self.submit(self._shutdown()).result(timeout=_CLOSE_TIMEOUT_S)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=_CLOSE_TIMEOUT_S)
            if not self.thread.is_alive():
                self.loop.close()

    async def _shutdown(self) -> None:
        current = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not current]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await self.pool.aclose()
        await self.loop.shutdown_default_executor()  # getaddrinfo runs in the default executor


async def _send_all(
    sender: ResilientSender,
    calls: Sequence[HttpCall],
    provider: Provider,
    *,
    deadline: Deadline,
    secret: Secret | None,
) -> list[Answer]:
    """All answers in order, or the most telling error once every call has ended.

    Calls are not cancelled when a sibling fails: in a half-open breaker one of them is the
    probe, and cancelling it would keep the breaker from ever closing for chunked ranges.
    """
    results = await asyncio.gather(
        *(sender.send(c, provider.parse, deadline=deadline, secret=secret) for c in calls),
        return_exceptions=True,
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise _most_telling(errors)
    return [r for r in results if isinstance(r, Answer)]


def _most_telling(errors: list[BaseException]) -> BaseException:
    """A provider's own error over ``circuit_open`` (which only says someone else failed)."""
    ours = [e for e in errors if isinstance(e, CompactorError)]
    if not ours:
        return errors[0]
    return next((e for e in ours if e.code != "circuit_open"), ours[0])


# --- one summary ---------------------------------------------------------------------------


class _Job:
    """One request's calls: a single call when the range fits, else chunks then merges."""

    def __init__(
        self,
        owner: LLMSummarizer,
        request: SummaryRequest,
        *,
        deadline: Deadline,
        secret: Secret | None,
    ) -> None:
        self.owner = owner
        self.request = request
        self.deadline = deadline
        self.secret = secret
        self.budget = request.max_input_chars
        self.items = [scrub(i, secret) for i in _distinct(request.must_keep)]
        self.must_keep = P.must_keep_block(self.items, self.budget // 4)
        previous = P.strip_marker(request.previous_summary or "")
        self.previous: str | None = scrub(previous, secret) or None
        self.template = owner.template_for(request.conversation_id)
        self.focus = scrub(request.instructions, secret) if request.instructions else None
        self.cut = False  # an answer (final or partial) was cut by the server's output limit
        self.usage = LLMUsage()

    def run(self) -> tuple[str, int]:
        """The final answer's text and how many chunks the range took."""
        # The agent may have printed the key into its own conversation; it goes nowhere from here.
        blocks = [scrub(P.render_message(m), self.secret) for m in self.request.messages]
        whole = P.conversation_message(
            "\n\n".join(blocks), previous=self.previous, must_keep=self.must_keep
        )
        if len(whole) <= self.budget:
            task = P.single_task(updating=self.previous is not None)
            return self._final(task, whole), 1
        if self.previous is not None and len(self.previous) > self.budget // 4:
            # Too large to ride along as context: summarize it in order, as the oldest text.
            blocks.insert(0, f"[earlier summary]\n{self.previous}")
            self.previous = None
        partials = self._chunk_pass(blocks)
        return self._merge(partials), len(partials)

    def _chunk_pass(self, blocks: list[str]) -> list[str]:
        empty = P.conversation_message("", previous=None, must_keep="")
        packed = P.pack(blocks, self.budget - len(empty) - len(self.must_keep))
        chunks, tails = self._short_tails(packed)
        max_tokens = self._partial_tokens(len(chunks))
        prompts = [
            self._prompt(P.chunk_task(i, len(chunks)), self._chunk_message(chunk), max_tokens)
            for i, chunk in enumerate(chunks)
        ]
        partials = self._partials(prompts)
        cap = self._partial_cap()
        for i, tail in tails.items():
            # verbatim after the partial it follows, the partial shortened to make room for it
            block = f"{P.VERBATIM_TAIL}\n{tail}"
            partials[i] = f"{P.shorten(partials[i], cap - len(block) - 2)}\n\n{block}"
        return partials

    def _short_tails(self, packed: list[str]) -> tuple[list[str], dict[int, str]]:
        """The chunks to summarize, and the short ones (a split block's tail, under
        :data:`TAIL_CHARS`) that join the previous chunk's partial verbatim instead of costing
        a model call of their own (only where they take at most half a partial's room)."""
        limit = min(TAIL_CHARS, self._partial_cap() // 2)
        chunks: list[str] = []
        tails: dict[int, str] = {}
        for chunk in packed:
            index = len(chunks) - 1
            if chunks and len(chunk) < limit and index not in tails:
                tails[index] = chunk
            else:
                chunks.append(chunk)
        return chunks, tails

    def _chunk_message(self, chunk: str) -> str:
        mk = P.must_keep_block(P.relevant(self.items, chunk), len(self.must_keep))
        return P.conversation_message(chunk, previous=None, must_keep=mk)

    def _merge(self, partials: list[str]) -> str:
        """Merge partial summaries, in rounds of bounded calls until one call takes them all."""
        while True:
            whole = P.merge_message(partials, previous=self.previous, must_keep=self.must_keep)
            if len(whole) <= self.budget:
                return self._final(P.merge_task(updating=self.previous is not None), whole)
            groups = self._groups(partials)
            max_tokens = self._partial_tokens(len(groups))
            prompts = [
                self._prompt(P.merge_task(updating=False), self._group_message(g), max_tokens)
                for g in groups
            ]
            partials = self._partials(prompts)

    def _group_message(self, group: list[str]) -> str:
        mk = P.must_keep_block(P.relevant(self.items, "\n".join(group)), len(self.must_keep))
        return P.merge_message(group, previous=None, must_keep=mk)

    def _groups(self, partials: list[str]) -> list[list[str]]:
        """Consecutive partials packed into merge calls; each holds at least two of them."""
        room = self.budget - len(self.must_keep)
        groups: list[list[str]] = [[]]
        for partial in partials:
            candidate = [*groups[-1], partial]
            if groups[-1] and len(P.merge_message(candidate, previous=None, must_keep="")) > room:
                groups.append([partial])
            else:
                groups[-1] = candidate
        return groups

    def _partial_cap(self) -> int:
        # Two partials (plus the earlier summary and must-keeps) always fit one merge call, so
        # every merge round at least halves their number and the rounds end.
        both = P.merge_message(["", ""], previous=self.previous, must_keep=self.must_keep)
        return (self.budget - len(both)) // 2

    def _partial_tokens(self, count: int) -> int:
        """``max_tokens`` for a partial: about its share of the next merge call (~4 chars a token).

        At least a quarter of the input bound: squeezing many partials into one merge would
        lose detail; an extra merge round costs one model latency.
        """
        share = min(self._partial_cap(), max(self.budget // max(count, 1), self.budget // 4)) // 4
        ceiling = self.request.max_output_tokens
        return max(min(ceiling, 64), min(ceiling, share))

    def _partials(self, prompts: list[Prompt]) -> list[str]:
        answers = self._complete(prompts)
        cap = self._partial_cap()
        return [P.shorten(self._text(a), cap) for a in answers]

    def _final(self, task: str, user: str) -> str:
        max_tokens = self.request.max_output_tokens
        prompt = self._prompt(task, user, max_tokens)
        answer = self._complete([prompt])[0]
        text = self._text(answer)
        return f"{text}\n{P.CUT_NOTE}" if answer.cut else text

    def _text(self, answer: Answer) -> str:
        """The answer's text, without our marker and wrapper tags; a cut one ends at its last
        complete sentence (the rest would be a fragment)."""
        text = _clean(answer.text, self.secret)
        if answer.cut:
            self.cut = True
            text = P.to_last_sentence(text)
        return text

    def _prompt(self, task: str, user: str, max_tokens: int) -> Prompt:
        if len(user) > self.budget:  # by construction never; a bug must not break the bound
            raise SummaryError("internal: a request exceeded max_input_chars", code="input_bound")
        hint = max(1, int(max_tokens * _HINT_SHARE))
        system = P.system_prompt(
            task,
            budget_tokens=hint,
            extra=self.owner.config.extra_instruction,
            template=self.template,
            focus=self.focus,
        )
        return Prompt(system=system, user=user, max_tokens=max_tokens)

    def _complete(self, prompts: list[Prompt]) -> list[Answer]:
        answers = self.owner.complete(prompts, deadline=self.deadline, secret=self.secret)
        for answer in answers:
            self.usage = _counted(self.usage, answer)
        return answers


# --- the answer ----------------------------------------------------------------------------


def prompt_templates(config: LLMConfig) -> dict[str, str]:
    """The operator's prompt templates, read once: ``""`` -> ``prompt_file``'s, tenant ->
    its own; ConfigError naming the setting when a file cannot be read or is too long."""
    files: dict[str, tuple[str, Path]] = {}
    if config.prompt_file is not None:
        files[""] = ("llm.prompt_file", config.prompt_file)
    for tenant, path in config.tenant_prompt_files.items():
        files[tenant] = (f"llm.tenant_prompt_files.{tenant}", path)
    templates = {}
    for name, (key, path) in files.items():
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(key, f"cannot read {path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(key, f"{path} is not UTF-8 text") from None
        if len(text) > P.MAX_TEMPLATE_CHARS:
            raise ConfigError(key, f"at most {P.MAX_TEMPLATE_CHARS} characters (got {len(text)})")
        templates[name] = text
    return templates


def _counted(usage: LLMUsage, answer: Answer) -> LLMUsage:
    def plus(total: int | None, more: int | None) -> int | None:
        return more if total is None else total + (more or 0)

    return LLMUsage(
        calls=usage.calls + 1,
        input_tokens=plus(usage.input_tokens, answer.input_tokens),
        output_tokens=plus(usage.output_tokens, answer.output_tokens),
    )


def _clean(answer: str, secret: Secret | None) -> str:
    return scrub(P.strip_wrappers(P.strip_marker(answer)), secret)


def _finish(body: str, request: SummaryRequest, *, chunks: int, cut: bool) -> Summary:
    """Marker + the model's own answer within ``max_output_tokens``.

    Nothing of ours is added but the note that the server cut the answer: the pipeline scores
    this text against ``min_summary_fidelity`` and only then repairs what it lacks
    (worker/core/fidelity.py), so a repair can never lift a poor answer over the gate."""
    model = request.model
    limit = request.max_output_tokens
    if count_tokens(SUMMARY_MARKER + "\n", model) >= limit:
        raise SummaryError(
            "max_output_tokens leaves no room for a summary", code="summary_too_long"
        )
    text, truncated = fit_tokens(f"{SUMMARY_MARKER}\n{body}", limit, model)
    tokens = count_tokens(text, model)
    if tokens > request.source_tokens:
        raise SummaryError(
            f"the summary ({tokens} tokens) is longer than the text it replaces "
            f"({request.source_tokens} tokens)",
            code="summary_too_long",
        )
    return Summary(
        text=text, tokens=tokens, source="llm", truncated=truncated or cut, chunks=chunks
    )


def fit_tokens(text: str, limit: int, model: str | None) -> tuple[str, bool]:
    """``text`` cut at a token boundary to at most ``limit`` tokens; (text, was_cut)."""
    enc = get_encoding(encoding_name_for_model(model))
    if len(text) > SEGMENT_CHARS:
        # A long answer (up to max_response_bytes): tokenize only the prefix that can stay.
        head, was_cut = cut_to_tokens(text, limit, model)
        if not was_cut:
            return text, False
        cut = head.rstrip()
        while cut and len(enc.encode(cut, disallowed_special=())) > limit:
            cut = cut[:-1]
        return cut, True
    ids = enc.encode(text, disallowed_special=())
    if len(ids) <= limit:
        return text, False
    keep = limit
    while keep > 0:
        # A token may end inside a multi-byte character: drop the incomplete bytes, re-check.
        cut = enc.decode_bytes(ids[:keep]).decode("utf-8", errors="ignore").rstrip()
        if len(enc.encode(cut, disallowed_special=())) <= limit:
            return cut, True
        keep -= 1
    return "", True


def _distinct(items: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for item in items:
        clean = item.strip()
        if clean and clean not in seen:
            seen.add(clean)
            out.append(clean)
    return out
