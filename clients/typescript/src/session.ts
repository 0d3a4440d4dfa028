// A conversation kept compact in the background, for an agent loop: what the Python
// `CompactingSession` does (docs/session.md), in one JavaScript event loop. `extend` appends
// and hands the history to a background sender; a background follower reads the events over
// SSE; `requestMessages` applies, synchronously, the compactions that have arrived. Neither
// `extend` nor `requestMessages` ever waits for the service.

import { canonicalJson, type JsonObject, type JsonValue } from "./canonical.js";
import { sleep, type CompactRequested, type CompactorClient, type Snapshot, type StreamEvent, type SubmitResult } from "./client.js";
import { CompactorError, EventMismatch, InvalidSnapshot } from "./errors.js";
import {
  OUTCOME_TYPES,
  isCompleted,
  isRejected,
  isReverted,
  type CompletedEvent,
  type RevertedEvent,
  type WireFormat,
  type WireMessage,
} from "./events.js";
import { appliedAt, jsonEquals, rangeDigest } from "./history.js";

export interface SessionOptions {
  client: CompactorClient;
  format?: WireFormat;
  /** The model of the next request (`model.name`: it chooses the tokenizer). */
  model?: string;
  /** Its context window in tokens (the threshold may be a share of it). */
  contextWindow?: number | null;
  /** Anthropic's top-level system prompt (`format: "anthropic"` only). */
  system?: JsonValue;
  /** The snapshot's `config` overrides, sent with every snapshot. */
  config?: JsonObject;
  /** Per-tool compaction hints, sent with every snapshot. */
  tools?: JsonObject;
  /** An initial history, submitted with the first `extend`. */
  messages?: readonly WireMessage[];
  /** Where the session says what it did (default: warnings and errors on the console). */
  logger?: Logger;
}

export interface Logger {
  info(message: string): void;
  warn(message: string): void;
}

/** What the background loops have done, as of now (a copy). */
export interface SessionStatus {
  conversationId: string;
  /** The newest revision given to a snapshot (or learned from the service). */
  revision: number;
  /** The newest revision the service accepted from this session. */
  lastSubmittedRevision: number | null;
  /** Turns (`extend` calls) not yet in an accepted snapshot. */
  pendingSubmits: number;
  /** The sender is backing off after a failed submit. */
  retrying: boolean;
  submitFailures: number;
  /** The newest submit error (`code: message`), cleared by the next success. */
  lastError: string | null;
  /** Unsent snapshots replaced by a newer one (only the newest is sent). */
  snapshotsReplaced: number;
  eventsReceived: number;
  lastOutcomeRevision: number | null;
  eventsApplied: number;
  /** Compactions that no longer described the history (an edit, an undo). */
  compactionsSkipped: number;
  lastSkipReason: string | null;
  compactionsUndone: number;
  /** The follower's newest read error, cleared when it reads again. */
  followerError: string | null;
  /** The stream id of the newest event drained into the history. */
  lastEventId: string;
  compactionsFailed: number;
  snapshotsRejected: number;
  lastRejection: string | null;
}

/** The retry schedule of both loops: 0.2 s, doubling, at most 5 s (the Python session's). */
export function retryDelayMs(attempt: number): number {
  return Math.min(200 * 2 ** Math.min(Math.max(attempt - 1, 0), 32), 5000);
}

const INBOX_SIZE = 10_000; // events read but not drained: the follower waits when it is full

interface Applied {
  event: CompletedEvent;
  index: number; // where the replacement starts in the history
  size: number; // the replacement's length
}

interface Entry {
  event: StreamEvent;
  /** For a revert: the history its compaction replaced, read by the follower beforehand. */
  original?: WireMessage[] | CompactorError;
}

interface Job {
  turn: number;
  revision: number;
  messages: WireMessage[];
}

const quiet: Logger = { info: () => undefined, warn: (message) => console.warn(message) };

/** One conversation, compacted in the background. */
export class CompactingSession {
  readonly conversationId: string;
  readonly client: CompactorClient;
  private readonly setup: Omit<SessionOptions, "client" | "messages" | "logger">;
  private readonly log: Logger;
  private history: WireMessage[];
  private applied: Applied[] = [];
  private readonly seen = new Set<string>(); // compactions applied or reverted
  private floor: number | null = null; // the first revision the service accepted from us
  private held: Entry[] = []; // events read before the floor was known
  private inbox: Entry[] = [];
  private readonly counts = {
    revision: -1,
    turns: 0,
    submittedTurn: 0,
    lastSubmitted: null as number | null,
    retrying: false,
    failures: 0,
    lastError: null as string | null,
    replaced: 0,
    received: 0,
    lastOutcome: null as number | null,
    followerError: null as string | null,
    appliedCount: 0,
    skipped: 0,
    lastSkip: null as string | null,
    undone: 0,
    lastEventId: "0",
    failed: 0,
    rejected: 0,
    lastRejection: null as string | null,
  };
  private mail: { turn: number; messages: WireMessage[] } | null = null;
  private wakeSender: (() => void) | null = null;
  private wakeFollower: (() => void) | null = null;
  private waiters: (() => void)[] = [];
  private readonly stop = new AbortController();
  private readonly loops: Promise<void>[];

  constructor(conversationId: string, options: SessionOptions) {
    this.conversationId = conversationId;
    this.client = options.client;
    const { client: _client, messages, logger, ...setup } = options;
    this.setup = setup;
    this.log = logger ?? quiet;
    this.history = own(messages ?? [], 0);
    this.loops = [this.sendLoop(), this.followLoop()];
  }

  // --- reading ----------------------------------------------------------------------------

  /** The current history (compactions applied), in the wire format: a copy of the list; treat
   * the messages as read-only. */
  get messages(): WireMessage[] {
    return [...this.history];
  }

  /** The compactions applied so far, oldest first (an undone one is removed). */
  get compactions(): CompletedEvent[] {
    return this.applied.map((a) => a.event);
  }

  get status(): SessionStatus {
    const c = this.counts;
    return {
      conversationId: this.conversationId,
      revision: c.revision,
      lastSubmittedRevision: c.lastSubmitted,
      pendingSubmits: c.turns - c.submittedTurn,
      retrying: c.retrying,
      submitFailures: c.failures,
      lastError: c.lastError,
      snapshotsReplaced: c.replaced,
      eventsReceived: c.received,
      lastOutcomeRevision: c.lastOutcome,
      eventsApplied: c.appliedCount,
      compactionsSkipped: c.skipped,
      lastSkipReason: c.lastSkip,
      compactionsUndone: c.undone,
      followerError: c.followerError,
      lastEventId: c.lastEventId,
      compactionsFailed: c.failed,
      snapshotsRejected: c.rejected,
      lastRejection: c.lastRejection,
    };
  }

  // --- the agent's side -------------------------------------------------------------------

  /** Append copies of the messages and hand the history to the sender; returns at once.
   * {@link InvalidSnapshot} (naming `messages[i]...`) for a message that is not JSON. */
  extend(newMessages: readonly WireMessage[]): void {
    this.history = [...this.history, ...own(newMessages, this.history.length)];
    this.changed();
  }

  /** Replace the whole history (an edit of the agent's own) and submit it. Compactions that
   * no longer describe it are skipped when they arrive. */
  replaceMessages(messages: readonly WireMessage[]): void {
    this.history = own(messages, 0);
    this.changed();
  }

  /** Apply every compaction that has arrived, in order, and return the messages to send.
   * Never waits for the service. (Unlike the Python session's, the messages are not
   * projected: tool results go as they are.) */
  requestMessages(): WireMessage[] {
    this.drain();
    return this.messages;
  }

  /** Apply the events that have arrived (`requestMessages` does this first). */
  drain(): void {
    const wasFull = this.inbox.length >= INBOX_SIZE;
    for (const entry of this.release()) this.drainOne(entry);
    const inbox = this.inbox;
    this.inbox = [];
    for (const entry of inbox) this.drainOne(entry);
    for (const entry of this.release()) this.drainOne(entry);
    if (wasFull) this.wakeFollower?.();
  }

  /** Wait until every turn is submitted (or refused) and the outcome event of the newest
   * accepted snapshot has been read; true then, false once `timeoutMs` passed. For scripts,
   * tests and shutdown: an agent never needs to wait. */
  async waitSettled(timeoutMs = 60_000): Promise<boolean> {
    return this.until(() => this.settled(), timeoutMs);
  }

  /** Ask the service to compact the conversation now, whatever the threshold says (first
   * waiting, at most `timeoutMs`, for turns not yet submitted). The compaction arrives like any
   * other and `requestMessages` applies it. */
  async compact(
    instructions?: string,
    options: { config?: JsonObject; tools?: JsonObject; timeoutMs?: number } = {},
  ): Promise<CompactRequested> {
    await this.until(() => !this.unsent(), options.timeoutMs ?? 10_000);
    const request: { instructions?: string; config?: JsonObject; tools?: JsonObject } = {};
    if (instructions !== undefined) request.instructions = instructions;
    if (options.config !== undefined) request.config = options.config;
    if (options.tools !== undefined) request.tools = options.tools;
    return this.client.compactNow(this.conversationId, request);
  }

  /** The original of a message a compaction replaced (by message id or tool call id), from
   * the service (`not_found`, or `expired` once transcript retention removed it). */
  async recall(messageId: string): Promise<WireMessage> {
    return (await this.client.recall(this.conversationId, messageId)).message;
  }

  /** Put back the history the newest applied compaction replaced (from its transcript,
   * checked), keeping every message added after it. Nothing is submitted: the next `extend`
   * sends the restored history. */
  async undo(): Promise<WireMessage[]> {
    const newest = this.applied.at(-1);
    if (newest === undefined) throw new EventMismatch("no compaction to undo");
    this.undoWith(newest, await this.client.original(newest.event));
    return this.messages;
  }

  /** Stop the background loops, first giving an unsent snapshot up to `timeoutMs`. */
  async close(timeoutMs = 2000): Promise<void> {
    await this.until(() => !this.unsent(), timeoutMs);
    this.stop.abort();
    this.wakeSender?.();
    this.wakeFollower?.();
    await Promise.all(this.loops);
  }

  // --- applying events (synchronous) ------------------------------------------------------

  private drainOne(entry: Entry): void {
    const event = entry.event;
    if (isReverted(event)) return this.drainRevert(entry, event);
    if (this.hold(entry)) return;
    this.counts.revision = Math.max(this.counts.revision, event.revision);
    if (!isCompleted(event) || this.seen.has(event.event_id)) return;
    this.seen.add(event.event_id);
    if (this.floor !== null && event.revision < this.floor) {
      this.log.info(`ignoring compaction ${event.event_id}: revision ${event.revision} predates this session (${this.floor})`);
      return;
    }
    this.apply(event);
  }

  private apply(event: CompletedEvent): void {
    const before = this.history;
    try {
      const [after, index] = appliedAt(before, event, this.conversationId);
      this.history = after;
      this.applied.push({ event, index, size: event.compaction.replacement.length });
      this.counts.appliedCount += 1;
      this.log.info(`applied compaction ${event.event_id} (revision ${event.revision}): ${before.length} -> ${after.length} messages`);
    } catch (error) {
      if (!(error instanceof CompactorError)) throw error;
      this.skip(`${event.event_id} (revision ${event.revision}): ${error.message}`);
      this.log.info(`skipping compaction ${event.event_id}: ${error.message}; the next snapshot is compacted instead`);
    }
  }

  /** A compaction restored on the service: undone here too when it is the newest applied. */
  private drainRevert(entry: Entry, event: RevertedEvent): void {
    if (this.hold(entry)) return;
    this.seen.add(event.reverted_event_id);
    const newest = this.applied.at(-1);
    if (newest === undefined || newest.event.event_id !== event.reverted_event_id) return;
    try {
      if (entry.original === undefined) throw new CompactorError("not_found", "its transcript was not read");
      if (entry.original instanceof CompactorError) throw entry.original;
      this.undoWith(newest, entry.original);
    } catch (error) {
      if (!(error instanceof CompactorError)) throw error;
      this.skip(`revert of ${event.reverted_event_id}: ${error.message}`);
      this.log.warn(`cannot undo compaction ${event.reverted_event_id}, restored on the service: ${error.message}`);
    }
  }

  private undoWith(applied: Applied, original: readonly WireMessage[]): void {
    const { start, end, range_sha256: digest, replacement } = applied.event.compaction;
    const replaced = original.slice(start, end);
    if (rangeDigest(replaced) !== digest) throw new EventMismatch("the transcript's range does not match the compaction");
    if (this.applied.at(-1) !== applied) throw new EventMismatch("the history changed while undoing");
    const { index, size } = applied;
    if (!jsonEquals(this.history.slice(index, index + size), replacement)) {
      throw new EventMismatch("the compaction's replacement is no longer in the history");
    }
    this.history = [...this.history.slice(0, index), ...replaced, ...this.history.slice(index + size)];
    this.applied.pop();
    this.counts.undone += 1;
    this.log.info(`undid compaction ${applied.event.event_id}`);
  }

  private skip(reason: string): void {
    this.counts.skipped += 1;
    this.counts.lastSkip = reason;
  }

  /** Keep the event while no submit has been accepted (its line of history is not known yet). */
  private hold(entry: Entry): boolean {
    if (this.floor === null) {
      this.held.push(entry);
      return true;
    }
    this.counts.lastEventId = entry.event.stream_id;
    return false;
  }

  private release(): Entry[] {
    if (this.floor === null) return [];
    const held = this.held;
    this.held = [];
    return held;
  }

  // --- the sender -------------------------------------------------------------------------

  private changed(): void {
    this.counts.turns += 1;
    if (this.mail !== null) this.counts.replaced += 1;
    this.mail = { turn: this.counts.turns, messages: this.history };
    this.wakeSender?.();
  }

  private unsent(): boolean {
    return this.counts.turns > this.counts.submittedTurn && !this.counts.retrying;
  }

  private settled(): boolean {
    const { lastSubmitted, lastOutcome, turns, submittedTurn } = this.counts;
    return turns === submittedTurn && (lastSubmitted === null || (lastOutcome !== null && lastOutcome >= lastSubmitted));
  }

  private async sendLoop(): Promise<void> {
    let job: Job | null = null;
    let failures = 0;
    while (!this.stop.signal.aborted) {
      if (this.mail !== null) {
        job = { turn: this.mail.turn, revision: ++this.counts.revision, messages: this.mail.messages };
        this.mail = null;
      }
      if (job === null) {
        await new Promise<void>((resolve) => (this.wakeSender = resolve));
        this.wakeSender = null;
        continue;
      }
      let result: SubmitResult;
      try {
        result = await this.client.submit(this.snapshot(job), { signal: this.stop.signal });
      } catch (error) {
        const failure = error instanceof CompactorError ? error : new CompactorError("internal", String(error), { cause: error });
        if (!failure.transient) {
          this.refused(job, failure);
          job = null;
          continue;
        }
        if (this.stop.signal.aborted) return;
        failures += 1;
        this.failed(job, failure, failures);
        await sleep(retryDelayMs(failures), this.stop.signal);
        continue;
      }
      failures = 0;
      job = this.submitted(job, result);
    }
  }

  private snapshot(job: Job): Snapshot {
    const { format, model, contextWindow, system, config, tools } = this.setup;
    const snapshot: Snapshot = {
      conversation_id: this.conversationId,
      revision: job.revision,
      model: { name: model ?? "", context_window: contextWindow ?? null },
      format: format ?? "openai",
      messages: job.messages,
    };
    if (system !== undefined) snapshot.system = system;
    if (config !== undefined && Object.keys(config).length > 0) snapshot.config = config;
    if (tools !== undefined && Object.keys(tools).length > 0) snapshot.tools = tools;
    return snapshot;
  }

  /** Record a submit; the job to send again (as a newer revision) when it was superseded. */
  private submitted(job: Job, result: SubmitResult): Job | null {
    const c = this.counts;
    if (result.status === "superseded") {
      c.revision = Math.max(c.revision, result.revision);
      this.log.info(`revision ${job.revision} is older than the service's ${result.revision}; sending it as a newer one`);
      return { ...job, revision: ++c.revision };
    }
    if (c.retrying) this.log.warn(`the service is back: submitted ${this.conversationId} revision ${job.revision}`);
    c.lastSubmitted = job.revision;
    c.submittedTurn = Math.max(c.submittedTurn, job.turn);
    c.retrying = false;
    c.lastError = null;
    this.floor ??= job.revision;
    this.notify();
    return null;
  }

  private refused(job: Job, error: CompactorError): void {
    const c = this.counts;
    c.lastError = `${error.code}: ${error.message}`;
    c.submittedTurn = Math.max(c.submittedTurn, job.turn);
    c.retrying = false;
    this.log.warn(`the service refused ${this.conversationId} revision ${job.revision}: ${error.message}`);
    this.notify();
  }

  private failed(job: Job, error: CompactorError, attempt: number): void {
    const c = this.counts;
    c.retrying = true;
    c.failures += 1;
    c.lastError = `${error.code}: ${error.message}`;
    const pending = c.turns - c.submittedTurn;
    this.log.warn(
      `cannot submit ${this.conversationId} revision ${job.revision} (${error.message}); keeping the newest snapshot ` +
        `(${pending} turns pending), retrying in ${retryDelayMs(attempt) / 1000}s`,
    );
    this.notify();
  }

  // --- the follower -----------------------------------------------------------------------

  private async followLoop(): Promise<void> {
    let failures = 0;
    const onError = (error: CompactorError): void => {
      this.counts.followerError = `${error.code}: ${error.message}`;
    };
    while (!this.stop.signal.aborted) {
      try {
        const after = this.lastRead;
        for await (const event of this.client.follow(this.conversationId, { after, signal: this.stop.signal, onError })) {
          failures = 0;
          this.lastRead = event.stream_id;
          await this.received(event);
        }
      } catch (error) {
        if (this.stop.signal.aborted) return;
        // before the first snapshot is stored the conversation is `not_found`: wait for it
        failures += 1;
        onError(error instanceof CompactorError ? error : new CompactorError("internal", String(error)));
        await sleep(retryDelayMs(failures), this.stop.signal);
      }
    }
  }

  private lastRead = "0"; // the stream id of the newest event read (drained or not)

  private async received(event: StreamEvent): Promise<void> {
    const c = this.counts;
    c.received += 1;
    c.followerError = null;
    const entry: Entry = { event };
    if (isReverted(event)) {
      const original = await this.originalOf(event.reverted_event_id);
      if (original !== undefined) entry.original = original;
    }
    if (event.type === "compaction.failed") c.failed += 1;
    if (isRejected(event)) {
      c.rejected += 1;
      c.lastRejection = event.reason;
      this.log.warn(`${this.conversationId} revision ${event.revision} was rejected: ${event.reason}`);
    }
    while (this.inbox.length >= INBOX_SIZE && !this.stop.signal.aborted) {
      await new Promise<void>((resolve) => (this.wakeFollower = resolve));
    }
    this.inbox.push(entry);
    if (OUTCOME_TYPES.has(event.type)) {
      c.lastOutcome = Math.max(c.lastOutcome ?? event.revision, event.revision);
      this.notify();
    }
  }

  /** The history a compaction replaced, read now (off the agent's path) for a revert that
   * `drain` will apply: the compaction is applied, or waits in the inbox. */
  private async originalOf(eventId: string): Promise<WireMessage[] | CompactorError | undefined> {
    const known = [...this.applied.map((a) => a.event), ...this.inbox.map((e) => e.event), ...this.held.map((e) => e.event)];
    const compaction = known.find((event) => isCompleted(event) && event.event_id === eventId);
    if (compaction === undefined) return undefined;
    try {
      return await this.client.original(compaction);
    } catch (error) {
      return error instanceof CompactorError ? error : new CompactorError("internal", String(error));
    }
  }

  // --- waiting ----------------------------------------------------------------------------

  private notify(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }

  private async until(done: () => boolean, timeoutMs: number): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (!done()) {
      const left = deadline - Date.now();
      if (left <= 0 || this.stop.signal.aborted) return false;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, Math.min(left, 50));
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
    return true;
  }
}

/** Copies of the messages, each checked to be JSON (`messages[offset + i]` named if not). */
function own(messages: readonly WireMessage[], offset: number): WireMessage[] {
  return messages.map((message, index) => {
    try {
      canonicalJson(message);
    } catch (error) {
      if (!(error instanceof InvalidSnapshot)) throw error;
      const field = `messages[${offset + index}]${error.field ? `.${error.field}` : ""}`;
      throw new InvalidSnapshot(field, error.reason);
    }
    if (typeof message !== "object" || message === null || Array.isArray(message)) {
      throw new InvalidSnapshot(`messages[${offset + index}]`, "must be an object");
    }
    return structuredClone(message);
  });
}
