// The HTTP API of `compactor serve` (docs/http.md), over the platform's `fetch`: what the
// Python `worker.client.Client` does over Redis, for agents in TypeScript.

import { canonicalJson, isPlainObject, type JsonObject, type JsonValue } from "./canonical.js";
import { CompactorError, EventMismatch, InvalidSnapshot } from "./errors.js";
import {
  OUTCOME_TYPES,
  isCompleted,
  parseEvent,
  type CompactionEvent,
  type CompletedEvent,
  type DeclinedEvent,
  type RevertedEvent,
  type WireFormat,
  type WireMessage,
} from "./events.js";
import { rangeDigest } from "./history.js";
import { SseParser } from "./sse.js";

/** `^[A-Za-z0-9_:][A-Za-z0-9._:\-]{0,127}$`: what a conversation id may be (docs/snapshot.md). */
export const CONVERSATION_ID_PATTERN = /^[A-Za-z0-9_:][A-Za-z0-9._:-]{0,127}$/;
const CONVERSATION_ID_RULE = "must be 1-128 characters of A-Z a-z 0-9 . _ : - and not start with '.' or '-'";
/** The largest revision: 2^53 - 1, exact in every JSON implementation. */
export const MAX_REVISION = Number.MAX_SAFE_INTEGER;

/** A snapshot (docs/snapshot.md): the conversation as it stands after a turn. */
export interface Snapshot {
  conversation_id: string;
  revision: number;
  messages: readonly WireMessage[] | readonly JsonObject[];
  format?: WireFormat;
  model?: { name?: string; context_window?: number | null };
  system?: JsonValue;
  config?: JsonObject;
  tools?: JsonObject;
  pinned?: string[];
  usage?: JsonObject | null;
}

export interface SubmitResult {
  status: "queued" | "coalesced" | "superseded";
  /** The revision submitted, or for `superseded` the service's newer one. */
  revision: number;
}

/** An event with the stream id the API adds to it. */
export type StreamEvent<E extends CompactionEvent = CompactionEvent> = E & { stream_id: string };

export interface CompactRequested {
  status: "requested";
  request_id: string;
  revision: number;
  replaced: string | null;
  events: string;
  wait_for: JsonObject;
}

export interface Recalled {
  message: WireMessage;
  revision: number;
  event_id: string;
  stream_id: string;
  transcript_sha256: string;
  conversation_id: string;
}

export interface Transcript {
  conversation_id: string;
  revision: number;
  format: WireFormat;
  messages: WireMessage[];
  compacted: JsonObject | null;
  [field: string]: JsonValue;
}

export interface Compacted {
  messages: WireMessage[];
  applied: number;
  event_id: string | null;
  outcome: string | null;
  warning: string | null;
}

export interface ConversationsPage {
  conversations: JsonObject[];
  next: string | null;
}

export interface Webhook {
  id: string;
  url: string;
  /** Shown only when the webhook is created. */
  secret?: string;
  conversation_id?: string | null;
  types?: string[] | null;
  [field: string]: JsonValue | undefined;
}

export interface ClientOptions {
  /** The server's base URL, e.g. `http://127.0.0.1:8080` (the `/v1` routes are under it). */
  baseUrl: string;
  /** The tenant's API key, sent as `Authorization: Bearer <key>`. */
  apiKey?: string;
  /** Each request's time limit (default 30 s; following events has its own, below). */
  timeoutMs?: number;
  /** Another `fetch` (the platform's by default). */
  fetch?: typeof fetch;
}

export interface FollowOptions {
  /** Start after this stream id: `"0"` (default) every event, `"$"` those from now on. */
  after?: string;
  /** Ends the iteration (and the connection). */
  signal?: AbortSignal;
  /** Reconnect when nothing, not even a keep-alive, arrived for this long (default 45 s; the
   * server's keep-alive comes every `sse_keepalive_s`, 15 s by default). */
  idleTimeoutMs?: number;
  /** Called with each failure before the follower reconnects (a dropped connection, a server
   * down); the iteration itself only ends on the signal or a permanent error (a `4xx`). */
  onError?: (error: CompactorError, attempt: number) => void;
}

export interface WaitOptions {
  /** The outcome of this revision or a newer one. */
  revision?: number;
  /** The outcome of this compaction request (`compactNow`), or a rejection of its snapshot. */
  requestId?: string;
  after?: string;
  /** Give up after this long (default 60 s): a `timeout` error. */
  timeoutMs?: number;
  signal?: AbortSignal;
}

const RECONNECT_MS = 1000; // until the server says otherwise with `retry:`
const BACKOFF_CAP_MS = 5000;

/** A tenant's view of the service. One per process is enough; every method is independent. */
export class CompactorClient {
  readonly baseUrl: string;
  private readonly apiKey: string | undefined;
  private readonly timeoutMs: number;
  private readonly fetchImpl: typeof fetch;

  constructor(options: ClientOptions) {
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.apiKey = options.apiKey;
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.fetchImpl = options.fetch ?? globalThis.fetch;
  }

  // --- snapshots and events ---------------------------------------------------------------

  /** Submit a snapshot; returns once the service queued it (milliseconds). The id and the
   * revision are checked here, as the service checks them ({@link InvalidSnapshot} naming the
   * field), and so is that it is JSON; the worker validates the rest and answers a bad
   * snapshot with a `compaction.rejected` event. */
  async submit(snapshot: Snapshot, options: { signal?: AbortSignal } = {}): Promise<SubmitResult> {
    checkConversationId(snapshot.conversation_id, snapshotError);
    const revision: unknown = snapshot.revision;
    if (typeof revision !== "number" || !Number.isInteger(revision)) {
      throw new InvalidSnapshot("revision", "must be an integer");
    }
    if (revision < 0 || revision > MAX_REVISION) {
      throw new InvalidSnapshot("revision", `must be an integer from 0 to ${MAX_REVISION}`);
    }
    const body = canonicalJson(snapshot);
    const path = `${this.path(snapshot.conversation_id)}/snapshots`;
    return (await this.call("POST", path, body, options.signal)) as SubmitResult;
  }

  /** The events after stream id `after` (default `"0"`: all), oldest first, at most `limit`
   * (default 100, at most 1000). `not_found` for a conversation never submitted. */
  async events(conversationId: string, options: { after?: string; limit?: number } = {}): Promise<StreamEvent[]> {
    const query = new URLSearchParams({ after: options.after ?? "0" });
    if (options.limit !== undefined) query.set("limit", String(options.limit));
    const answer = await this.call("GET", `${this.path(conversationId)}/events?${query}`);
    if (!Array.isArray(answer)) throw invalidResponse("a list of events");
    return answer.map((entry) => parseEvent(entry) as StreamEvent);
  }

  /** The conversation's events as they are published, over Server-Sent Events: those after
   * `after`, then each new one. A dropped connection is resumed with `Last-Event-ID` from the
   * last event seen, so nothing is missed and nothing repeated. Ends when `signal` aborts;
   * throws a permanent error (`not_found` for a conversation never submitted, `unauthorized`).
   * (Before the first event, a reconnect asks for `after` again: with `"$"`, events published
   * while disconnected are then not shown.) */
  async *follow(conversationId: string, options: FollowOptions = {}): AsyncGenerator<StreamEvent> {
    const signal = options.signal;
    let lastId = "";
    let failures = 0;
    let delayMs = RECONNECT_MS;
    while (!signal?.aborted) {
      const parser = new SseParser(lastId);
      try {
        for await (const message of this.stream(conversationId, options, lastId, parser)) {
          failures = 0;
          lastId = message.id;
          const event = readEvent(message.data);
          if (event !== null) yield { ...event, stream_id: message.id } as StreamEvent;
        }
      } catch (error) {
        if (signal?.aborted) return;
        const failure = asCompactorError(error);
        if (!failure.transient && failure.code !== "invalid_response") throw failure;
        failures += 1;
        options.onError?.(failure, failures);
      }
      delayMs = parser.state.retryMs ?? delayMs;
      await sleep(Math.min(delayMs * 2 ** Math.max(0, failures - 1), Math.max(delayMs, BACKOFF_CAP_MS)), signal);
    }
  }

  /** One connection of {@link follow}: its messages until it ends or goes idle. */
  private async *stream(
    conversationId: string,
    options: FollowOptions,
    lastId: string,
    parser: SseParser,
  ): AsyncGenerator<{ id: string; data: string }> {
    const connection = new AbortController();
    const abort = (): void => connection.abort();
    options.signal?.addEventListener("abort", abort, { once: true });
    const idleMs = options.idleTimeoutMs ?? 45_000;
    let idle = setTimeout(abort, idleMs);
    try {
      const headers: Record<string, string> = { Accept: "text/event-stream" };
      if (lastId) headers["Last-Event-ID"] = lastId;
      const query = lastId ? "" : `?${new URLSearchParams({ after: options.after ?? "0" })}`;
      const response = await this.send("GET", `${this.path(conversationId)}/events${query}`, {
        headers,
        signal: connection.signal,
        stream: true,
      });
      if (response.body === null) throw invalidResponse("an event stream");
      const decoder = new TextDecoder();
      for await (const chunk of response.body) {
        clearTimeout(idle);
        idle = setTimeout(abort, idleMs);
        for (const message of parser.push(decoder.decode(chunk, { stream: true }))) yield message;
      }
      throw new CompactorError("unreachable", "the event stream ended");
    } catch (error) {
      if (connection.signal.aborted && !options.signal?.aborted) {
        throw new CompactorError("timeout", `no keep-alive for ${idleMs} ms: reconnecting`);
      }
      throw error;
    } finally {
      clearTimeout(idle);
      options.signal?.removeEventListener("abort", abort);
      connection.abort(); // closes the response body if the caller stopped early
    }
  }

  /** The first outcome event (`compaction.completed`, `.skipped`, `.failed`, `.rejected`, or
   * `.proposed` when compactions are held for review) after `after`, of `revision` or a newer
   * one and answering `requestId` when given; an outcome published before the call counts
   * (submit, then wait). A `timeout` error after `timeoutMs`. */
  async waitFor(conversationId: string, options: WaitOptions = {}): Promise<StreamEvent> {
    const timeoutMs = options.timeoutMs ?? 60_000;
    const stop = new AbortController();
    const timer = setTimeout(() => stop.abort(), timeoutMs);
    const outer = options.signal;
    const abort = (): void => stop.abort();
    outer?.addEventListener("abort", abort, { once: true });
    try {
      const follow: FollowOptions = { after: options.after ?? "0", signal: stop.signal };
      for await (const event of this.follow(conversationId, follow)) {
        if (answers(event, options)) return event;
      }
    } finally {
      clearTimeout(timer);
      outer?.removeEventListener("abort", abort);
    }
    if (outer?.aborted) throw new CompactorError("timeout", "waiting was cancelled");
    const which = options.revision === undefined ? "" : ` revision ${options.revision} or later of`;
    throw new CompactorError("timeout", `no outcome event for${which} ${conversationId} within ${timeoutMs} ms`);
  }

  // --- compactions on demand, review, restore ---------------------------------------------

  /** Compact the conversation's newest snapshot now, whatever the threshold says. Its outcome
   * is the event answering the returned `request_id` (`waitFor(id, { requestId })`).
   * `instructions`: what the summary should focus on (at most 2,000 characters). */
  async compactNow(
    conversationId: string,
    options: { instructions?: string; config?: JsonObject; tools?: JsonObject } = {},
  ): Promise<CompactRequested> {
    checkConversationId(conversationId, requestError);
    const body = canonicalJson(options);
    return (await this.call("POST", `${this.path(conversationId)}/compact`, body)) as CompactRequested;
  }

  /** Approve the compaction held for review (`eventId`: its `compaction.proposed`), with an
   * edited `summary` if given: the `compaction.completed` it published. */
  async approve(conversationId: string, eventId: string, options: { summary?: string } = {}): Promise<StreamEvent<CompletedEvent>> {
    const path = `${this.path(conversationId)}/compactions/${encodeURIComponent(eventId)}/approve`;
    return (await this.call("POST", path, canonicalJson(options))) as StreamEvent<CompletedEvent>;
  }

  /** Decline the compaction held for review: the `compaction.declined` it published. */
  async reject(conversationId: string, eventId: string, options: { reason?: string } = {}): Promise<StreamEvent<DeclinedEvent>> {
    const path = `${this.path(conversationId)}/compactions/${encodeURIComponent(eventId)}/reject`;
    return (await this.call("POST", path, canonicalJson(options))) as StreamEvent<DeclinedEvent>;
  }

  /** Restore (undo) the conversation's newest completed compaction, `eventId`: the
   * `compaction.reverted` it published. From then on the service leaves it out, and a
   * {@link CompactingSession} undoes it. While a worker holds the conversation (it is
   * compacting it, or still finishing the compaction just published) the service answers
   * `409 compaction_in_progress`, "try again": this tries again, for at most `busyWaitMs`
   * (default 10 s, 0 not at all), then throws that error. */
  async restore(
    conversationId: string,
    eventId: string,
    options: { reason?: string; busyWaitMs?: number } = {},
  ): Promise<StreamEvent<RevertedEvent>> {
    const path = `${this.path(conversationId)}/compactions/${encodeURIComponent(eventId)}/restore`;
    const body = canonicalJson(options.reason === undefined ? {} : { reason: options.reason });
    const deadline = Date.now() + (options.busyWaitMs ?? 10_000);
    for (let attempt = 1; ; attempt++) {
      try {
        return (await this.call("POST", path, body)) as StreamEvent<RevertedEvent>;
      } catch (error) {
        const busy = error instanceof CompactorError && error.code === "compaction_in_progress";
        const pause = Math.min(50 * 2 ** attempt, 1000);
        if (!busy || Date.now() + pause > deadline) throw error;
        await sleep(pause);
      }
    }
  }

  // --- transcripts and recall -------------------------------------------------------------

  /** The full pre-compaction transcript kept for `revision`. With `sha256` (a completed
   * event's `compaction.transcript.sha256`), the server's `X-Transcript-SHA256` must be it. */
  async transcript(conversationId: string, revision: number, sha256?: string): Promise<Transcript> {
    return this.transcriptAt(`${this.path(conversationId)}/transcripts/${revision}`, sha256);
  }

  /** The original history a completed event replaced (Python's `Client.restore(event)`): the
   * messages of the transcript its `compaction.transcript` names. Checked twice: the server's
   * `X-Transcript-SHA256` must be the event's, and the compacted range of the transcript must
   * hash to the event's `range_sha256` ({@link EventMismatch} otherwise). */
  async original(event: CompactionEvent): Promise<WireMessage[]> {
    if (!isCompleted(event) || !event.compaction.transcript) {
      throw new EventMismatch(`the ${event.type} event has no transcript`);
    }
    const { transcript: reference, start, end, range_sha256: digest } = event.compaction;
    const messages = (await this.transcriptAt(reference.uri, reference.sha256)).messages;
    if (!Array.isArray(messages) || rangeDigest(messages.slice(start, end)) !== digest) {
      throw new EventMismatch("the transcript's compacted range does not match the event");
    }
    return messages;
  }

  private async transcriptAt(path: string, sha256: string | undefined): Promise<Transcript> {
    if (!path.startsWith("/v1/")) throw new EventMismatch(`not a transcript route of this API: ${path}`);
    const response = await this.send("GET", path);
    const header = response.headers.get("x-transcript-sha256");
    // The header hashes the transcript as stored; the body names the conversation by the
    // tenant's own id, so it is not those bytes (original() checks the range it holds).
    if (sha256 !== undefined && header !== sha256) {
      throw new EventMismatch(`the transcript ${path} is not the one the event names (sha256)`);
    }
    const text = await response.text();
    try {
      return JSON.parse(text) as Transcript;
    } catch {
      throw invalidResponse(`the JSON of ${path}`, response.status);
    }
  }

  /** The original of a message a compaction replaced, by its id (own or derived) or its tool
   * call id: `not_found` when no kept compaction replaced it, `expired` when the one that did
   * keeps no transcript any more. */
  async recall(conversationId: string, messageId: string): Promise<Recalled> {
    const path = `${this.path(conversationId)}/messages/${encodeURIComponent(messageId)}`;
    return (await this.call("GET", path)) as Recalled;
  }

  /** The history to send next, for a client that keeps its full history: every compaction of
   * the conversation so far applied at once (what the proxy does). */
  async compacted(conversationId: string, messages: readonly WireMessage[], format?: WireFormat): Promise<Compacted> {
    const body = canonicalJson(format === undefined ? { messages } : { messages, format });
    return (await this.call("POST", `${this.path(conversationId)}/compacted`, body)) as Compacted;
  }

  /** The tenant's conversations, newest activity first; pass `next` as `after` for more. */
  async conversations(options: { limit?: number; after?: string } = {}): Promise<ConversationsPage> {
    const query = new URLSearchParams();
    if (options.limit !== undefined) query.set("limit", String(options.limit));
    if (options.after !== undefined) query.set("after", options.after);
    return (await this.call("GET", `/v1/conversations?${query}`)) as ConversationsPage;
  }

  // --- webhooks ---------------------------------------------------------------------------

  /** Register a webhook for the tenant's events; its `secret` is in this answer only. */
  async createWebhook(options: {
    url: string;
    conversation_id?: string;
    types?: string[];
    review_default?: "approve" | "reject";
  }): Promise<Webhook> {
    return (await this.call("POST", "/v1/webhooks", canonicalJson(options))) as Webhook;
  }

  async webhooks(): Promise<Webhook[]> {
    return (await this.call("GET", "/v1/webhooks")) as Webhook[];
  }

  async deleteWebhook(id: string): Promise<void> {
    await this.send("DELETE", `/v1/webhooks/${encodeURIComponent(id)}`);
  }

  /** Whether the service is ready: Redis answers and a worker of each kind does. */
  async ready(): Promise<boolean> {
    try {
      await this.send("GET", "/readyz");
      return true;
    } catch (error) {
      if (error instanceof CompactorError && error.status === 503) return false;
      throw error;
    }
  }

  // --- the wire ---------------------------------------------------------------------------

  private path(conversationId: string): string {
    return `/v1/conversations/${encodeURIComponent(conversationId)}`;
  }

  private async call(method: string, path: string, body?: string, signal?: AbortSignal): Promise<unknown> {
    const init: SendOptions = {};
    if (signal !== undefined) init.signal = signal;
    if (body !== undefined) {
      init.body = body;
      init.headers = { "Content-Type": "application/json" };
    }
    const response = await this.send(method, path, init);
    const text = await response.text();
    try {
      return JSON.parse(text) as unknown;
    } catch {
      throw invalidResponse(`JSON from ${method} ${path}`, response.status);
    }
  }

  /** One request; a CompactorError for an error status (the service's code), a network
   * failure (`unreachable`) or no answer within the time limit (`timeout`). */
  private async send(method: string, path: string, init: SendOptions = {}): Promise<Response> {
    const headers: Record<string, string> = { ...init.headers };
    if (this.apiKey !== undefined) headers.Authorization = `Bearer ${this.apiKey}`;
    // A stream lives as long as it is followed (its idle timer bounds it); others time out.
    const limit = AbortSignal.timeout(this.timeoutMs);
    const signals = [init.signal, init.stream ? undefined : limit].filter((s) => s !== undefined);
    const signal = signals.length === 1 ? signals[0] : AbortSignal.any(signals);
    let response: Response;
    try {
      const request: RequestInit = { method, headers };
      if (signal !== undefined) request.signal = signal;
      if (init.body !== undefined) request.body = init.body;
      response = await this.fetchImpl(this.baseUrl + path, request);
    } catch (error) {
      if (init.signal?.aborted) throw error; // the caller's own cancellation
      if (limit.aborted && !init.stream) {
        throw new CompactorError("timeout", `${method} ${path}: no answer within ${this.timeoutMs} ms`, { cause: error });
      }
      throw new CompactorError("unreachable", `${method} ${path}: ${causeOf(error)}`, { cause: error });
    }
    if (!response.ok) throw await errorOf(response, method, path);
    return response;
  }
}

interface SendOptions {
  body?: string;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  /** An event stream: no time limit of its own. */
  stream?: boolean;
}

function answers(event: StreamEvent, options: WaitOptions): boolean {
  if (!OUTCOME_TYPES.has(event.type)) return false;
  if (options.revision !== undefined && event.revision < options.revision) return false;
  if (options.requestId === undefined || event.type === "compaction.rejected") return true;
  const trigger = (event as { trigger?: { request_id?: unknown } | null }).trigger;
  return trigger?.request_id === options.requestId;
}

/** An event from a stream entry's data; null (with a warning) for one that is no event, so
 * that it never stops a follower (the service leaves such entries out already). */
function readEvent(data: string): CompactionEvent | null {
  try {
    return parseEvent(data);
  } catch (error) {
    console.warn(`compaction-worker: skipping an unreadable event: ${(error as Error).message}`);
    return null;
  }
}

async function errorOf(response: Response, method: string, path: string): Promise<CompactorError> {
  const text = await response.text().catch(() => "");
  let body: unknown = null;
  try {
    body = JSON.parse(text);
  } catch {
    // not JSON: a proxy's page, say
  }
  const status = response.status;
  if (!isPlainObject(body) || typeof body.error !== "string") {
    return new CompactorError("http_error", `${method} ${path}: HTTP ${status}`, { status, body: text });
  }
  const field = typeof body.field === "string" ? body.field : null;
  const said = [body.message, body.reason].find((part) => typeof part === "string") as string | undefined;
  const message = `${method} ${path}: ${status} ${body.error}${field ? ` (${field})` : ""}${said ? `: ${said}` : ""}`;
  return new CompactorError(body.error, message, { status, field, body });
}

function asCompactorError(error: unknown): CompactorError {
  if (error instanceof CompactorError) return error;
  return new CompactorError("unreachable", causeOf(error), { cause: error });
}

function causeOf(error: unknown): string {
  if (error instanceof Error) {
    const cause = (error as { cause?: unknown }).cause;
    const detail = cause instanceof Error ? ` (${cause.message})` : "";
    return `${error.message}${detail}`;
  }
  return String(error);
}

function invalidResponse(what: string, status: number | null = null): CompactorError {
  return new CompactorError("invalid_response", `the service did not answer with ${what}`, { status });
}

function requestError(field: string, reason: string): CompactorError {
  return new CompactorError("invalid_request", `${field}: ${reason}`, { field });
}

function checkConversationId(id: unknown, error: (field: string, reason: string) => CompactorError): void {
  if (typeof id !== "string" || !CONVERSATION_ID_PATTERN.test(id)) throw error("conversation_id", CONVERSATION_ID_RULE);
}

function snapshotError(field: string, reason: string): CompactorError {
  return new InvalidSnapshot(field, reason);
}

/** Waits `ms`, or less when `signal` aborts (never rejects). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}
