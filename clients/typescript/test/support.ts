// What the tests share: the service they run against (started by tests/integration/test_typescript_client.py:
// a real `compactor serve`, Redis and workers on loopback, named by the environment), the
// shared fixtures, and histories to compact.

import { readFileSync } from "node:fs";
import { join } from "node:path";

import { CompactorClient, type WireMessage } from "../src/index.js";

export interface Service {
  base: string;
  key: string;
  otherKey: string;
  /** `compactor serve`'s process id (the loop test stops and continues it). */
  servePid: number | null;
  /** The workers' `auto_compact_threshold_tokens`. */
  threshold: number;
}

/** The service, or null when the suite runs without one (only the pure tests then run). */
export function service(): Service | null {
  const env = process.env;
  if (!env.COMPACTOR_BASE || !env.COMPACTOR_KEY) return null;
  return {
    base: env.COMPACTOR_BASE,
    key: env.COMPACTOR_KEY,
    otherKey: env.COMPACTOR_TEST_OTHER_KEY ?? "",
    servePid: env.COMPACTOR_TEST_SERVE_PID ? Number(env.COMPACTOR_TEST_SERVE_PID) : null,
    threshold: Number(env.COMPACTOR_TEST_THRESHOLD ?? "2000"),
  };
}

/** Why a test needing the service is skipped (false: it runs). */
export function needsService(): string | false {
  return service() === null ? "no service: COMPACTOR_BASE and COMPACTOR_KEY are not set" : false;
}

export function client(options: { key?: string; timeoutMs?: number } = {}): CompactorClient {
  const s = service();
  if (s === null) throw new Error("no service");
  return new CompactorClient({ baseUrl: s.base, apiKey: options.key ?? s.key, timeoutMs: options.timeoutMs ?? 10_000 });
}

/** A fixture of tests/fixtures/conformance (`COMPACTOR_TEST_CONFORMANCE_DIR`, else found from here). */
export function fixture<T = unknown>(name: string): T {
  const dir = process.env.COMPACTOR_TEST_CONFORMANCE_DIR ?? join(process.cwd(), "..", "..", "tests", "fixtures", "conformance");
  return JSON.parse(readFileSync(join(dir, name), "utf8")) as T;
}

/** A unique conversation id per test run (tests share one Redis). */
export function conversationId(name: string): string {
  return `ts-${name}-${process.pid}-${Math.floor(Math.random() * 1e9)}`;
}

/** A coding conversation in the `openai` format: `turns` tool exchanges of `words` words. */
export function history(turns: number, options: { words?: number; ids?: boolean; from?: number } = {}): WireMessage[] {
  const from = options.from ?? 0;
  const messages: WireMessage[] =
    from === 0
      ? [
          { role: "system", content: "You are a coding agent." },
          { role: "user", content: "Fix the failing test in src/pkg/core.py." },
        ]
      : [];
  for (let k = from; k < from + turns; k++) messages.push(...exchange(k, options.words ?? 300));
  if (options.ids) messages.forEach((message, index) => (message.id = `m-${from}-${index}`));
  return messages;
}

export function exchange(k: number, words = 300): WireMessage[] {
  const call = `call_${k}`;
  const text = Array.from({ length: words }, (_, i) => `token${k}_${i}`).join(" ");
  return [
    {
      role: "assistant",
      content: `Step ${k}.`,
      tool_calls: [{ id: call, type: "function", function: { name: "bash", arguments: JSON.stringify({ command: `cat src/mod_${k}.py` }) } }],
    },
    { role: "tool", tool_call_id: call, content: text },
  ];
}

/** Waits until `done()` holds, polling; throws with `what` after `timeoutMs`. */
export async function eventually<T>(what: string, done: () => T | Promise<T>, timeoutMs = 60_000): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await done();
    if (value) return value as NonNullable<T>;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** A TCP relay on loopback in front of the service, whose connections a test can cut (a
 * network fault, not a stand-in: the bytes are the server's). It keeps what each connection
 * sent first: the request line and headers. */
export class CuttingRelay {
  readonly requests: string[] = [];
  private readonly sockets = new Set<import("node:net").Socket>();
  private server: import("node:net").Server | null = null;
  port = 0;

  constructor(private readonly target: URL) {}

  async start(): Promise<string> {
    const net = await import("node:net");
    this.server = net.createServer((inbound) => {
      const outbound = net.connect(Number(this.target.port), this.target.hostname);
      this.sockets.add(inbound).add(outbound);
      let first = true;
      inbound.on("data", (chunk: Buffer) => {
        if (first) this.requests.push(chunk.toString("latin1").split("\r\n\r\n")[0] ?? "");
        first = false;
        outbound.write(chunk);
      });
      outbound.on("data", (chunk: Buffer) => inbound.write(chunk));
      const close = (): void => {
        inbound.destroy();
        outbound.destroy();
        this.sockets.delete(inbound);
        this.sockets.delete(outbound);
      };
      inbound.on("close", close).on("error", close);
      outbound.on("close", close).on("error", close);
    });
    await new Promise<void>((resolve) => this.server?.listen(0, "127.0.0.1", resolve));
    const address = this.server.address();
    this.port = typeof address === "object" && address !== null ? address.port : 0;
    return `http://127.0.0.1:${this.port}`;
  }

  /** Cut every open connection, as a network that drops them would. */
  cut(): void {
    for (const socket of this.sockets) socket.destroy();
    this.sockets.clear();
  }

  async stop(): Promise<void> {
    this.cut();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}
