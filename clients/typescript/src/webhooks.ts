// Webhook signatures (docs/http.md "Webhooks"): `X-Compactor-Signature: t=T,v1=HEX`, HEX the
// HMAC-SHA256 under the webhook's secret of `T.` followed by the raw body. What a receiver
// checks, and what a review hook signs its answer with; the same rules as the service's
// `worker.api.webhooks.sign` and `verify`, checked against them by the shared fixtures.

import { createHmac, timingSafeEqual } from "node:crypto";

import { utf8 } from "./canonical.js";

export const SIGNATURE_HEADER = "X-Compactor-Signature";
/** How old (or how far ahead) a signature's timestamp may be, by default: five minutes. */
export const DEFAULT_TOLERANCE_S = 300;

const TIMESTAMP = /^[0-9]{1,15}$/;
const MAC = /^[0-9a-f]{64}$/;
// The characters Python's str.strip() removes (str.isspace): a part's name is stripped so.
const PYTHON_SPACE = /^[\t\n\v\f\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+|[\t\n\v\f\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+$/g;

/** The raw body of a delivery: its bytes (a string is taken as its UTF-8). */
export type Body = Uint8Array | ArrayBuffer | string;

/** The header value signing `body` at `timestamp` (whole seconds since the epoch). */
export function signWebhook(secret: string, timestamp: number, body: Body): string {
  return `t=${timestamp},v1=${mac(secret, timestamp, bytesOf(body))}`;
}

export interface VerifyOptions {
  /** Seconds a timestamp may be away from `now` (default 300). */
  toleranceS?: number;
  /** The time to check against, in seconds since the epoch (default: the clock's). */
  now?: number;
}

/** Whether `header` signs `body` with `secret`, recently enough. Anything malformed (a missing
 * or repeated part, a `t` that is not 1-15 ASCII digits, a `v1` that is not 64 lowercase hex
 * digits, a secret that is not well-formed Unicode, arguments of the wrong type) is `false`,
 * never an exception, so that a receiver answers a hostile header as unauthorized. Compare the
 * raw body, as it arrived, not a re-serialization of its JSON. */
export function verifyWebhook(secret: unknown, header: unknown, body: unknown, options: VerifyOptions = {}): boolean {
  const tolerance = options.toleranceS ?? DEFAULT_TOLERANCE_S;
  const now = options.now ?? Date.now() / 1000;
  if (typeof secret !== "string" || typeof header !== "string" || !isBody(body)) return false;
  if (typeof tolerance !== "number" || typeof now !== "number") return false;
  const parts = new Map<string, string[]>();
  for (const part of header.split(",")) {
    const at = part.indexOf("=");
    if (at < 0) continue;
    const name = part.slice(0, at).replace(PYTHON_SPACE, "");
    parts.set(name, [...(parts.get(name) ?? []), part.slice(at + 1)]);
  }
  const stamps = parts.get("t") ?? [];
  const macs = parts.get("v1") ?? [];
  if (stamps.length !== 1 || macs.length !== 1) return false;
  const [stamp = "", given = ""] = [stamps[0], macs[0]];
  if (!TIMESTAMP.test(stamp) || !MAC.test(given)) return false;
  const timestamp = Number(stamp);
  if (!(Math.abs(now - timestamp) <= tolerance)) return false; // false for a NaN tolerance too
  if (!secret.isWellFormed()) return false; // a secret with a lone surrogate: not one we issued
  const expected = mac(secret, timestamp, bytesOf(body));
  return timingSafeEqual(Buffer.from(expected, "ascii"), Buffer.from(given, "ascii"));
}

function mac(secret: string, timestamp: number, body: Uint8Array): string {
  return createHmac("sha256", utf8(secret)).update(`${timestamp}.`).update(body).digest("hex");
}

function isBody(body: unknown): body is Body {
  return typeof body === "string" || body instanceof Uint8Array || body instanceof ArrayBuffer;
}

function bytesOf(body: Body): Uint8Array {
  if (typeof body === "string") return utf8(body);
  return body instanceof Uint8Array ? body : new Uint8Array(body);
}
