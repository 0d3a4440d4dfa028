// Drives one conversation through the compaction proxy with the official `openai` package:
// a growing coding history (assistant tool calls, tool results), sent turn by turn with
// `client.chat.completions.create`, the last turn streamed. Between the first turn and the
// next ones it waits for the conversation's `compaction.completed` event (the compactor's own
// events API), so that the later turns are the ones a compaction applies to.
//
// Configuration (environment): COMPACTOR_BASE (the `compactor serve` URL), AGENT_KEY (the
// agent's own upstream key), COMPACTOR_KEY (the tenant's key), CONVERSATION (the id),
// TURNS (tool exchanges in the initial history, default 12).
// Prints one JSON object on stdout: what each call sent and what the SDK gave back.
import OpenAI from "openai";

const env = process.env;
const base = env.COMPACTOR_BASE;
const conversation = env.CONVERSATION;
const compactorKey = env.COMPACTOR_KEY;
const turns = Number(env.TURNS ?? "12");
if (!base || !conversation || !compactorKey || !env.AGENT_KEY) {
  console.error("COMPACTOR_BASE, AGENT_KEY, COMPACTOR_KEY and CONVERSATION are required");
  process.exit(2);
}

const client = new OpenAI({
  baseURL: `${base}/proxy/openai/v1`,
  apiKey: env.AGENT_KEY,
  maxRetries: 0,
  timeout: 60_000,
  defaultHeaders: {
    "X-Compactor-Conversation": conversation,
    "X-Compactor-Key": compactorKey,
  },
});

function toolExchange(k) {
  const id = `call${k}`;
  const words = Array.from({ length: 400 }, (_, i) => `token${k}_${i}`).join(" ");
  return [
    {
      role: "assistant",
      content: `Step ${k}.`,
      tool_calls: [
        {
          id,
          type: "function",
          function: { name: "bash", arguments: JSON.stringify({ command: `cat src/pkg/mod_${k}.py` }) },
        },
      ],
    },
    { role: "tool", tool_call_id: id, content: words },
  ];
}

const history = [
  { role: "system", content: "You are a coding agent." },
  { role: "user", content: "Fix the failing test in src/pkg/core.py." },
];
for (let k = 0; k < turns; k++) history.push(...toolExchange(k));

const calls = [];

async function send(stream) {
  const sent = structuredClone(history);
  if (!stream) {
    const reply = await client.chat.completions.create({ model: "gpt-4.1", messages: history });
    const message = reply.choices[0].message;
    calls.push({
      stream: false,
      sent,
      object: reply.object,
      id: reply.id,
      finish_reason: reply.choices[0].finish_reason,
      content: message.content,
      usage: reply.usage ?? null,
    });
    history.push({ role: "assistant", content: message.content });
    return;
  }
  const chunks = await client.chat.completions.create({
    model: "gpt-4.1",
    messages: history,
    stream: true,
  });
  let text = "";
  let count = 0;
  let finish = null;
  let object = null;
  for await (const chunk of chunks) {
    count += 1;
    object = chunk.object;
    for (const choice of chunk.choices ?? []) {
      text += choice.delta?.content ?? "";
      finish = choice.finish_reason ?? finish;
    }
  }
  calls.push({ stream: true, sent, object, chunks: count, finish_reason: finish, content: text });
  history.push({ role: "assistant", content: text });
}

async function waitCompleted(timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  const url = `${base}/v1/conversations/${encodeURIComponent(conversation)}/events`;
  while (Date.now() < deadline) {
    const r = await fetch(url, { headers: { Authorization: `Bearer ${compactorKey}` } });
    if (r.status === 200) {
      const events = await r.json();
      const done = events.find((e) => e.type === "compaction.completed");
      if (done) return done;
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`no compaction.completed for ${conversation}`);
}

await send(false); // nothing to apply yet: submitted as revision 1
const completed = await waitCompleted(40_000);
history.push({ role: "user", content: "Now run the tests." });
await send(false);
history.push(...toolExchange(turns));
await send(false);
history.push({ role: "user", content: "And commit." });
await send(true);
console.log(
  JSON.stringify({
    node: process.version,
    sdk: OpenAI.VERSION ?? null,
    completed_revision: completed.revision,
    replacement_last: completed.compaction?.replacement?.at(-1) ?? null,
    calls,
  }),
);
