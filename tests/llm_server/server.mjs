// An OpenAI-compatible Chat Completions server on loopback, over node-llama-cpp's prebuilt
// llama.cpp (no C++ build): what tests/test_real_llm.py and bench/real_llm.py summarize with.
// It answers what worker/summarize/providers.py's OpenAIChat sends and reads:
//
//   POST /v1/chat/completions  {model, messages, max_tokens | max_completion_tokens, ...}
//        -> {choices: [{message: {content}, finish_reason: "stop" | "length"}], usage: {...}}
//   GET  /v1/models, GET /health  (readiness: the server listens only once the model is loaded)
//
// One request at a time (like llama-server with one slot: the others wait their turn), each in
// a chat session of its own on a fresh context sequence, so nothing is kept between requests.
// Greedy decoding (temperature 0, fixed seed): the same request gets the same answer. `usage`
// holds the model's own token counts. A client that disconnects aborts its generation.
// Each request is logged on stderr as JSON lines, sizes only (never the texts): "generating"
// (the messages' characters and the token bound asked for) and "answered" (finish reason and
// token counts), so that a test can see what crossed the wire and when.
//
// Usage: node server.mjs --model FILE.gguf [--port 0] [--threads N] [--ctx 8192] [--name ID]
// Once listening it prints one JSON line on stdout: {"url": "http://127.0.0.1:PORT/v1", ...};
// everything else goes to stderr. It downloads nothing: the binary must be the prebuilt one
// installed with the package (exit code 3 when it is missing or does not load).
import http from "node:http";
import { parseArgs } from "node:util";
import { getLlama, LlamaChatSession, LlamaLogLevel } from "node-llama-cpp";

const { values: opts } = parseArgs({
  options: {
    model: { type: "string" },
    port: { type: "string", default: "0" },
    // One thread unless told otherwise. llama.cpp's threads meet at a spinning barrier after
    // every step of every token, so each waits whenever another is off its core: on 2 busy
    // cores, 100 tokens took 2.4 CPU s (10 s) with 1 thread, 61 CPU s (253 s) with 2; with
    // node-llama-cpp's default (4 threads on 2 cores), 60 tokens took 199 s.
    threads: { type: "string", default: "1" },
    ctx: { type: "string", default: "8192" },
    name: { type: "string", default: "smollm2-135m-instruct" },
  },
});
const SEED = 42;
const MAX_BODY_BYTES = 8 * 1024 * 1024;
// Chat template tokens around each message (role markers, separators), added to the texts'
// own counts when checking that a request fits the context.
const PER_MESSAGE_TOKENS = 8;

function integer(name, text, least) {
  const value = Number(text);
  if (!Number.isInteger(value) || value < least) {
    console.error(`--${name} must be an integer of at least ${least}`);
    process.exit(2);
  }
  return value;
}

if (!opts.model) {
  console.error("--model FILE.gguf is required");
  process.exit(2);
}
const port = integer("port", opts.port, 0);
const threads = integer("threads", opts.threads, 1);
const contextSize = integer("ctx", opts.ctx, 256);

let llama;
try {
  // build "never" and skipDownload: use the prebuilt binary of @node-llama-cpp/linux-x64 or fail
  // here, never fetch llama.cpp's source nor compile it. gpu false: CPU only, probe nothing else.
  llama = await getLlama({
    gpu: false,
    build: "never",
    skipDownload: true,
    usePrebuiltBinaries: true,
    maxThreads: threads,
    logLevel: LlamaLogLevel.warn,
    progressLogs: false,
  });
} catch (error) {
  console.error(`no usable prebuilt llama.cpp binary (is @node-llama-cpp/linux-x64 installed?): ${error}`);
  process.exit(3);
}
const model = await llama.loadModel({ modelPath: opts.model, gpuLayers: 0 });
const context = await model.createContext({ contextSize, sequences: 1, threads });

class BadRequest extends Error {
  constructor(param, message, code = null) {
    super(message);
    this.param = param;
    this.code = code;
  }
}

function text(content, param) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content
      .map((part, i) => {
        if (part?.type !== "text" || typeof part.text !== "string") {
          throw new BadRequest(`${param}[${i}]`, "only text content parts are supported");
        }
        return part.text;
      })
      .join("");
  }
  throw new BadRequest(param, "content must be a string or a list of text parts");
}

// The request's messages as node-llama-cpp's chat history, the last user message apart.
function conversation(messages) {
  if (!Array.isArray(messages) || messages.length === 0) {
    throw new BadRequest("messages", "must be a non-empty list");
  }
  const history = messages.map((message, i) => {
    const param = `messages[${i}]`;
    const body = text(message?.content, `${param}.content`);
    switch (message?.role) {
      case "system":
      case "developer":
        return { type: "system", text: body };
      case "user":
        return { type: "user", text: body };
      case "assistant":
        return { type: "model", response: [body] };
      default:
        throw new BadRequest(`${param}.role`, "must be system, developer, user or assistant");
    }
  });
  const last = history.pop();
  if (last.type !== "user") {
    throw new BadRequest(`messages[${messages.length - 1}].role`, "the last message must be the user's");
  }
  return { history, prompt: last.text };
}

function tokenBound(body) {
  for (const name of ["max_completion_tokens", "max_tokens"]) {
    const value = body[name];
    if (value === undefined || value === null) continue;
    if (!Number.isInteger(value) || value < 1) {
      throw new BadRequest(name, "must be a positive integer");
    }
    return value;
  }
  return null;
}

function promptTokens({ history, prompt }) {
  const texts = history.map((item) => (item.type === "model" ? item.response.join("") : item.text));
  texts.push(prompt);
  return texts.reduce((sum, t) => sum + model.tokenize(t).length + PER_MESSAGE_TOKENS, 0);
}

function log(entry) {
  console.error(JSON.stringify({ ...entry, at: new Date().toISOString() }));
}

async function complete(request, body, signal) {
  if (body === null || typeof body !== "object" || Array.isArray(body)) {
    throw new BadRequest(null, "the body must be a JSON object");
  }
  if (body.stream === true) throw new BadRequest("stream", "streaming is not supported here");
  const chat = conversation(body.messages);
  const bound = tokenBound(body);
  const chars = body.messages.map((m) => text(m.content, "content").length);
  log({ event: "generating", request, roles: body.messages.map((m) => m.role), chars, max_tokens: bound });
  const needed = promptTokens(chat);
  const maxTokens = bound ?? Math.max(contextSize - needed, 1);
  if (needed + maxTokens > contextSize) {
    throw new BadRequest(
      "messages",
      `about ${needed} prompt tokens plus ${maxTokens} to write exceed the context of ${contextSize}`,
      "context_length_exceeded",
    );
  }
  const sequence = context.getSequence();
  const session = new LlamaChatSession({ contextSequence: sequence });
  try {
    session.setChatHistory(chat.history);
    const result = await session.promptWithMeta(chat.prompt, {
      maxTokens,
      temperature: 0,
      seed: SEED,
      signal,
    });
    const used = sequence.tokenMeter.getState();
    const finish = result.stopReason === "maxTokens" ? "length" : "stop";
    log({
      event: "answered",
      request,
      finish_reason: finish,
      prompt_tokens: used.usedInputTokens,
      completion_tokens: used.usedOutputTokens,
    });
    return {
      id: `chatcmpl-${request}-${Date.now().toString(36)}`,
      object: "chat.completion",
      created: Math.floor(Date.now() / 1000),
      model: opts.name,
      choices: [
        {
          index: 0,
          message: { role: "assistant", content: result.responseText },
          finish_reason: finish,
        },
      ],
      usage: {
        prompt_tokens: used.usedInputTokens,
        completion_tokens: used.usedOutputTokens,
        total_tokens: used.usedInputTokens + used.usedOutputTokens,
      },
    };
  } finally {
    session.dispose();
    await sequence.dispose();
  }
}

function send(res, status, payload) {
  if (res.destroyed) return;
  const bytes = Buffer.from(JSON.stringify(payload));
  res.writeHead(status, { "Content-Type": "application/json", "Content-Length": bytes.length });
  res.end(bytes);
}

function error(res, status, type, message, param = null, code = null) {
  send(res, status, { error: { message, type, param, code } });
}

async function readBody(req) {
  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > MAX_BODY_BYTES) throw new BadRequest(null, `the body is over ${MAX_BODY_BYTES} bytes`);
    chunks.push(chunk);
  }
  try {
    return JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch {
    throw new BadRequest(null, "the body is not JSON");
  }
}

// One generation at a time: each request waits for the one before it.
let turn = Promise.resolve();
function oneAtATime(work) {
  const mine = turn.then(work);
  turn = mine.catch(() => {});
  return mine;
}

let requests = 0;

async function completions(req, res) {
  const request = ++requests;
  const aborted = new AbortController();
  res.on("close", () => {
    if (!res.writableFinished) aborted.abort();
  });
  try {
    const body = await readBody(req);
    const answer = await oneAtATime(() => {
      if (aborted.signal.aborted) return null; // gone while it waited: nobody to answer
      return complete(request, body, aborted.signal);
    });
    if (answer !== null) send(res, 200, answer);
  } catch (err) {
    if (err instanceof BadRequest) {
      error(res, 400, "invalid_request_error", err.message, err.param, err.code);
    } else if (aborted.signal.aborted) {
      log({ event: "abandoned", request });
    } else {
      console.error(err);
      error(res, 500, "server_error", "generation failed");
    }
  }
}

const server = http.createServer((req, res) => {
  const path = new URL(req.url, "http://127.0.0.1").pathname;
  if (req.method === "POST" && path === "/v1/chat/completions") {
    completions(req, res);
  } else if (req.method === "GET" && path === "/health") {
    send(res, 200, { status: "ok" });
  } else if (req.method === "GET" && path === "/v1/models") {
    send(res, 200, { object: "list", data: [{ id: opts.name, object: "model", owned_by: "local" }] });
  } else {
    error(res, 404, "invalid_request_error", `no route ${req.method} ${path}`);
  }
});
server.requestTimeout = 0; // a generation on a busy CPU may take minutes: the client times it
server.listen(port, "127.0.0.1", () => {
  const { port: bound } = server.address();
  const ready = { url: `http://127.0.0.1:${bound}/v1`, threads, context: contextSize, model: opts.name };
  process.stdout.write(`${JSON.stringify(ready)}\n`);
});
for (const signal of ["SIGTERM", "SIGINT"]) {
  process.on(signal, () => process.exit(0));
}
