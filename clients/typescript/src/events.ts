// The events a conversation's stream holds (docs/events.md), as the HTTP API shows them to a
// tenant. Read tolerantly: a field this version does not know is kept and ignored, and an
// event of a type it does not know is an `OtherEvent`, never an error.

import type { JsonObject } from "./canonical.js";
import { isPlainObject } from "./canonical.js";
import { InvalidEvent } from "./errors.js";

/** A message in the wire format of its snapshot (`openai`, `anthropic` or `responses`). */
export type WireMessage = JsonObject;
export type WireFormat = "openai" | "anthropic" | "responses";

/** The fields every event has. `stream_id` is the Redis stream id the API adds (absent in a
 * webhook delivery). */
export interface EventBase {
  schema_version?: number;
  type: string;
  event_id: string;
  conversation_id: string;
  revision: number;
  created_at: string;
  stream_id?: string;
}

export interface Trigger {
  kind: string;
  threshold_tokens: number | null;
  projected_tokens: number;
  context_window: number | null;
  counted_by?: string;
  request_id?: string | null;
  instructions_sha256?: string | null;
  [field: string]: unknown;
}

export interface TranscriptRef {
  /** Over HTTP: the API path of the transcript route, `/v1/conversations/ID/transcripts/REV`. */
  uri: string;
  sha256: string;
  bytes?: number;
}

export interface Summary {
  text: string;
  tokens: number;
  source: string;
  truncated?: boolean;
  [field: string]: unknown;
}

/** The edit a completed event describes: `messages[start..end)` (ids `first_id`..`last_id`,
 * whose canonical JSON hashes to `range_sha256`) read as `replacement`. */
export interface Compaction {
  start: number;
  end: number;
  first_id: string;
  last_id: string;
  range_sha256: string | null;
  replacement: WireMessage[];
  summary: Summary;
  transcript?: TranscriptRef | null;
  format?: WireFormat;
  tokens_before?: number;
  tokens_after?: number;
  [field: string]: unknown;
}

export interface CompletedEvent extends EventBase {
  type: "compaction.completed";
  trigger: Trigger;
  compaction: Compaction;
  proposal_event_id?: string | null;
  approved_by?: string | null;
}

export interface ProposedEvent extends EventBase {
  type: "compaction.proposed";
  trigger: Trigger;
  compaction: Compaction;
}

export interface ErrorInfo {
  code: string;
  message: string;
  field: string | null;
}

export interface SkippedEvent extends EventBase {
  type: "compaction.skipped";
  reason: string;
  trigger: Trigger | null;
}

export interface FailedEvent extends EventBase {
  type: "compaction.failed";
  reason: string;
  error: ErrorInfo;
  trigger: Trigger | null;
}

export interface RejectedEvent extends EventBase {
  type: "compaction.rejected";
  reason: string;
  error: ErrorInfo;
}

export interface RevertedEvent extends EventBase {
  type: "compaction.reverted";
  reverted_event_id: string;
  reason: string | null;
}

export interface DeclinedEvent extends EventBase {
  type: "compaction.declined";
  proposal_event_id: string;
  reason: string | null;
  declined_by: string;
}

export interface ElidedEvent extends EventBase {
  type: "tool_results.elided";
  elided: JsonObject[];
}

/** An event of a type this version does not know (a newer service's). */
export interface OtherEvent extends EventBase {
  [field: string]: unknown;
}

export type KnownEvent =
  | CompletedEvent
  | ProposedEvent
  | SkippedEvent
  | FailedEvent
  | RejectedEvent
  | RevertedEvent
  | DeclinedEvent
  | ElidedEvent;

/** Any event. Narrow it with `event.type === "..."` through the guards below
 * (`isCompleted(event)`), since an `OtherEvent` may carry any type. */
export type CompactionEvent = KnownEvent | OtherEvent;

/** The types that are a revision's outcome (`waitFor` waits for one of them). */
export const OUTCOME_TYPES: ReadonlySet<string> = new Set([
  "compaction.completed",
  "compaction.skipped",
  "compaction.failed",
  "compaction.rejected",
  "compaction.proposed",
]);

export function isCompleted(event: CompactionEvent): event is CompletedEvent {
  return event.type === "compaction.completed";
}
export function isProposed(event: CompactionEvent): event is ProposedEvent {
  return event.type === "compaction.proposed";
}
export function isReverted(event: CompactionEvent): event is RevertedEvent {
  return event.type === "compaction.reverted";
}
export function isRejected(event: CompactionEvent): event is RejectedEvent {
  return event.type === "compaction.rejected";
}
export function isFailed(event: CompactionEvent): event is FailedEvent {
  return event.type === "compaction.failed";
}
export function isSkipped(event: CompactionEvent): event is SkippedEvent {
  return event.type === "compaction.skipped";
}
export function isOutcome(event: CompactionEvent): boolean {
  return OUTCOME_TYPES.has(event.type);
}

/** An event from its JSON (text, bytes or the parsed value), checked as far as readers rely
 * on it: the common fields, and for a completed or proposed event its `compaction`. Fields
 * it does not know are kept. {@link InvalidEvent} names the first field that is wrong. */
export function parseEvent(data: string | Uint8Array | unknown): CompactionEvent {
  const value = typeof data === "string" || data instanceof Uint8Array ? fromJson(data) : data;
  if (!isPlainObject(value)) throw new InvalidEvent("event", "an event is a JSON object");
  requireString(value, "type");
  requireString(value, "event_id");
  requireString(value, "conversation_id");
  requireInteger(value, "revision");
  if (value.type === "compaction.completed" || value.type === "compaction.proposed") {
    checkCompaction(value.compaction);
  }
  return value as unknown as CompactionEvent;
}

function fromJson(data: string | Uint8Array): unknown {
  const text = typeof data === "string" ? data : new TextDecoder("utf-8", { fatal: true }).decode(data);
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new InvalidEvent("event", `not JSON (${(error as Error).message})`);
  }
}

/** A completed event's `compaction` object, checked as {@link parseEvent} checks it. */
export function parseCompaction(compaction: unknown): Compaction {
  checkCompaction(compaction);
  return compaction as Compaction;
}

function checkCompaction(compaction: unknown): asserts compaction is Record<string, unknown> {
  if (!isPlainObject(compaction)) throw new InvalidEvent("compaction", "must be an object");
  for (const name of ["start", "end"]) requireInteger(compaction, name, "compaction.");
  for (const name of ["first_id", "last_id"]) requireString(compaction, name, "compaction.");
  const digest = compaction.range_sha256;
  if (digest !== undefined && digest !== null && typeof digest !== "string") {
    throw new InvalidEvent("compaction.range_sha256", "must be a string or null");
  }
  const replacement = compaction.replacement;
  if (!Array.isArray(replacement)) throw new InvalidEvent("compaction.replacement", "must be a list");
  replacement.forEach((message, index) => {
    if (!isPlainObject(message)) {
      throw new InvalidEvent(`compaction.replacement.${index}`, "must be an object");
    }
  });
}

function requireString(object: Record<string, unknown>, name: string, prefix = ""): void {
  if (typeof object[name] !== "string") throw new InvalidEvent(prefix + name, "must be a string");
}

function requireInteger(object: Record<string, unknown>, name: string, prefix = ""): void {
  if (!Number.isInteger(object[name])) throw new InvalidEvent(prefix + name, "must be an integer");
}
