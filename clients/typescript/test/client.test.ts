// The client against a real `compactor serve`, Redis and workers (tests/integration/test_typescript_client.py
// starts them): every route it speaks, its errors, and following events over SSE through a
// connection that is cut.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { describe, test } from "node:test";

import {
  CompactorClient,
  CompactorError,
  EventMismatch,
  InvalidSnapshot,
  applyCompaction,
  isCompleted,
  isCompactorError,
  type CompletedEvent,
  type StreamEvent,
  type WireMessage,
} from "../src/index.js";
import { CuttingRelay, client, conversationId, eventually, history, needsService, service } from "./support.js";

const skip = needsService();

/** A conversation over the threshold, submitted, and its compaction. */
async function compactedConversation(
  name: string,
  options: { config?: Record<string, boolean> } = {},
): Promise<{ id: string; messages: WireMessage[]; event: StreamEvent }> {
  const api = client();
  const id = conversationId(name);
  const messages = history(8, { ids: true });
  const snapshot = { conversation_id: id, revision: 1, messages, model: { name: "gpt-4.1" } };
  const submitted = await api.submit(options.config ? { ...snapshot, config: options.config } : snapshot);
  assert.deepEqual(submitted, { status: "queued", revision: 1 });
  const event = await api.waitFor(id, { revision: 1, timeoutMs: 120_000 });
  return { id, messages, event };
}

describe("the client against a real serve", { skip }, () => {
  test("submit, wait for the outcome, apply it: the service and this client agree", async () => {
    const api = client();
    const { id, messages, event } = await compactedConversation("apply");
    assert.equal(event.type, "compaction.completed");
    assert.ok(isCompleted(event));
    const applied = applyCompaction(messages, event, { conversationId: id });
    assert.ok(applied.length < messages.length);
    assert.match(String(applied.find((m) => String(m.content).startsWith("[compaction-worker summary]"))?.content), /summary/);
    // the service's own application of its compactions gives the same history
    const compacted = await api.compacted(id, messages);
    assert.equal(compacted.applied, 1);
    assert.deepEqual(compacted.messages, applied);
    // and the events route lists what waitFor saw, with its stream id
    const events = await api.events(id);
    assert.deepEqual(
      events.find((e) => e.event_id === event.event_id),
      event,
    );
    assert.throws(() => applyCompaction(applied, event), EventMismatch); // applied already
  });

  test("follow resumes from Last-Event-ID after the connection is cut: nothing missed, nothing twice", async () => {
    const s = service();
    assert.ok(s);
    const relay = new CuttingRelay(new URL(s.base));
    const viaRelay = new CompactorClient({ baseUrl: await relay.start(), apiKey: s.key });
    const api = client();
    const id = conversationId("follow");
    const small = (revision: number): WireMessage[] => [{ role: "user", content: `turn ${revision}` }];
    await api.submit({ conversation_id: id, revision: 1, messages: small(1) });
    const stop = new AbortController();
    const seen: StreamEvent[] = [];
    const errors: CompactorError[] = [];
    const following = (async () => {
      for await (const event of viaRelay.follow(id, { signal: stop.signal, onError: (e) => errors.push(e) })) {
        seen.push(event);
      }
    })();
    try {
      await eventually("the first outcome", () => seen.some((e) => e.revision === 1));
      relay.cut(); // mid-stream
      for (let revision = 2; revision <= 4; revision++) {
        await api.submit({ conversation_id: id, revision, messages: small(revision) });
        await api.waitFor(id, { revision, timeoutMs: 60_000 });
      }
      await eventually("the outcomes of revisions 2-4", () => seen.some((e) => e.revision === 4));
      relay.cut();
      await api.submit({ conversation_id: id, revision: 5, messages: small(5) });
      await eventually("the outcome of revision 5", () => seen.some((e) => e.revision === 5));
    } finally {
      stop.abort();
      await following;
      await relay.stop();
    }
    const all = await api.events(id);
    assert.deepEqual(
      seen.map((e) => e.stream_id),
      all.map((e) => e.stream_id),
    );
    assert.deepEqual(seen, all);
    assert.ok(errors.length >= 2, "each cut was seen and recovered from");
    const resumed = relay.requests.filter((r) => /^last-event-id: /im.test(r));
    assert.ok(resumed.length >= 2, relay.requests.join("\n---\n"));
    const first = seen.find((e) => e.revision === 1);
    assert.ok(resumed.some((r) => r.toLowerCase().includes(`last-event-id: ${first?.stream_id}`)));
  });

  test("compact now with instructions: the outcome answers the request, the text never in an event", async () => {
    const api = client();
    const id = conversationId("now");
    await api.submit({ conversation_id: id, revision: 1, messages: history(5, { words: 50 }) });
    await api.waitFor(id, { revision: 1 }); // below the threshold: skipped
    const instructions = "keep the failing test names, and café ☕";
    const request = await api.compactNow(id, { instructions });
    assert.equal(request.status, "requested");
    assert.equal(request.revision, 1);
    const event = await api.waitFor(id, { requestId: request.request_id, timeoutMs: 120_000 });
    assert.equal(event.type, "compaction.completed");
    const trigger = (event as CompletedEvent).trigger;
    assert.equal(trigger.kind, "requested");
    assert.equal(trigger.request_id, request.request_id);
    assert.equal(trigger.instructions_sha256, createHash("sha256").update(instructions, "utf8").digest("hex"));
    assert.ok(!JSON.stringify(await api.events(id)).includes("keep the failing test names"));
  });

  test("restore (undo) on the service: the reverted event, and the full history goes whole again", async () => {
    const api = client();
    const { id, messages, event } = await compactedConversation("restore");
    const reverted = await api.restore(id, event.event_id, { reason: "trying it" });
    assert.equal(reverted.type, "compaction.reverted");
    assert.equal(reverted.reverted_event_id, event.event_id);
    assert.equal(reverted.reason, "trying it");
    assert.equal((await api.compacted(id, messages)).applied, 0);
    await assert.rejects(api.restore(id, event.event_id), (e: unknown) => isCompactorError(e, "not_found") && e.status === 404);
  });

  test("the original of a compaction, a transcript, and recall of one message", async () => {
    const api = client();
    const { id, messages, event } = await compactedConversation("recall");
    assert.ok(isCompleted(event) && event.compaction.transcript);
    assert.deepEqual(await api.original(event), messages);
    const transcript = await api.transcript(id, event.revision, event.compaction.transcript.sha256);
    assert.equal(transcript.conversation_id, id);
    await assert.rejects(api.transcript(id, event.revision, "0".repeat(64)), EventMismatch);
    const replaced = messages[event.compaction.start + 1];
    assert.ok(replaced && typeof replaced.id === "string");
    const recalled = await api.recall(id, replaced.id);
    assert.deepEqual(recalled.message, replaced);
    assert.equal(recalled.event_id, event.event_id);
    await assert.rejects(api.recall(id, "no-such-message"), (e: unknown) => isCompactorError(e, "not_found"));
  });

  test("review: a held compaction approved with an edit, another declined", async () => {
    const api = client();
    const held = await compactedConversation("approve", { config: { review: true } });
    assert.equal(held.event.type, "compaction.proposed");
    const summary = "[compaction-worker summary]\nThe agent read eight modules; the test still fails.";
    const approved = await api.approve(held.id, held.event.event_id, { summary });
    assert.equal(approved.type, "compaction.completed");
    assert.equal(approved.approved_by, "api");
    assert.ok(approved.compaction.summary.text.startsWith(summary));
    assert.ok(applyCompaction(held.messages, approved).length < held.messages.length);
    await assert.rejects(api.approve(held.id, held.event.event_id), (e: unknown) => isCompactorError(e, "not_held") && e.status === 409);

    const other = await compactedConversation("decline", { config: { review: true } });
    const declined = await api.reject(other.id, other.event.event_id, { reason: "keep the plan" });
    assert.equal(declined.type, "compaction.declined");
    assert.equal(declined.proposal_event_id, other.event.event_id);
    assert.equal(declined.reason, "keep the plan");
  });

  test("errors are typed values naming the API's error code", async () => {
    const s = service();
    assert.ok(s);
    const api = client();
    const id = conversationId("errors");
    await api.submit({ conversation_id: id, revision: 3, messages: [{ role: "user", content: "hi" }] });
    const wrongKey = new CompactorClient({ baseUrl: s.base, apiKey: "not-a-key-0123456789" });
    await assert.rejects(wrongKey.events(id), (e: unknown) => isCompactorError(e, "unauthorized") && e.status === 401);
    // another tenant's conversation does not exist for this one
    const other = client({ key: s.otherKey });
    await assert.rejects(other.events(id), (e: unknown) => isCompactorError(e, "not_found") && e.status === 404);
    await assert.rejects(api.events(id, { after: "12-x" }), (e: unknown) => isCompactorError(e, "invalid_request") && e.status === 422);
    await assert.rejects(
      api.compactNow(id, { instructions: "x".repeat(2001) }),
      (e: unknown) => isCompactorError(e, "invalid_request") && e.field === "instructions",
    );
    const superseded = await api.submit({ conversation_id: id, revision: 2, messages: [{ role: "user", content: "old" }] });
    assert.deepEqual(superseded, { status: "superseded", revision: 3 });
    // refused here, before any request, naming the field as the service does
    await assert.rejects(
      api.submit({ conversation_id: "-bad", revision: 1, messages: [] }),
      (e: unknown) => e instanceof InvalidSnapshot && e.field === "conversation_id",
    );
    await assert.rejects(
      api.submit({ conversation_id: id, revision: -1, messages: [] }),
      (e: unknown) => e instanceof InvalidSnapshot && e.field === "revision",
    );
    await assert.rejects(
      api.submit({ conversation_id: id, revision: 4, messages: [{ role: "user", content: "x", score: Number.NaN }] }),
      (e: unknown) => e instanceof InvalidSnapshot && e.field === "messages[0].score",
    );
    const down = new CompactorClient({ baseUrl: "http://127.0.0.1:9", apiKey: s.key });
    await assert.rejects(down.events(id), (e: unknown) => isCompactorError(e, "unreachable") && (e as CompactorError).transient);
  });
});
