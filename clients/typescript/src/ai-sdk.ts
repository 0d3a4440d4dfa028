// The Vercel AI SDK (`ai` 6) kept compact by a CompactingSession: its `ModelMessage`s
// as the `openai` wire messages the service reads, and back, without loss; and a
// `prepareStep` that gives the model the compacted history before every step.
//
// No import of `ai` at run time: the types below are the SDK's message types, restated (its
// own `ModelMessage[]` is accepted, and what `fromWire` gives is one, as the tests check with
// the SDK's types).

import { isPlainObject, type JsonObject, type JsonValue } from "./canonical.js";
import type { WireMessage } from "./events.js";
import type { CompactingSession } from "./session.js";

/** The key of a wire message (and of a content part) under which what the `openai` format
 * has no field for rides along, passed through by the worker unread. */
export const EXTRA_KEY = "x_ai_sdk";

type ProviderOptions = Record<string, Record<string, JSONValue | undefined>>;
type JSONValue = null | string | number | boolean | { [key: string]: JSONValue | undefined } | JSONValue[];
/** Bytes (kept as base64 once sent), a base64 string, or a URL. */
type DataContent = string | Uint8Array | ArrayBuffer | URL;

export interface TextPart {
  type: "text";
  text: string;
  providerOptions?: ProviderOptions;
}
export interface ImagePart {
  type: "image";
  image: DataContent;
  mediaType?: string;
  providerOptions?: ProviderOptions;
}
export interface FilePart {
  type: "file";
  data: DataContent;
  filename?: string;
  mediaType: string;
  providerOptions?: ProviderOptions;
}
export interface ReasoningPart {
  type: "reasoning";
  text: string;
  providerOptions?: ProviderOptions;
}
export interface ToolCallPart {
  type: "tool-call";
  toolCallId: string;
  toolName: string;
  input: unknown;
  providerOptions?: ProviderOptions;
  providerExecuted?: boolean;
}
export interface ToolResultPart {
  type: "tool-result";
  toolCallId: string;
  toolName: string;
  output: ToolResultOutput;
  providerOptions?: ProviderOptions;
}
export type ToolResultOutput =
  | { type: "text"; value: string; providerOptions?: ProviderOptions }
  | { type: "json"; value: JSONValue; providerOptions?: ProviderOptions }
  | { type: "execution-denied"; reason?: string; providerOptions?: ProviderOptions }
  | { type: "error-text"; value: string; providerOptions?: ProviderOptions }
  | { type: "error-json"; value: JSONValue; providerOptions?: ProviderOptions }
  | { type: "content"; value: ToolResultContentPart[] };
export type ToolResultContentPart =
  | { type: "text"; text: string; providerOptions?: ProviderOptions }
  | { type: "media"; data: string; mediaType: string }
  | { type: "file-data"; data: string; mediaType: string; filename?: string; providerOptions?: ProviderOptions }
  | { type: "file-url"; url: string; mediaType?: string; providerOptions?: ProviderOptions }
  | { type: "file-id"; fileId: string | Record<string, string>; providerOptions?: ProviderOptions }
  | { type: "image-data"; data: string; mediaType: string; providerOptions?: ProviderOptions }
  | { type: "image-url"; url: string; providerOptions?: ProviderOptions }
  | { type: "image-file-id"; fileId: string | Record<string, string>; providerOptions?: ProviderOptions }
  | { type: "custom"; providerOptions?: ProviderOptions };
export interface ToolApprovalRequest {
  type: "tool-approval-request";
  approvalId: string;
  toolCallId: string;
  signature?: string;
  inputSchemaInput?: unknown;
}
export interface ToolApprovalResponse {
  type: "tool-approval-response";
  approvalId: string;
  approved: boolean;
  reason?: string;
  providerExecuted?: boolean;
}

export interface SystemModelMessage {
  role: "system";
  content: string;
  providerOptions?: ProviderOptions;
}
export interface UserModelMessage {
  role: "user";
  content: string | Array<TextPart | ImagePart | FilePart>;
  providerOptions?: ProviderOptions;
}
export interface AssistantModelMessage {
  role: "assistant";
  content: string | Array<TextPart | FilePart | ReasoningPart | ToolCallPart | ToolResultPart | ToolApprovalRequest>;
  providerOptions?: ProviderOptions;
}
export interface ToolModelMessage {
  role: "tool";
  content: Array<ToolResultPart | ToolApprovalResponse>;
  providerOptions?: ProviderOptions;
}
/** The AI SDK's `ModelMessage`. */
export type ModelMessage = SystemModelMessage | UserModelMessage | AssistantModelMessage | ToolModelMessage;

type Part = { type: string; [field: string]: unknown };
type Extra = Record<string, JsonValue>;

// --- to the wire ----------------------------------------------------------------------------

/** The messages as `openai` wire messages: text as text parts, images and files as
 * `image_url` and `file` parts, reasoning as `reasoning_content`, tool calls as `tool_calls`
 * (the input as JSON text), each tool result as a `tool` message. What the format has no
 * field for (provider options, a result's output kind, the tool's name, parts of other kinds)
 * rides along under `x_ai_sdk`. Bytes become base64 and a `URL` its text. A tool message
 * holding no tool result (only approval responses) has no wire form: `TypeError`. */
export function toWire(messages: readonly ModelMessage[]): WireMessage[] {
  return messages.flatMap((message, index) => messageToWire(message, index));
}

function messageToWire(message: ModelMessage, index: number): WireMessage[] {
  switch (message.role) {
    case "system":
      return [withExtra({ role: "system", content: message.content }, providerExtra(message))];
    case "user":
      return [withExtra({ role: "user", content: userContent(message.content) }, providerExtra(message))];
    case "assistant":
      return [assistantToWire(message)];
    case "tool":
      return toolToWire(message, index);
    default:
      throw new TypeError(`messages[${index}]: an AI SDK message has the role system, user, assistant or tool`);
  }
}

function userContent(content: UserModelMessage["content"]): JsonValue {
  return typeof content === "string" ? content : content.map((part) => partToWire(part as unknown as Part));
}

function assistantToWire(message: AssistantModelMessage): WireMessage {
  const wire: WireMessage = { role: "assistant" };
  const extra = providerExtra(message);
  if (typeof message.content === "string") {
    wire.content = message.content;
    return withExtra(wire, extra);
  }
  const content: JsonValue[] = [];
  const calls: JsonValue[] = [];
  const reasoning: ReasoningPart[] = [];
  const order: string[] = []; // c: a content part, t: a tool call, r: reasoning
  const callExtras: JsonValue[] = [];
  for (const part of message.content as unknown as Part[]) {
    if (part.type === "tool-call") {
      const call = part as unknown as ToolCallPart;
      const input = call.input === undefined ? "null" : JSON.stringify(call.input);
      calls.push({ id: call.toolCallId, type: "function", function: { name: call.toolName, arguments: input } });
      callExtras.push(rest(part, ["type", "toolCallId", "toolName", "input"]));
      order.push("t");
    } else if (part.type === "reasoning") {
      reasoning.push(part as unknown as ReasoningPart);
      order.push("r");
    } else {
      content.push(partToWire(part));
      order.push("c");
    }
  }
  wire.content = content.length > 0 ? content : null;
  if (calls.length > 0) wire.tool_calls = calls;
  if (reasoning.length > 0) wire.reasoning_content = reasoning.map((r) => r.text).join("\n\n");
  const plainReasoning = reasoning.length <= 1 && reasoning.every((r) => r.providerOptions === undefined);
  if (!plainReasoning) extra.reasoning = reasoning.map((r) => toJson(r) as JsonValue);
  if (callExtras.some((e) => Object.keys(e as object).length > 0)) extra.calls = callExtras;
  if (order.join("") !== naturalOrder(order)) extra.order = order.join("");
  return withExtra(wire, extra);
}

/** The order fromWire restores without being told: reasoning, content, then tool calls. */
function naturalOrder(order: readonly string[]): string {
  const count = (kind: string): string => kind.repeat(order.filter((k) => k === kind).length);
  return count("r") + count("c") + count("t");
}

function toolToWire(message: ToolModelMessage, index: number): WireMessage[] {
  const results = message.content.filter((part) => part.type === "tool-result") as ToolResultPart[];
  if (results.length === 0) {
    throw new TypeError(`messages[${index}]: a tool message without a tool result has no wire form`);
  }
  const others = message.content.filter((part) => part.type !== "tool-result").map((part) => toJson(part) as JsonValue);
  const layout = message.content.map((part) => (part.type === "tool-result" ? "r" : "o")).join("");
  return results.map((result, k) => {
    const { content, extra } = outputToWire(result.output);
    extra.toolName = result.toolName;
    if (result.providerOptions !== undefined) extra.providerOptions = toJson(result.providerOptions) as JsonValue;
    if (k === 0) {
      extra.first = true; // a new AI SDK tool message starts here
      Object.assign(extra, providerExtra(message));
      if (others.length > 0) Object.assign(extra, { others, layout });
    }
    return { role: "tool", tool_call_id: result.toolCallId, content, [EXTRA_KEY]: extra };
  });
}

function outputToWire(output: ToolResultOutput): { content: JsonValue; extra: Extra } {
  const extra: Extra = {};
  const fields = rest(output as unknown as Part, ["type", "value", "reason"]);
  if (Object.keys(fields).length > 0) extra.outputFields = fields;
  if (output.type !== "text") extra.output = output.type;
  switch (output.type) {
    case "text":
    case "error-text":
      return { content: output.value, extra };
    case "json":
    case "error-json":
      return { content: JSON.stringify(output.value), extra };
    case "execution-denied":
      if (output.reason === undefined) extra.noReason = true;
      return { content: output.reason ?? "", extra };
    case "content":
      return { content: output.value.map((part) => contentPartToWire(part as unknown as Part)), extra };
    default:
      return { content: "", extra: { output: "other", value: toJson(output) as JsonValue } };
  }
}

/** A tool result's `content` part: text and base64 images as the format has them. */
function contentPartToWire(part: Part): JsonValue {
  if (part.type === "text" && typeof part.text === "string") {
    return withExtra({ type: "text", text: part.text }, rest(part, ["type", "text"]));
  }
  if (part.type === "image-data" && typeof part.data === "string" && typeof part.mediaType === "string") {
    const url = `data:${part.mediaType};base64,${part.data}`;
    return withExtra({ type: "image_url", image_url: { url } }, { kind: "image-data", ...rest(part, ["type", "data", "mediaType"]) });
  }
  return { type: EXTRA_KEY, part: toJson(part) as JsonValue };
}

/** A user or assistant content part. */
function partToWire(part: Part): JsonValue {
  if (part.type === "text" && typeof part.text === "string") {
    return withExtra({ type: "text", text: part.text }, rest(part, ["type", "text"]));
  }
  if (part.type === "image") {
    const { url, form } = dataUrl(part.image as DataContent, part.mediaType);
    const extra = rest(part, ["type", "image"]);
    if (form !== "url") extra.form = form;
    return withExtra({ type: "image_url", image_url: { url } }, extra);
  }
  if (part.type === "file" && !isWebUrl(part.data)) {
    const { url, form } = dataUrl(part.data as DataContent, part.mediaType);
    const file: JsonObject = { file_data: url };
    if (typeof part.filename === "string") file.filename = part.filename;
    const extra = rest(part, ["type", "data", "filename"]);
    if (form !== "url") extra.form = form;
    return withExtra({ type: "file", file }, extra);
  }
  return { type: EXTRA_KEY, part: toJson(part) as JsonValue };
}

/** The data as a URL the format takes, and what it was: `url` (a URL or data URL string,
 * given back as it was), `base64` (a base64 string) or `bytes` (given back as base64). */
function dataUrl(data: DataContent, mediaType: unknown): { url: string; form: "url" | "base64" | "bytes" } {
  const type = typeof mediaType === "string" ? mediaType : "application/octet-stream";
  if (data instanceof URL) return { url: data.href, form: "url" };
  if (typeof data === "string") {
    return /^(https?|data):/i.test(data) ? { url: data, form: "url" } : { url: `data:${type};base64,${data}`, form: "base64" };
  }
  const bytes = data instanceof Uint8Array ? data : new Uint8Array(data);
  return { url: `data:${type};base64,${Buffer.from(bytes).toString("base64")}`, form: "bytes" };
}

function isWebUrl(data: unknown): boolean {
  return data instanceof URL || (typeof data === "string" && /^https?:/i.test(data));
}

// --- from the wire --------------------------------------------------------------------------

/** The inverse of {@link toWire}: `fromWire(toWire(m))` equals `m` (bytes given back as base64,
 * a `URL` as its text). Wire messages from elsewhere (a compaction's summary, a stripped call's
 * marker) read as the nearest AI SDK message: a user text, a tool call whose input is the
 * marker, a text output. */
export function fromWire(messages: readonly WireMessage[]): ModelMessage[] {
  const out: ModelMessage[] = [];
  const toolNames = new Map<string, string>();
  messages.forEach((wire, index) => {
    const extra = isPlainObject(wire[EXTRA_KEY]) ? (wire[EXTRA_KEY] as Extra) : {};
    switch (wire.role) {
      case "system":
      case "developer":
        out.push(withOptions({ role: "system", content: textOf(wire.content) }, extra));
        break;
      case "user":
        out.push(withOptions({ role: "user", content: userFromWire(wire.content) }, extra));
        break;
      case "assistant":
        out.push(assistantFromWire(wire, extra, toolNames));
        break;
      case "tool":
        toolFromWire(wire, extra, toolNames, out);
        break;
      default:
        throw new TypeError(`messages[${index}]: the role ${String(wire.role)} has no AI SDK message`);
    }
  });
  return out;
}

function userFromWire(content: unknown): UserModelMessage["content"] {
  if (!Array.isArray(content)) return textOf(content);
  return content.map((part) => partFromWire(part)) as unknown as UserModelMessage["content"];
}

function assistantFromWire(wire: WireMessage, extra: Extra, toolNames: Map<string, string>): AssistantModelMessage {
  const content = wire.content;
  const calls = Array.isArray(wire.tool_calls) ? wire.tool_calls : [];
  if (typeof content === "string" && calls.length === 0 && wire.reasoning_content === undefined) {
    return withOptions({ role: "assistant", content }, extra);
  }
  const parts: Part[] = Array.isArray(content) ? content.map((part) => partFromWire(part)) : [];
  if (typeof content === "string" && content !== "") parts.push({ type: "text", text: content });
  const reasoning = reasoningFromWire(wire, extra);
  const callExtras = Array.isArray(extra.calls) ? extra.calls : [];
  const toolCalls = calls.map((call, k) => {
    const { id, name, input } = callOf(call);
    toolNames.set(id, name);
    return { type: "tool-call", toolCallId: id, toolName: name, input, ...objectOr(callExtras[k]) } as Part;
  });
  const order = typeof extra.order === "string" ? extra.order : "r".repeat(reasoning.length) + "c".repeat(parts.length) + "t".repeat(toolCalls.length);
  const queues: Record<string, Part[]> = { r: reasoning, c: parts, t: toolCalls };
  const ordered = [...order].flatMap((kind) => queues[kind]?.splice(0, 1) ?? []);
  ordered.push(...reasoning, ...parts, ...toolCalls); // whatever the order no longer names
  return withOptions({ role: "assistant", content: ordered as unknown as AssistantModelMessage["content"] }, extra);
}

function reasoningFromWire(wire: WireMessage, extra: Extra): Part[] {
  if (Array.isArray(extra.reasoning)) return extra.reasoning.map((r) => objectOr(r) as Part);
  const text = wire.reasoning_content ?? wire.reasoning;
  return typeof text === "string" ? [{ type: "reasoning", text }] : [];
}

function callOf(call: unknown): { id: string; name: string; input: unknown } {
  const c = objectOr(call);
  const fn = objectOr(c.function);
  const args = typeof fn.arguments === "string" ? fn.arguments : "null";
  let input: unknown;
  try {
    input = JSON.parse(args);
  } catch {
    input = args; // not JSON (a model's broken arguments): given back as the text
  }
  return { id: String(c.id ?? ""), name: String(fn.name ?? ""), input };
}

function toolFromWire(wire: WireMessage, extra: Extra, toolNames: Map<string, string>, out: ModelMessage[]): void {
  const id = String(wire.tool_call_id ?? "");
  const result: ToolResultPart = {
    type: "tool-result",
    toolCallId: id,
    toolName: typeof extra.toolName === "string" ? extra.toolName : (toolNames.get(id) ?? ""),
    output: outputFromWire(wire.content, extra),
  };
  if (isPlainObject(extra.providerOptions)) result.providerOptions = extra.providerOptions as ProviderOptions;
  const previous = out.at(-1);
  if (previous?.role === "tool" && extra.first !== true) {
    previous.content.push(result);
    arrange(previous);
    return;
  }
  const message: ToolModelMessage = withOptions({ role: "tool", content: [result] }, extra);
  if (Array.isArray(extra.others) && typeof extra.layout === "string") {
    layouts.set(message, { layout: extra.layout, others: extra.others.map((o) => objectOr(o) as unknown as ToolApprovalResponse) });
  }
  arrange(message);
  out.push(message);
}

// A tool message's parts other than results (approval responses), and where they go among
// its results ("roor": result, other, other, result), kept until all its results are read.
const layouts = new WeakMap<ToolModelMessage, { layout: string; others: ToolApprovalResponse[] }>();

function arrange(message: ToolModelMessage): void {
  const plan = layouts.get(message);
  if (plan === undefined) return;
  const results: ToolModelMessage["content"] = message.content.filter((part) => part.type === "tool-result");
  if (results.length < plan.layout.replaceAll("o", "").length) return; // more results to come
  const others: ToolModelMessage["content"] = [...plan.others];
  message.content = [...plan.layout].flatMap((kind) => (kind === "r" ? results.splice(0, 1) : others.splice(0, 1)));
  message.content.push(...results, ...others);
  layouts.delete(message);
}

function outputFromWire(content: unknown, extra: Extra): ToolResultOutput {
  const kind = typeof extra.output === "string" ? extra.output : "text";
  const options = objectOr(extra.outputFields);
  const text = textOf(content);
  if (kind === "other" && isPlainObject(extra.value)) return extra.value as unknown as ToolResultOutput;
  if (kind === "content" && Array.isArray(content)) {
    const value = content.map((part) => contentPartFromWire(part)) as unknown as ToolResultContentPart[];
    return { type: "content", value, ...options };
  }
  if (kind === "json" || kind === "error-json") {
    try {
      return { type: kind, value: JSON.parse(text) as JSONValue, ...options };
    } catch {
      // a stripped output's marker: text now
    }
  }
  if (kind === "execution-denied") {
    return extra.noReason === true && text === "" ? { type: kind, ...options } : { type: kind, reason: text, ...options };
  }
  return { type: kind === "error-text" ? "error-text" : "text", value: text, ...options };
}

function contentPartFromWire(part: unknown): Part {
  const p = objectOr(part);
  const extra = isPlainObject(p[EXTRA_KEY]) ? (p[EXTRA_KEY] as Extra) : {};
  if (p.type === EXTRA_KEY) return objectOr(p.part) as Part;
  if (p.type === "image_url" && extra.kind === "image-data") {
    const { data, mediaType } = splitDataUrl(String(objectOr(p.image_url).url ?? ""));
    return { type: "image-data", data, mediaType, ...rest(extra, ["kind"]) };
  }
  if (p.type === "text") return { type: "text", text: String(p.text ?? ""), ...extra };
  return { type: "text", text: JSON.stringify(p) };
}

function partFromWire(part: unknown): Part {
  const p = objectOr(part);
  const extra = isPlainObject(p[EXTRA_KEY]) ? (p[EXTRA_KEY] as Extra) : {};
  if (p.type === EXTRA_KEY) return objectOr(p.part) as Part;
  if (p.type === "text") return { type: "text", text: String(p.text ?? ""), ...extra };
  const options = rest(extra, ["form"]);
  if (p.type === "image_url") {
    const url = String(objectOr(p.image_url).url ?? "");
    return { type: "image", image: fromDataUrl(url, extra.form), ...options };
  }
  if (p.type === "file") {
    const file = objectOr(p.file);
    const url = String(file.file_data ?? "");
    const mediaType = typeof options.mediaType === "string" ? options.mediaType : splitDataUrl(url).mediaType;
    const filePart: Part = { type: "file", data: fromDataUrl(url, extra.form), ...options, mediaType };
    if (typeof file.filename === "string") filePart.filename = file.filename;
    return filePart;
  }
  return { type: "text", text: JSON.stringify(p) }; // a part of the wire's own we do not map
}

function fromDataUrl(url: string, form: unknown): string {
  return form === "base64" || form === "bytes" ? splitDataUrl(url).data : url;
}

function splitDataUrl(url: string): { data: string; mediaType: string } {
  const match = /^data:([^;,]*)(?:;[^,]*)?,(.*)$/s.exec(url);
  return match ? { mediaType: match[1] ?? "", data: match[2] ?? "" } : { mediaType: "", data: url };
}

// --- the agent loop -------------------------------------------------------------------------

/** What `generateText`/`streamText` call before every step (`prepareStep`): the messages of the
 * step the model has not been given yet go to the session (a snapshot, in the background), and
 * the model is given the session's history instead, with every compaction that has arrived
 * applied. Never waits for the service. A history that no longer begins with what the session
 * was given (cleared, edited) is given again whole (`replaceMessages`).
 *
 * ```ts
 * const prepareStep = compactingPrepareStep(session);
 * await generateText({ model, tools, messages, prepareStep, stopWhen: stepCountIs(10) });
 * ```
 */
export function compactingPrepareStep(
  session: CompactingSession,
): (options: { messages: ModelMessage[] }) => { messages: ModelMessage[] } {
  let given = 0; // how many of the agent's messages the session has
  let lastKey = ""; // the wire form of the last of them, to notice an edited history
  return ({ messages }) => {
    const last = messages[given - 1];
    const continues = given <= messages.length && (given === 0 || (last !== undefined && keyOf(last) === lastKey));
    if (!continues) {
      session.replaceMessages(toWire(messages));
    } else if (messages.length > given) {
      session.extend(toWire(messages.slice(given)));
    }
    given = messages.length;
    const newest = messages.at(-1);
    lastKey = newest === undefined ? "" : keyOf(newest);
    return { messages: fromWire(session.requestMessages()) };
  };
}

function keyOf(message: ModelMessage): string {
  return JSON.stringify(toWire([message]));
}

// --- helpers --------------------------------------------------------------------------------

/** A JSON copy of an AI SDK value: bytes as base64, a URL as its text, undefined left out. */
function toJson(value: unknown): unknown {
  if (value instanceof URL) return value.href;
  if (value instanceof Uint8Array || value instanceof ArrayBuffer) {
    return Buffer.from(value instanceof Uint8Array ? value : new Uint8Array(value)).toString("base64");
  }
  if (Array.isArray(value)) return value.map((item) => (item === undefined ? null : toJson(item)));
  if (typeof value === "object" && value !== null) {
    const out: Record<string, unknown> = {};
    for (const [key, item] of Object.entries(value)) if (item !== undefined) out[key] = toJson(item);
    return out;
  }
  return value;
}

/** The fields of `part` other than `known`, as JSON (what rides along). */
function rest(part: Record<string, unknown>, known: readonly string[]): Extra {
  const out: Extra = {};
  for (const [key, value] of Object.entries(part)) {
    if (!known.includes(key) && value !== undefined) out[key] = toJson(value) as JsonValue;
  }
  return out;
}

function providerExtra(message: { providerOptions?: ProviderOptions }): Extra {
  return message.providerOptions === undefined ? {} : { providerOptions: toJson(message.providerOptions) as JsonValue };
}

function withExtra(wire: JsonObject, extra: Extra): JsonObject {
  return Object.keys(extra).length === 0 ? wire : { ...wire, [EXTRA_KEY]: extra };
}

function withOptions<M extends ModelMessage>(message: M, extra: Extra): M {
  if (isPlainObject(extra.providerOptions)) message.providerOptions = extra.providerOptions as ProviderOptions;
  return message;
}

function objectOr(value: unknown): Record<string, unknown> {
  return isPlainObject(value) ? value : {};
}

function textOf(content: unknown): string {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content.map((part) => (isPlainObject(part) && typeof part.text === "string" ? part.text : "")).join("");
  }
  return "";
}
