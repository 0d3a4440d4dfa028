// Server-Sent Events as the WHATWG HTML standard parses them ("Interpreting an event
// stream"): lines end in CRLF, LF or CR; `data` lines join with "\n"; `id` sets the last
// event id (unless it holds NUL); `retry` sets the reconnection delay; a line starting with
// ":" is a comment (the service's keep-alive); a blank line dispatches the event.

/** One dispatched event: its `data`, and the last event id as of it (the stream id). */
export interface SseMessage {
  id: string;
  event: string;
  data: string;
}

/** What the parser learned besides the events: the reconnection delay the server asked for. */
export interface SseState {
  lastEventId: string;
  retryMs: number | null;
}

/** Feeds text chunks in, takes dispatched events out. */
export class SseParser {
  readonly state: SseState;
  private buffer = "";
  private data: string[] = [];
  private eventType = "";
  private pendingCr = false;

  constructor(lastEventId = "") {
    this.state = { lastEventId, retryMs: null };
  }

  /** The events completed by `chunk` (decoded text; a chunk may end mid-line). */
  push(chunk: string): SseMessage[] {
    let text = chunk;
    if (this.pendingCr && text.startsWith("\n")) text = text.slice(1); // the LF of a split CRLF
    this.pendingCr = text.endsWith("\r");
    this.buffer += text;
    const lines = this.buffer.split(/\r\n|\r|\n/);
    this.buffer = lines.pop() ?? ""; // the unfinished line
    const out: SseMessage[] = [];
    for (const line of lines) {
      const message = this.line(line);
      if (message !== null) out.push(message);
    }
    return out;
  }

  private line(line: string): SseMessage | null {
    if (line === "") return this.dispatch();
    if (line.startsWith(":")) return null;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") this.data.push(value);
    else if (field === "event") this.eventType = value;
    else if (field === "id" && !value.includes("\0")) this.state.lastEventId = value;
    else if (field === "retry" && /^[0-9]+$/.test(value)) this.state.retryMs = Number(value);
    return null;
  }

  private dispatch(): SseMessage | null {
    const data = this.data;
    const event = this.eventType;
    this.data = [];
    this.eventType = "";
    if (data.length === 0) return null;
    return { id: this.state.lastEventId, event: event || "message", data: data.join("\n") };
  }
}
