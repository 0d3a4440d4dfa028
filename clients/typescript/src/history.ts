// An agent's history in its wire format, and the one edit the service ever asks of it:
// applying a completed compaction. Pure: no network, no clock. The same rules as the
// service's `worker.wire.history.apply_compaction` (docs/events.md, docs/snapshot.md
// "Message ids"), checked against it by the shared fixtures in tests/fixtures/conformance.

import { canonicalJson, isPlainObject, sha256Hex } from "./canonical.js";
import { EventMismatch, InvalidSnapshot } from "./errors.js";
import type { CompactionEvent, Compaction, CompletedEvent, WireMessage } from "./events.js";
import { parseCompaction, parseEvent } from "./events.js";

/** The longest own message id (in code points), as the service allows. */
export const MAX_ID_CHARS = 256;

/** The id a message without its own `id` gets: `m{index}-{hash}`, `hash` the first 12 hex
 * digits of the SHA-256 of the message's canonical JSON. */
export function derivedMessageId(index: number, message: unknown): string {
  return `m${index}-${sha256Hex(canonicalJson(message)).slice(0, 12)}`;
}

/** Each message's id: its own `id` when it has one (not null), else its derived id.
 * {@link InvalidSnapshot} for a message that is not an object, an own id that is not a
 * string of 1-256 characters, or an id twice, naming `messages[i]` as the service does. */
export function sourceIds(messages: readonly unknown[]): string[] {
  const ids: string[] = [];
  const seen = new Set<string>();
  messages.forEach((message, index) => {
    if (!isPlainObject(message)) throw new InvalidSnapshot(`messages[${index}]`, "must be an object");
    const own = message.id;
    let id: string;
    if (own === undefined || own === null) {
      id = derivedMessageId(index, message);
    } else if (typeof own !== "string" || own === "" || codePoints(own) > MAX_ID_CHARS) {
      throw new InvalidSnapshot(`messages[${index}].id`, `must be a string of 1-${MAX_ID_CHARS} characters`);
    } else {
      id = own;
    }
    if (seen.has(id)) throw new InvalidSnapshot(`messages[${index}].id`, `duplicate message id ${quoted(id)}`);
    seen.add(id);
    ids.push(id);
  });
  return ids;
}

/** SHA-256 of the canonical JSON of wire messages: what a compaction's range must hash to. */
export function rangeDigest(messages: readonly unknown[]): string {
  return sha256Hex(canonicalJson(messages));
}

/** What {@link applyCompaction} takes: an event (parsed or as its JSON text or bytes, a line of
 * `compactor events` as printed) or the bare `compaction` of one. */
export type ApplicableEvent = CompactionEvent | Compaction | string | Uint8Array;

/** `messages[:start] + replacement + messages[end:]`, located by `first_id`/`last_id` so that
 * messages appended after the snapshot survive. Returns a new array; `messages` is left as
 * it was.
 *
 * {@link EventMismatch} unless the event describes exactly these messages: the range must
 * hash to the event's `range_sha256` (and, with `conversationId`, the event must be that
 * conversation's); an event already applied (its summary present), another conversation's,
 * an edited history, a range of another length, an event that is not a completed one. */
export function applyCompaction<M extends object = WireMessage>(
  messages: readonly M[],
  event: ApplicableEvent,
  options: { conversationId?: string } = {},
): M[] {
  return appliedAt(messages, event, options.conversationId)[0];
}

/** {@link applyCompaction}, and where the replacement starts in the result. */
export function appliedAt<M extends object>(
  messages: readonly M[],
  event: ApplicableEvent,
  conversationId: string | undefined,
): [M[], number] {
  const compaction = compactionOf(event, conversationId);
  const [start, last] = located(messages, compaction);
  if (compaction.range_sha256 === null || compaction.range_sha256 === undefined) {
    throw new EventMismatch("the event has no range digest (published by an older version)");
  }
  if (rangeDigest(messages.slice(start, last + 1)) !== compaction.range_sha256) {
    throw new EventMismatch(
      "the compacted range differs from these messages (another conversation, or an edited history)",
    );
  }
  const replacement = compaction.replacement as unknown as M[];
  return [[...messages.slice(0, start), ...replacement, ...messages.slice(last + 1)], start];
}

/** Where the compacted range's first and last messages are, by their ids. */
function located(messages: readonly object[], compaction: Compaction): [number, number] {
  const summary = compaction.replacement.at(-1);
  if (summary !== undefined && messages.some((message) => jsonEquals(message, summary))) {
    throw new EventMismatch("this compaction is already applied (its summary is present)");
  }
  const ids = sourceIds(messages);
  const start = ids.indexOf(compaction.first_id);
  const last = start < 0 ? -1 : ids.indexOf(compaction.last_id, start);
  if (last < 0) {
    throw new EventMismatch(
      `messages ${quoted(compaction.first_id)}..${quoted(compaction.last_id)} are not in this history`,
    );
  }
  if (last - start !== compaction.end - 1 - compaction.start) {
    throw new EventMismatch("the compacted range has a different length in this history");
  }
  return [start, last];
}

function compactionOf(event: ApplicableEvent, conversationId: string | undefined): Compaction {
  if (isBareCompaction(event)) return parseCompaction(event);
  const parsed = parseEvent(event);
  if (parsed.type !== "compaction.completed") {
    throw new EventMismatch(`a ${parsed.type} event has nothing to apply`);
  }
  const completed = parsed as CompletedEvent;
  if (conversationId !== undefined && completed.conversation_id !== conversationId) {
    throw new EventMismatch(
      `the event is of conversation ${quoted(completed.conversation_id)}, not ${quoted(conversationId)}`,
    );
  }
  return completed.compaction;
}

/** A `compaction` object itself rather than an event holding one. */
function isBareCompaction(event: ApplicableEvent): event is Compaction {
  return isPlainObject(event) && !("type" in event) && "first_id" in event && "replacement" in event;
}

/** Python's `==` over JSON values, as the service compares messages: numbers by value, and
 * `true`/`false` equal to `1`/`0` (Python's bool is an int); a property whose value is
 * `undefined` is absent, as it is once sent. */
export function jsonEquals(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  const x = typeof a === "boolean" ? Number(a) : a;
  const y = typeof b === "boolean" ? Number(b) : b;
  if (typeof x === "number" || typeof y === "number") return x === y;
  if (Array.isArray(x) || Array.isArray(y)) {
    return (
      Array.isArray(x) &&
      Array.isArray(y) &&
      x.length === y.length &&
      x.every((item, index) => jsonEquals(item, y[index]))
    );
  }
  if (isPlainObject(x) && isPlainObject(y)) {
    const keys = Object.keys(x).filter((key) => x[key] !== undefined);
    const other = Object.keys(y).filter((key) => y[key] !== undefined);
    return keys.length === other.length && keys.every((key) => key in y && jsonEquals(x[key], y[key]));
  }
  return false;
}

/** The ids and messages compared above are quoted as JSON strings in error messages. */
function quoted(text: string): string {
  return JSON.stringify(text);
}

function codePoints(text: string): number {
  return text.length <= MAX_ID_CHARS ? text.length : Array.from(text).length;
}
