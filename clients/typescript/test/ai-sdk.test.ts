// The Vercel AI SDK adapter with the SDK itself (`ai`, from the npm registry): its own
// ModelMessage type on both sides of the conversion, its wire form accepted by a real worker,
// and 40 turns of the SDK's own `generateText` agent loop (a tool call and an answer per
// turn, from the SDK's MockLanguageModelV3 as the stand-in model) kept bounded by a real
// serve and workers, and never blocked, not even while `compactor serve` is stopped.

import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { describe, test } from "node:test";

import { generateText, jsonSchema, stepCountIs, tool, type ModelMessage } from "ai";
import { MockLanguageModelV3 } from "ai/test";

import { compactingPrepareStep, fromWire, toWire } from "../src/ai-sdk.js";
import { CompactingSession, type WireMessage } from "../src/index.js";
import { client, conversationId, needsService, service } from "./support.js";

const quiet = { info: () => undefined, warn: () => undefined };

/** Every kind of message and part the adapter converts, typed as the SDK types them. */
const everything: ModelMessage[] = [
  { role: "system", content: "You are a coding agent.", providerOptions: { anthropic: { cacheControl: { type: "ephemeral" } } } },
  { role: "user", content: "Fix the failing test." },
  {
    role: "user",
    content: [
      { type: "text", text: "Here is the screenshot and the log:", providerOptions: { openai: { detail: "low" } } },
      { type: "image", image: "https://example.com/screen.png" },
      { type: "image", image: "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==", mediaType: "image/png" },
      { type: "file", data: "JVBERi0xLjQK", mediaType: "application/pdf", filename: "log.pdf" },
      { type: "file", data: "https://example.com/spec.pdf", mediaType: "application/pdf" },
    ],
  },
  {
    role: "assistant",
    content: [
      { type: "reasoning", text: "The test reads a price.", providerOptions: { anthropic: { signature: "EqQBCgIYAh==" } } },
      { type: "text", text: "Reading the module." },
      { type: "tool-call", toolCallId: "call_1", toolName: "read_file", input: { path: "src/pricing.py", limit: 1.5e-7 } },
      { type: "tool-call", toolCallId: "call_2", toolName: "grep", input: { pattern: "round(" }, providerExecuted: false },
    ],
  },
  {
    role: "tool",
    content: [
      { type: "tool-result", toolCallId: "call_1", toolName: "read_file", output: { type: "text", value: "def price(x):\n    return round(x, 2)" } },
      { type: "tool-result", toolCallId: "call_2", toolName: "grep", output: { type: "json", value: { hits: ["src/pricing.py:2"], count: 1 } } },
    ],
  },
  {
    role: "assistant",
    content: [
      { type: "text", text: "Running both." },
      { type: "reasoning", text: "first" },
      { type: "reasoning", text: "second" },
      { type: "tool-call", toolCallId: "call_3", toolName: "bash", input: { command: "pytest" } },
      { type: "tool-call", toolCallId: "call_4", toolName: "bash", input: { command: "rm -rf build" } },
      { type: "tool-call", toolCallId: "call_5", toolName: "screenshot", input: {} },
    ],
  },
  { role: "tool", content: [{ type: "tool-result", toolCallId: "call_3", toolName: "bash", output: { type: "error-text", value: "1 failed" } }] },
  {
    role: "tool",
    content: [
      { type: "tool-result", toolCallId: "call_4", toolName: "bash", output: { type: "execution-denied", reason: "not allowed" } },
      {
        type: "tool-result",
        toolCallId: "call_5",
        toolName: "screenshot",
        output: {
          type: "content",
          value: [
            { type: "text", text: "the page" },
            { type: "image-data", data: "iVBORw0KGgo=", mediaType: "image/png" },
          ],
        },
      },
    ],
  },
  { role: "assistant", content: "The rounding is fixed.", providerOptions: { openai: { itemId: "msg_123" } } },
];

describe("the AI SDK's messages", () => {
  test("convert to the wire and back without loss, typed as the SDK types them", () => {
    const wire = toWire(everything);
    const back: ModelMessage[] = fromWire(wire);
    assert.deepEqual(back, everything);
    // the readable parts are where the worker reads them
    const assistant = wire.find((m) => m.role === "assistant" && Array.isArray(m.tool_calls));
    assert.equal(assistant?.reasoning_content, "The test reads a price.");
    assert.deepEqual((assistant?.tool_calls as WireMessage[])[0], {
      id: "call_1",
      type: "function",
      function: { name: "read_file", arguments: JSON.stringify({ path: "src/pricing.py", limit: 1.5e-7 }) },
    });
    assert.equal(wire.filter((m) => m.role === "tool").length, 5, "one tool message per result");
  });

  test("bytes go as base64 and come back as base64", () => {
    const bytes = new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0, 255]);
    const message: ModelMessage = { role: "user", content: [{ type: "image", image: bytes, mediaType: "image/png" }] };
    const [back] = fromWire(toWire([message]));
    assert.deepEqual(back, { role: "user", content: [{ type: "image", image: Buffer.from(bytes).toString("base64"), mediaType: "image/png" }] });
  });

  test("a compaction's summary and a stripped call read as AI SDK messages", () => {
    const back = fromWire([
      { role: "user", content: "[compaction-worker summary]\n## Goal\nFix the test." },
      { role: "assistant", content: null, tool_calls: [{ id: "c9", type: "function", function: { name: "bash", arguments: '{"_compacted": "arguments stripped"}' } }] },
      { role: "tool", tool_call_id: "c9", content: "[compacted: tool output stripped]", x_ai_sdk: { toolName: "bash", output: "json", first: true } },
    ]);
    assert.deepEqual(back, [
      { role: "user", content: "[compaction-worker summary]\n## Goal\nFix the test." },
      { role: "assistant", content: [{ type: "tool-call", toolCallId: "c9", toolName: "bash", input: { _compacted: "arguments stripped" } }] },
      { role: "tool", content: [{ type: "tool-result", toolCallId: "c9", toolName: "bash", output: { type: "text", value: "[compacted: tool output stripped]" } }] },
    ]);
  });

  test("the wire form is a snapshot a real worker accepts", { skip: needsService() }, async () => {
    const api = client();
    const id = conversationId("ai-sdk-wire");
    await api.submit({ conversation_id: id, revision: 1, messages: toWire(everything) });
    const outcome = await api.waitFor(id, { revision: 1, timeoutMs: 120_000 });
    assert.notEqual(outcome.type, "compaction.rejected", JSON.stringify(outcome));
  });
});

/** What the model's tool reads: about 500 tokens a file, every one different. */
function fileText(path: string): string {
  return Array.from({ length: 20 }, (_, i) => `${path}:${i}: value_${i} = compute(${i}, "${path}")`).join("\n");
}

/** The stand-in model: asked a task, it reads a file; given the file, it answers. */
function standInModel(): MockLanguageModelV3 {
  const usage = {
    inputTokens: { total: 10, noCache: 10, cacheRead: undefined, cacheWrite: undefined },
    outputTokens: { total: 5, text: 5, reasoning: undefined },
  };
  let calls = 0;
  return new MockLanguageModelV3({
    doGenerate: async ({ prompt }) => {
      calls += 1;
      const last = prompt.at(-1);
      if (last?.role === "tool") {
        return { content: [{ type: "text", text: `Read it; next (${calls}).` }], finishReason: { unified: "stop", raw: "stop" }, usage, warnings: [] };
      }
      const input = JSON.stringify({ path: `src/module_${calls}.py` });
      return {
        content: [{ type: "tool-call", toolCallId: `call_${calls}`, toolName: "read_file", input }],
        finishReason: { unified: "tool-calls", raw: "tool_calls" },
        usage,
        warnings: [],
      };
    },
  });
}

describe("a 40-turn generateText agent loop", { skip: needsService() }, () => {
  test("stays bounded, and is never blocked, not even with the serve stopped", async () => {
    const s = service();
    assert.ok(s);
    const session = new CompactingSession(conversationId("ai-sdk-loop"), {
      client: client({ timeoutMs: 5000 }),
      model: "gpt-4.1",
      logger: quiet,
    });
    const prepare = compactingPrepareStep(session);
    // each step's prompt, and how long the adapter took to give it (ms): it never waits
    const prompts: { turn: number; frozen: boolean; ms: number; messages: WireMessage[] }[] = [];
    const turnMs: { turn: number; frozen: boolean; ms: number }[] = [];
    let turn = 0;
    let frozen = false;
    const prepareStep = ({ messages }: { messages: ModelMessage[] }): { messages: ModelMessage[] } => {
      const started = performance.now();
      const given = prepare({ messages });
      const ms = performance.now() - started;
      prompts.push({ turn, frozen, ms, messages: toWire(given.messages) });
      return given;
    };
    const tools = {
      read_file: tool({
        description: "Read a file of the repository.",
        inputSchema: jsonSchema<{ path: string }>({ type: "object", properties: { path: { type: "string" } }, required: ["path"] }),
        execute: async ({ path }: { path: string }) => fileText(path),
      }),
    };
    const model = standInModel();
    const history: ModelMessage[] = [];
    const frozenTurns = new Set([20, 21, 22, 23, 24]);
    try {
      for (turn = 0; turn < 40; turn++) {
        if (frozenTurns.has(turn) && !frozen && s.servePid !== null) {
          process.kill(s.servePid, "SIGSTOP"); // the service cannot answer anything now
          frozen = true;
        }
        history.push({ role: "user", content: `Task ${turn}: read the next module.` });
        const started = performance.now();
        const result = await generateText({ model, tools, messages: history, prepareStep, stopWhen: stepCountIs(4) });
        turnMs.push({ turn, frozen, ms: performance.now() - started });
        history.push(...result.response.messages);
        assert.equal(result.steps.length, 2, "a tool call, then the answer");
        if (frozen && !frozenTurns.has(turn + 1)) {
          process.kill(s.servePid ?? 0, "SIGCONT");
          frozen = false;
        }
        if (!frozen) assert.ok(await session.waitSettled(120_000), JSON.stringify(session.status));
      }
    } finally {
      if (frozen && s.servePid !== null) process.kill(s.servePid, "SIGCONT");
      await session.close();
    }
    const status = session.status;
    const report = process.env.COMPACTOR_TEST_AGENT_LOOP_REPORT;
    if (report) writeFileSync(report, JSON.stringify({ threshold: s.threshold, prompts, turnMs, history: toWire(history), status }));
    assert.equal(history.length, 40 * 4, "the agent keeps its whole history");
    assert.ok(status.eventsApplied >= 5, JSON.stringify(status));
    assert.equal(status.compactionsSkipped, 0, JSON.stringify(status));
    // Bounded: after the first compaction arrived, no prompt the model was given is much
    // larger than the largest before it (the history at the threshold, plus a turn), while the
    // agent's own history grew to many times that. (Sizes in characters of the wire JSON;
    // tests/integration/test_typescript_client.py counts the same prompts' tokens as the worker does.)
    const size = (messages: readonly unknown[]): number => JSON.stringify(messages).length;
    const summarized = (p: (typeof prompts)[number]): boolean =>
      p.messages.some((m) => String(m.content).startsWith("[compaction-worker summary]"));
    const first = prompts.findIndex(summarized);
    assert.ok(first > 0);
    const before = Math.max(...prompts.slice(0, first).map((p) => size(p.messages)));
    const after = prompts.slice(first);
    const settled = after.filter((p) => !p.frozen).map((p) => size(p.messages));
    const sizes = prompts.map((p) => size(p.messages)).join(",");
    assert.ok(Math.max(...settled) < 1.5 * before, `${before} before the first compaction: ${sizes}`);
    assert.ok(size(toWire(history)) > 5 * before, `the history: ${size(toWire(history))}`);
    // Never blocked: no step waited for the service (a stopped one included), and a turn with
    // the serve stopped took as long as any other (the stand-in model answers at once).
    assert.ok(Math.max(...prompts.map((p) => p.ms)) < 250, prompts.map((p) => p.ms.toFixed(1)).join(","));
    assert.ok(Math.max(...turnMs.map((t) => t.ms)) < 1000, JSON.stringify(turnMs));
    // With the serve stopped, the turns went on (each prompt the history so
    // far, nothing new applied), and the first turn after it came back compacted again.
    if (s.servePid !== null) {
      const frozenPrompts = after.filter((p) => p.frozen);
      assert.equal(frozenPrompts.length, 10);
      assert.ok(frozenPrompts.every((p, i) => i === 0 || size(p.messages) > size(frozenPrompts[i - 1]?.messages ?? [])));
      const resumed = after.find((p) => p.turn === 26);
      assert.ok(resumed && size(resumed.messages) < 1.5 * before, sizes);
    }
  });
});
