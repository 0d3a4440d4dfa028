"""The summarize step: the summary of the prepared range per ``mode`` (the LLM, the offline
digest, or the digest as the LLM's fallback), checked against the range's must-keep facts."""

from __future__ import annotations

from dataclasses import dataclass

from worker.config import CompactionConfig, LLMConfig
from worker.core import fidelity, provenance
from worker.errors import CompactorError
from worker.ops.tracing import AttributeValue, Telemetry
from worker.pipeline.prepare import PreparedCompaction
from worker.summarize import Summarizer, SummaryRequest
from worker.tokens import count_tokens
from worker.wire.events import Summary

# The section an LLM summary's missing must-keep items are appended under, after the gate.
MUST_KEEP_HEADING = "## Must keep (verbatim)"


@dataclass(frozen=True)
class LLMTracing:
    """How the LLM call is traced: a ``chat <model>`` span after the OpenTelemetry GenAI
    conventions, its latency the ``llm`` stage (added to ``timings`` when given)."""

    telemetry: Telemetry
    llm: LLMConfig
    timings: dict[str, float] | None = None

    def call(self, llm: Summarizer, request: SummaryRequest) -> Summary:
        model = self.llm.model
        attributes: dict[str, AttributeValue | None] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self.llm.provider,
            "gen_ai.request.model": model,
            "gen_ai.request.max_tokens": request.max_output_tokens,
            "gen_ai.conversation.id": request.conversation_id,
        }
        with self.telemetry.stage(
            "llm",
            span_name=f"chat {model}",
            kind="client",
            attributes=attributes,
            into=self.timings,
        ) as stage:
            summary = llm.summarize(request)
            # Counted by our tokenizer: the range sent, and the summary that came back.
            stage.set(
                {
                    "gen_ai.usage.input_tokens": request.source_tokens,
                    "gen_ai.usage.output_tokens": summary.tokens,
                }
            )
            return summary


def summarize(
    prepared: PreparedCompaction,
    config: CompactionConfig,
    *,
    llm: Summarizer | None,
    digest: Summarizer,
    traced: LLMTracing | None = None,
) -> Summary:
    """The summary per ``mode``, checked against the range's must-keep facts and repaired
    (``summary.fidelity``); raises CompactorError when ``remote_only`` cannot get one.
    ``traced``: the LLM call is traced and timed so."""
    mode = config.mode
    facts, carried = _must_keep_facts(prepared, config.delegation_tools)

    def checked(summary: Summary) -> Summary:
        request = prepared.request
        limit = request.max_output_tokens
        if summary.source == "llm":  # never longer than what it replaces, as llm.py enforces
            limit = min(limit, request.source_tokens)
        # Both summarizers count their text for request.model: not counted again.
        summary = fidelity.ensure(
            summary, facts, carried, limit=limit, model=request.model, tokens=summary.tokens
        )
        if summary.source == "llm":  # the digest says what it drew from; the LLM's is read
            summary = provenance.attribute(summary, provenance.anchors(facts, request.messages))
            summary = with_missing_items(summary, request.must_keep, limit, request.model)
        return summary

    def digested(reason: str | None) -> Summary:
        summary = digest.summarize(prepared.request)
        summary = summary.model_copy(update={"fallback_reason": reason}) if reason else summary
        return checked(summary)

    if mode == "local_only" or (llm is None and mode == "prefer_remote"):
        return digested(None if mode == "local_only" else "no LLM configured")
    if llm is None:
        raise CompactorError(
            "remote_only mode needs an LLM; none is configured", code="llm_not_configured"
        )
    try:
        if traced is None:
            summary = llm.summarize(prepared.request)
        else:
            summary = traced.call(llm, prepared.request)
    except CompactorError as exc:
        if mode == "remote_only":
            raise
        return digested(f"{exc.code}: {exc.message}")
    # The gate reads the model's own text: the summarizer adds nothing, and the repair below
    # runs only after, so nothing of ours can lift a poor answer over min_summary_fidelity.
    score = fidelity.score(facts, summary.text, carried)
    if mode == "prefer_remote" and score < config.min_summary_fidelity:
        return digested(
            f"summary_fidelity: the LLM summary kept {score:.0%} of the must-keep facts, "
            f"below min_summary_fidelity {config.min_summary_fidelity:g}"
        )
    return checked(summary)


def _must_keep_facts(
    prepared: PreparedCompaction, delegation_tools: list[str]
) -> tuple[list[fidelity.Fact], str]:
    """The range's must-keep facts (summarized and carried messages, in order) and the text of
    the carried messages they may be found in."""
    plan = prepared.plan
    request = prepared.request  # its messages: the very objects the digest and _must_keep saw
    facts = fidelity.extract_must_keep(request.messages, delegation_tools, plan.carried)
    return facts, fidelity.carried_text(plan.carried)


def with_missing_items(
    summary: Summary, items: list[str], limit: int, model: str | None
) -> Summary:
    """An LLM summary plus a final section with each must-keep item of the request (image and
    file placeholders, error lines) its text lacks, as many as fit in ``limit`` tokens. A
    repair: it runs after the fidelity gate, never before it."""
    present = _normalized(summary.text)
    missing = [i for i in dict.fromkeys(items) if i and _normalized(i) not in present]
    if not missing:
        return summary
    text, added = f"{summary.text}\n\n{MUST_KEEP_HEADING}", False
    for item in missing:
        candidate = f"{text}\n- {item}"
        if count_tokens(candidate, model) <= limit:
            text, added = candidate, True
    if not added:
        return summary
    return summary.model_copy(update={"text": text, "tokens": count_tokens(text, model)})


def _normalized(text: str) -> str:
    # Models reflow whitespace; a path or error is still kept if only its spacing changed.
    return " ".join(text.split())
