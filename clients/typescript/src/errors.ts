// Errors as typed values: every error this client throws is a CompactorError whose `code` is
// the service's error code (the `error` of its JSON answer: `unauthorized`, `invalid_snapshot`,
// `no_snapshot`, `not_held`, ...), or one of the client's own for what happens before an
// answer (`unreachable`, `timeout`, `invalid_response`).

/** The error codes the HTTP API answers with (docs/http.md), and the client's own. A code
 * the service adds later arrives as its string. */
export type ErrorCode =
  | "unauthorized"
  | "forbidden"
  | "not_found"
  | "invalid_snapshot"
  | "invalid_request"
  | "expired"
  | "event_mismatch"
  | "no_snapshot"
  | "superseded"
  | "not_newest"
  | "compaction_in_progress"
  | "not_held"
  | "compactions_changed"
  | "edit_not_checkable"
  | "unsafe_url"
  | "redis_unavailable"
  | "broker_unavailable"
  | "internal"
  // the client's own
  | "invalid_event"
  | "unreachable"
  | "timeout"
  | "invalid_response"
  // an error status without the service's JSON (a proxy's page in front of it, say)
  | "http_error"
  | (string & {});

/** Anything this client throws. `status` is the HTTP status when the service answered, else
 * null; `field` the request field at fault when the service named one. */
export class CompactorError extends Error {
  override name = "CompactorError";
  readonly code: ErrorCode;
  readonly status: number | null;
  readonly field: string | null;
  /** The service's JSON answer as it came (null when there was none). */
  readonly body: unknown;

  constructor(
    code: ErrorCode,
    message: string,
    options: { status?: number | null; field?: string | null; body?: unknown; cause?: unknown } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    this.status = options.status ?? null;
    this.field = options.field ?? null;
    this.body = options.body ?? null;
  }

  /** Worth trying again later: the service or the network was unavailable (a `5xx`, a `408`,
   * a `429`, no answer), as opposed to a request the service refused for good. */
  get transient(): boolean {
    if (this.status === null) return this.code === "unreachable" || this.code === "timeout";
    return this.status >= 500 || this.status === 408 || this.status === 429;
  }
}

/** An event that does not describe these messages (Python's `EventMismatch`; the API's
 * `409 event_mismatch`): another conversation's, an edited history, applied already. */
export class EventMismatch extends CompactorError {
  override name = "EventMismatch";
  constructor(message: string) {
    super("event_mismatch", message);
  }
}

/** A snapshot (or a message of one) the service would refuse, naming the field as the
 * service names it (`messages[3].id`) and why. */
export class InvalidSnapshot extends CompactorError {
  override name = "InvalidSnapshot";
  readonly reason: string;
  constructor(field: string, reason: string) {
    super("invalid_snapshot", field ? `${field}: ${reason}` : reason, { field });
    this.reason = reason;
  }
}

/** An event that is not one: not JSON, not an object, or without the fields it must have. */
export class InvalidEvent extends CompactorError {
  override name = "InvalidEvent";
  constructor(field: string, reason: string) {
    super("invalid_event", `${field}: ${reason}`, { field });
  }
}

/** Whether `error` is a CompactorError, of `code` when given. */
export function isCompactorError(error: unknown, code?: ErrorCode): error is CompactorError {
  return error instanceof CompactorError && (code === undefined || error.code === code);
}
