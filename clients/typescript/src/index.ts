// compaction-worker's TypeScript client: the HTTP API of `compactor serve`, the pure rules an
// agent applies compactions by (the same as the Python package's, checked by shared fixtures),
// webhook signatures, and a session for an agent loop. The Vercel AI SDK adapter is
// `@compaction-worker/client/ai-sdk`.

export { canonicalJson, sha256Hex, type JsonObject, type JsonValue } from "./canonical.js";
export {
  CompactorClient,
  CONVERSATION_ID_PATTERN,
  MAX_REVISION,
  type ClientOptions,
  type CompactRequested,
  type Compacted,
  type ConversationsPage,
  type FollowOptions,
  type Recalled,
  type Snapshot,
  type StreamEvent,
  type SubmitResult,
  type Transcript,
  type WaitOptions,
  type Webhook,
} from "./client.js";
export {
  CompactorError,
  EventMismatch,
  InvalidEvent,
  InvalidSnapshot,
  isCompactorError,
  type ErrorCode,
} from "./errors.js";
export {
  OUTCOME_TYPES,
  isCompleted,
  isFailed,
  isOutcome,
  isProposed,
  isRejected,
  isReverted,
  isSkipped,
  parseEvent,
  type CompactionEvent,
  type Compaction,
  type CompletedEvent,
  type DeclinedEvent,
  type ElidedEvent,
  type ErrorInfo,
  type EventBase,
  type FailedEvent,
  type KnownEvent,
  type OtherEvent,
  type ProposedEvent,
  type RejectedEvent,
  type RevertedEvent,
  type SkippedEvent,
  type Summary,
  type TranscriptRef,
  type Trigger,
  type WireFormat,
  type WireMessage,
} from "./events.js";
export {
  MAX_ID_CHARS,
  applyCompaction,
  derivedMessageId,
  rangeDigest,
  sourceIds,
  type ApplicableEvent,
} from "./history.js";
export { CompactingSession, type Logger, type SessionOptions, type SessionStatus } from "./session.js";
export {
  DEFAULT_TOLERANCE_S,
  SIGNATURE_HEADER,
  signWebhook,
  verifyWebhook,
  type Body,
  type VerifyOptions,
} from "./webhooks.js";
