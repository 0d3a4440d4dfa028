// CompactingSession against a real serve and workers: compactions arrive in the background and
// apply when the agent next asks for its messages; undo, a restore on the service, a
// compaction on demand, a rejected snapshot; and with no service at all, nothing waits.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { CompactingSession, CompactorClient, applyCompaction, type WireMessage } from "../src/index.js";
import { client, conversationId, eventually, exchange, history, needsService, service } from "./support.js";

const quiet = { info: () => undefined, warn: () => undefined };

function isSummary(message: WireMessage): boolean {
  return String(message.content).startsWith("[compaction-worker summary]");
}

describe("a session against a real serve", { skip: needsService() }, () => {
  test("a compaction arrives in the background and applies when the agent asks for its messages", async () => {
    const session = new CompactingSession(conversationId("session"), { client: client(), model: "gpt-4.1", logger: quiet });
    try {
      const full = history(8);
      session.extend(full);
      assert.ok(await session.waitSettled(120_000), JSON.stringify(session.status));
      assert.equal(session.messages.length, full.length, "nothing applied before it is asked for");
      const request = session.requestMessages();
      assert.ok(request.length < full.length);
      assert.equal(request.filter(isSummary).length, 1);
      const [compaction] = session.compactions;
      assert.ok(compaction);
      assert.deepEqual(request, applyCompaction(full, compaction));
      const status = session.status;
      assert.equal(status.eventsApplied, 1);
      assert.equal(status.lastSubmittedRevision, 0);
      assert.equal(status.pendingSubmits, 0);
      // the agent goes on: its new turns survive the next compaction, which describes the
      // history with the first applied
      session.extend(history(6, { from: 8 }));
      assert.ok(await session.waitSettled(120_000));
      const next = session.requestMessages();
      assert.equal(session.status.eventsApplied, 2);
      assert.equal(next.filter(isSummary).length, 1, "the second summary folds the first in");
      assert.deepEqual(next.at(-1), exchange(13)[1]);
    } finally {
      await session.close();
    }
  });

  test("a restore on the service undoes the compaction here too; undo does it locally", async () => {
    const api = client();
    const id = conversationId("undo");
    const session = new CompactingSession(id, { client: api, logger: quiet });
    try {
      const full = history(8);
      session.extend(full);
      assert.ok(await session.waitSettled(120_000));
      assert.ok(session.requestMessages().length < full.length);
      const [applied] = session.compactions;
      assert.ok(applied);
      await api.restore(id, applied.event_id);
      await eventually("the revert applied", () => {
        session.drain();
        return session.status.compactionsUndone === 1;
      });
      assert.deepEqual(session.messages, full);
      assert.deepEqual(session.compactions, []);
      // the restored history goes out with the next turn, and is compacted anew
      const more = [...full, { role: "user", content: "Go on." }];
      session.extend([{ role: "user", content: "Go on." }]);
      assert.ok(await session.waitSettled(120_000));
      assert.ok(session.requestMessages().length < more.length);
      assert.equal(session.status.eventsApplied, 2);
      assert.deepEqual(await session.undo(), more);
      assert.equal(session.status.compactionsUndone, 2);
    } finally {
      await session.close();
    }
  });

  test("compact now with instructions, through the session", async () => {
    const api = client();
    const id = conversationId("session-now");
    const session = new CompactingSession(id, { client: api, logger: quiet });
    try {
      session.extend(history(5, { words: 50 })); // below the threshold
      const request = await session.compact("keep the module names");
      const event = await api.waitFor(id, { requestId: request.request_id, timeoutMs: 120_000 });
      assert.equal(event.type, "compaction.completed");
      await eventually("the requested compaction applied", () => session.requestMessages().some(isSummary));
    } finally {
      await session.close();
    }
  });

  test("a snapshot the worker rejects is counted, the agent carries on", async () => {
    const session = new CompactingSession(conversationId("rejected"), { client: client(), logger: quiet });
    try {
      session.extend([{ role: "tool", tool_call_id: "call_nobody_made", content: "orphan" }]);
      assert.ok(await session.waitSettled(60_000));
      assert.equal(session.status.snapshotsRejected, 1);
      assert.match(session.status.lastRejection ?? "", /tool_call_id|call/);
      assert.equal(session.requestMessages().length, 1);
    } finally {
      await session.close();
    }
  });

  test("a session on a conversation the service knows newer revisions of sends after them", async () => {
    const api = client();
    const id = conversationId("superseded");
    await api.submit({ conversation_id: id, revision: 41, messages: [{ role: "user", content: "earlier" }] });
    const session = new CompactingSession(id, { client: api, logger: quiet });
    try {
      session.extend([{ role: "user", content: "now" }]);
      assert.ok(await session.waitSettled(60_000));
      assert.equal(session.status.lastSubmittedRevision, 42);
    } finally {
      await session.close();
    }
  });
});

describe("a session with no service", () => {
  test("extend and requestMessages return while every submit fails; the status says why", async () => {
    const s = service();
    const down = new CompactorClient({ baseUrl: "http://127.0.0.1:9", apiKey: s?.key ?? "key-0123456789abcdef" });
    const session = new CompactingSession("c-down", { client: down, logger: quiet });
    try {
      for (let turn = 0; turn < 20; turn++) {
        session.extend(exchange(turn, 20));
        assert.equal(session.requestMessages().length, 2 * (turn + 1));
      }
      await eventually("a failed submit", () => session.status.submitFailures > 0);
      assert.equal(session.status.retrying, true);
      assert.match(session.status.lastError ?? "", /^unreachable: /);
      assert.ok(session.status.pendingSubmits > 0);
      assert.ok(session.status.snapshotsReplaced > 0, "only the newest unsent snapshot is kept");
    } finally {
      await session.close(0);
    }
  });

  test("a message that is not JSON is refused by extend, naming it", () => {
    const session = new CompactingSession("c-bad", { client: new CompactorClient({ baseUrl: "http://127.0.0.1:9" }), logger: quiet });
    assert.throws(
      () => session.extend([{ role: "user", content: "x" }, { role: "user", content: new Date() as unknown as string }]),
      (e: unknown) => e instanceof Error && "field" in e && e.field === "messages[1].content",
    );
    void session.close(0);
  });
});
