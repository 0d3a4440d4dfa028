// One behaviour in two languages: the fixtures of tests/fixtures/conformance, which
// tests/unit/test_conformance.py runs against the Python package, run against this client.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  CompactorError,
  applyCompaction,
  canonicalJson,
  derivedMessageId,
  isCompleted,
  parseEvent,
  rangeDigest,
  sha256Hex,
  signWebhook,
  sourceIds,
  verifyWebhook,
  type CompactionEvent,
  type WireMessage,
} from "../src/index.js";
import { fixture } from "./support.js";

interface Expected {
  messages?: WireMessage[];
  error?: string;
  field?: string;
}

/** What applyCompaction answers, in the fixtures' terms. */
function outcome(messages: WireMessage[], event: unknown, conversationId?: string): Expected {
  try {
    const options = conversationId === undefined ? {} : { conversationId };
    return { messages: applyCompaction(messages, event as CompactionEvent, options) };
  } catch (error) {
    if (!(error instanceof CompactorError)) throw error;
    // the field an invalid snapshot names is the service's; an invalid event's is our own
    return error.code === "invalid_snapshot" ? { error: error.code, field: error.field ?? "" } : { error: error.code };
  }
}

describe("apply", () => {
  const cases = fixture<{ name: string; messages: WireMessage[]; event: unknown; conversation_id?: string; expected: Expected }[]>(
    "apply.json",
  );
  for (const c of cases) {
    test(c.name, () => {
      const before = structuredClone(c.messages);
      const got = outcome(c.messages, c.event, c.conversation_id);
      assert.deepEqual(got, c.expected);
      assert.deepEqual(c.messages, before, "the messages given are left as they were");
    });
  }
});

describe("sequences", () => {
  const cases = fixture<
    {
      name: string;
      conversation_id: string;
      messages: WireMessage[];
      events: unknown[];
      expected: { messages: WireMessage[]; applied: string[]; skipped: string[] };
    }[]
  >("sequences.json");
  for (const c of cases) {
    test(c.name, () => {
      let messages = c.messages;
      const applied: string[] = [];
      const skipped: string[] = [];
      for (const raw of c.events) {
        const event = parseEvent(raw);
        if (!isCompleted(event)) continue;
        try {
          messages = applyCompaction(messages, event, { conversationId: c.conversation_id });
          applied.push(event.event_id);
        } catch (error) {
          if (!(error instanceof CompactorError)) throw error;
          skipped.push(event.event_id);
        }
      }
      assert.deepEqual({ messages, applied, skipped }, c.expected);
    });
  }
});

describe("canonical JSON", () => {
  const cases = fixture<{ name: string; value: unknown; canonical: string; sha256: string }[]>("canonical.json");
  for (const c of cases) {
    test(c.name, () => {
      const text = canonicalJson(c.value);
      assert.equal(text, c.canonical);
      assert.equal(sha256Hex(text), c.sha256);
      if (Array.isArray(c.value)) assert.equal(rangeDigest(c.value), c.sha256);
    });
  }
});

describe("derived ids", () => {
  const data = fixture<{
    messages: { index: number; message: unknown; id: string }[];
    histories: { messages: unknown[]; ids: string[] }[];
    invalid: { messages: unknown[]; expected: { error: string; field: string } }[];
  }>("derived_ids.json");
  test("of single messages", () => {
    for (const m of data.messages) assert.equal(derivedMessageId(m.index, m.message), m.id);
  });
  test("of histories", () => {
    for (const h of data.histories) assert.deepEqual(sourceIds(h.messages), h.ids);
  });
  test("refused as the service refuses them", () => {
    for (const h of data.invalid) {
      assert.throws(
        () => sourceIds(h.messages),
        (error: unknown) => error instanceof CompactorError && error.code === h.expected.error && error.field === h.expected.field,
      );
    }
  });
});

describe("webhook signatures", () => {
  interface Signed {
    secret: string;
    timestamp: number;
    body?: string;
    body_base64?: string;
    header: string;
  }
  interface Verification {
    name: string;
    secret: string;
    header: string;
    body: string;
    now: number;
    tolerance_s: number;
    valid: boolean;
  }
  const data = fixture<{ signatures: Signed[]; verifications: Verification[] }>("webhooks.json");
  const bodyOf = (c: { body?: string; body_base64?: string }): Uint8Array =>
    c.body_base64 !== undefined ? Buffer.from(c.body_base64, "base64") : Buffer.from(c.body ?? "", "utf8");
  test("signed as the service signs", () => {
    for (const c of data.signatures) {
      assert.equal(signWebhook(c.secret, c.timestamp, bodyOf(c)), c.header);
      assert.ok(verifyWebhook(c.secret, c.header, bodyOf(c), { now: c.timestamp }));
    }
  });
  for (const c of data.verifications) {
    test(`verify: ${c.name}`, () => {
      const valid = verifyWebhook(c.secret, c.header, bodyOf(c), { now: c.now, toleranceS: c.tolerance_s });
      assert.equal(valid, c.valid);
    });
  }
});
