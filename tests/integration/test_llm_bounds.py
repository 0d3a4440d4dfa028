"""The LLM summarizer's bounds, chunking, merging, incremental summaries and prompt, over real
sockets against the stand-in provider."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from worker.config import LLMConfig
from worker.errors import SummaryError
from worker.summarize import SUMMARY_MARKER, SummaryRequest
from worker.summarize.llm import TAIL_CHARS, LLMSummarizer
from worker.summarize.prompt import CUT_NOTE, SECTIONS, VERBATIM_TAIL
from worker.testing.standin_llm import Fault, RecordedRequest, StandinLLM, standin_summary
from worker.tokens import count_tokens
from worker.wire.models import Message, ToolCall

KEY_ENV = "TEST_LLM_KEY"
PART = re.compile(r"is part (\d+) of (\d+)")


@pytest.fixture(scope="module")
def server(sockets: None) -> Iterator[StandinLLM]:
    with StandinLLM() as llm:
        yield llm


@pytest.fixture
def llm(server: StandinLLM) -> StandinLLM:
    server.reset()
    return server


def make(server: StandinLLM, provider: str = "openai", **overrides: object) -> LLMSummarizer:
    base = server.anthropic_base_url if provider == "anthropic" else server.openai_base_url
    fields: dict[str, object] = {
        "provider": provider,
        "base_url": base,
        "api_key_env": KEY_ENV,
        # No test here is about time: wide, so that a busy machine (the stand-in answers from a
        # thread of this process) never turns a slow answer into a retry or a failure.
        "timeout_s": 60.0,
        "deadline_s": 120.0,
        "backoff_base_s": 0.01,
    }
    fields.update(overrides)
    return LLMSummarizer(LLMConfig.model_validate(fields), environ={KEY_ENV: "sk-bounds-test-key"})


def conversation(turns: int, *, filler_chars: int = 300) -> list[Message]:
    """Turns of user / assistant tool call / tool result, each carrying a TURN-<i> marker."""
    out: list[Message] = []
    for i in range(turns):
        filler = ("lorem ipsum dolor sit amet " * (filler_chars // 27 + 1))[:filler_chars]
        call = ToolCall(id=f"call_{i}", name="read_file", arguments=f'{{"path": "src/mod_{i}.py"}}')
        out += [
            Message(id=f"u{i}", role="user", content=f"TURN-{i} {filler}", source_index=3 * i),
            Message(
                id=f"a{i}",
                role="assistant",
                content="reading",
                tool_calls=(call,),
                source_index=3 * i + 1,
            ),
            Message(
                id=f"t{i}",
                role="tool",
                content=f"RESULT-{i} of src/mod_{i}.py: {filler}",
                tool_call_id=f"call_{i}",
                tool_name="read_file",
                source_index=3 * i + 2,
            ),
        ]
    return out


def request(messages: list[Message], **overrides: object) -> SummaryRequest:
    fields: dict[str, object] = {
        "conversation_id": "c-1",
        "revision": 3,
        "messages": messages,
        "max_input_chars": 4000,
        "max_output_tokens": 300,
        "source_tokens": 1_000_000,
        "model": "gpt-4.1",
    }
    fields.update(overrides)
    return SummaryRequest.model_validate(fields)


def chars(messages: list[Message]) -> int:
    return sum(len(m.content) + sum(len(c.arguments) for c in m.tool_calls) for m in messages)


def assert_bounds(llm: StandinLLM, req: SummaryRequest, text: str, tokens: int) -> None:
    assert llm.requests, "no request reached the provider"
    for recorded in llm.requests:
        assert len(recorded.user_text) <= req.max_input_chars
        assert recorded.max_tokens is not None
        assert recorded.max_tokens <= req.max_output_tokens
    assert count_tokens(text, req.model) == tokens <= req.max_output_tokens
    assert text.split("\n", 1)[0] == SUMMARY_MARKER


def part_of(recorded: RecordedRequest) -> tuple[int, int] | None:
    found = PART.search(recorded.system_text)
    return (int(found[1]), int(found[2])) if found else None


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_range_that_fits_takes_one_call_within_both_bounds(
    llm: StandinLLM, provider: str
) -> None:
    req = request(conversation(3))
    with make(llm, provider) as summarizer:
        summary = summarizer.summarize(req)
    assert len(llm.requests) == 1
    assert_bounds(llm, req, summary.text, summary.tokens)
    assert (summary.source, summary.chunks, summary.truncated) == ("llm", 1, False)
    assert llm.requests[0].max_tokens == req.max_output_tokens  # sent as given
    sent = llm.requests[0].user_text
    assert '[tool call read_file id=call_2] {"path": "src/mod_2.py"}' in sent
    assert "[tool result read_file id=call_2]" in sent
    assert "`src/mod_2.py`" in summary.text  # the stand-in's answer made it through


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_range_ten_times_the_input_bound_is_chunked_in_order_and_merged(
    llm: StandinLLM, provider: str
) -> None:
    messages = conversation(40, filler_chars=500)
    req = request(messages)
    assert chars(messages) >= 10 * req.max_input_chars
    with make(llm, provider) as summarizer:
        summary = summarizer.summarize(req)
    assert_bounds(llm, req, summary.text, summary.tokens)
    chunk_calls = sorted((p, r) for r in llm.requests if (p := part_of(r)))
    assert summary.chunks == len(chunk_calls) >= 10
    # Every turn reached exactly one chunk call, in order, and nothing was dropped.
    seen = [int(n) for _, r in chunk_calls for n in re.findall(r"TURN-(\d+)", r.user_text)]
    assert seen == list(range(40))
    newest = chunk_calls[-1][1]
    assert "RESULT-39" in newest.user_text  # the last tool result is the newest content
    merges = [r for r in llm.requests if part_of(r) is None]
    assert merges, "partial summaries were never merged"
    # The newest chunk's partial summary (the stand-in echoes such ids) reached the final merge.
    assert "RESULT-39" in merges[-1].user_text


def test_partials_that_do_not_fit_one_merge_are_merged_hierarchically(llm: StandinLLM) -> None:
    req = request(conversation(60, filler_chars=300), max_input_chars=2000)
    with make(llm) as summarizer:
        summary = summarizer.summarize(req)
    assert_bounds(llm, req, summary.text, summary.tokens)
    merges = [r for r in llm.requests if part_of(r) is None]
    assert len(merges) > 1
    assert "RESULT-59" in merges[-1].user_text


def test_a_message_larger_than_the_bound_is_split_not_cut(llm: StandinLLM) -> None:
    huge = "\n".join(f"line {i} of the log" for i in range(1500)) + "\nFINAL-1 src/last.py"
    messages = [Message(id="t", role="user", content=huge, source_index=0)]
    req = request(messages, max_input_chars=2000)
    with make(llm) as summarizer:
        summary = summarizer.summarize(req)
    assert_bounds(llm, req, summary.text, summary.tokens)
    chunks = [r for r in llm.requests if part_of(r)]
    assert len(chunks) >= len(huge) // 2000
    assert any("[continued]" in r.user_text for r in chunks)
    assert any("FINAL-1 src/last.py" in r.user_text for r in chunks)


def test_the_previous_summary_is_updated_not_resummarized(llm: StandinLLM) -> None:
    previous = f"{SUMMARY_MARKER}\n## Artifacts and files touched\n- `src/old.py` edited"
    messages = [Message(id="u", role="user", content="now edit src/new.py", source_index=0)]
    req = request(messages, previous_summary=previous)
    with make(llm) as summarizer:
        summary = summarizer.summarize(req)
    (sent,) = llm.requests
    assert (
        "<summary-so-far>\n## Artifacts and files touched\n- `src/old.py` edited" in sent.user_text
    )
    assert SUMMARY_MARKER not in sent.user_text
    assert "Update it with <conversation>" in sent.system_text
    assert "`src/old.py`" in summary.text and "`src/new.py`" in summary.text  # facts accumulate
    assert summary.text.count(SUMMARY_MARKER) == 1


def test_a_previous_summary_too_large_to_ride_along_is_summarized_first(llm: StandinLLM) -> None:
    previous = "## Progress\n" + "\n".join(f"- step {i} in src/old_{i}.py" for i in range(150))
    req = request(conversation(2), previous_summary=previous, max_input_chars=1000)
    with make(llm) as summarizer:
        summary = summarizer.summarize(req)
    assert_bounds(llm, req, summary.text, summary.tokens)
    first = min((p, r.user_text) for r in llm.requests if (p := part_of(r)))
    assert first[0][0] == 1 and "[earlier summary]" in first[1]


def test_must_keep_items_are_passed_and_the_answer_is_the_models_own(llm: StandinLLM) -> None:
    """The checklist goes in the request; the summary is what the model wrote, nothing added:
    the pipeline scores that text first and repairs it only after (worker/core/fidelity.py)."""
    keep = ["ModuleNotFoundError: No module named 'yaml'", "src/mod_1.py", "pytest -x tests/"]
    req = request(conversation(2), must_keep=keep)
    with make(llm) as summarizer:
        summary = summarizer.summarize(req)
    sent = llm.requests[0].user_text
    assert "<must-keep>\n- ModuleNotFoundError: No module named 'yaml'\n" in sent
    answer = llm.requests[0]
    expected = standin_summary(answer.user_text, answer.max_tokens or 0)
    assert summary.text == f"{SUMMARY_MARKER}\n{expected}"
    assert "pytest -x tests/" not in summary.text  # the model left it out; we add nothing
    assert count_tokens(summary.text, req.model) == summary.tokens <= req.max_output_tokens


def test_an_answer_over_the_bound_is_cut_at_a_token_boundary(llm: StandinLLM) -> None:
    llm.enqueue(Fault(text=" ".join(f"word{i}" for i in range(2000))))  # finish_reason: stop
    req = request(conversation(2), max_output_tokens=100)
    with make(llm) as summarizer:
        summary = summarizer.summarize(req)
    assert summary.truncated is True
    assert_bounds(llm, req, summary.text, summary.tokens)
    assert summary.tokens >= 95  # cut near the bound, not far below it
    assert "word0 word1 word2".startswith(summary.text.split("\n", 1)[1][:17])


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_an_answer_the_server_cut_ends_at_its_last_sentence(llm: StandinLLM, provider: str) -> None:
    """``finish_reason: length`` / ``stop_reason: max_tokens``: the fragment after the last
    complete sentence is dropped, the summary says it was cut, and ``truncated`` is true."""
    llm.enqueue(Fault(text="## Goal\nFix the parser. It fails on empty inp", overlong=True))
    req = request(conversation(2))
    with make(llm, provider) as summarizer:
        summary = summarizer.summarize(req)
    assert summary.truncated is True
    assert summary.text == f"{SUMMARY_MARKER}\n## Goal\nFix the parser.\n{CUT_NOTE}"
    assert_bounds(llm, req, summary.text, summary.tokens)


def test_a_partial_the_server_cut_marks_the_summary_truncated(llm: StandinLLM) -> None:
    llm.enqueue(Fault(text="- `src/mod_0.py` read. Then the tests fai", overlong=True))
    req = request(conversation(12), max_input_chars=1500)
    with make(llm) as summarizer:
        summary = summarizer.summarize(req)
    assert summary.chunks > 1 and summary.truncated is True
    sent = [r.user_text for r in llm.requests]
    assert any("- `src/mod_0.py` read.\n</part>" in text for text in sent)  # merged, trimmed
    assert not any("tests fai" in text for text in sent)  # the fragment never went on
    assert CUT_NOTE not in summary.text  # the final answer itself was complete


def test_our_wrapper_tags_never_reach_the_summary(llm: StandinLLM) -> None:
    echoed = "<part>\n## Goal\n- fix `src/a.py`\n</part>\n<must-keep>\n</must-keep></conversation>"
    llm.enqueue(Fault(text=echoed))
    with make(llm) as summarizer:
        summary = summarizer.summarize(request(conversation(2)))
    assert summary.text == f"{SUMMARY_MARKER}\n## Goal\n- fix `src/a.py`"
    assert summary.truncated is False


def test_a_summary_longer_than_the_text_it_replaces_is_refused(llm: StandinLLM) -> None:
    req = request(conversation(2), source_tokens=20)
    with make(llm) as summarizer, pytest.raises(SummaryError) as caught:
        summarizer.summarize(req)
    assert caught.value.code == "summary_too_long"


def test_the_prompt_asks_for_a_structured_continuity_summary(llm: StandinLLM) -> None:
    req = request(conversation(1))
    extra = "Always name the Jira ticket."
    with make(llm, extra_instruction=extra) as summarizer:
        summarizer.summarize(req)
    system = llm.requests[0].system_text
    for section in SECTIONS:
        assert f"## {section}" in system
    assert "verbatim" in system
    assert system.rstrip().endswith(extra)
    assert len(llm.requests[0].user_text) <= req.max_input_chars  # instructions don't count


def test_max_completion_tokens_can_replace_max_tokens(llm: StandinLLM) -> None:
    req = request(conversation(1))
    with make(llm, max_tokens_field="max_completion_tokens") as summarizer:
        summarizer.summarize(req)
    body = llm.requests[0].body
    assert body["max_completion_tokens"] == req.max_output_tokens
    assert "max_tokens" not in body


def test_a_short_tail_joins_the_previous_part_instead_of_a_call_of_its_own(
    llm: StandinLLM,
) -> None:
    """One block a little over the input bound: its tail (under TAIL_CHARS) rides verbatim in
    the merge after the first part's summary; two calls, not three, and nothing lost."""
    lines = [f"line {i}: checked src/mod_{i}.py" for i in range(150)]
    block = Message(id="u0", role="user", content="\n".join(lines), source_index=0)
    req = request([block], max_input_chars=4000)
    with make(llm) as summarizer:
        summary = summarizer.summarize(req)
    assert_bounds(llm, req, summary.text, summary.tokens)
    assert len(llm.requests) == 2 and summary.chunks == 1
    chunk, merge = llm.requests
    assert part_of(chunk) == (1, 1) and "<part>" in merge.user_text
    tail = merge.user_text.split(VERBATIM_TAIL, 1)[1]
    assert "line 149: checked src/mod_149.py" in tail and len(tail) < TAIL_CHARS + 100
    assert "line 149:" not in chunk.user_text  # read once, in the merge


def test_the_usage_the_server_reported_is_recorded(llm: StandinLLM) -> None:
    answer = "## Goal\n- fix `src/a.py`"
    llm.enqueue(Fault(text=answer))
    with make(llm) as summarizer:
        summary = summarizer.summarize(request(conversation(2)))
    sent = llm.requests[0]
    assert summary.usage is not None and summary.usage.calls == 1
    # the stand-in counts a token per four characters: its count, not ours, is recorded
    assert summary.usage.output_tokens == len(answer) // 4
    assert summary.usage.input_tokens == len(sent.user_text) // 4
