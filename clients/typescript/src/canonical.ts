// Canonical JSON, byte for byte the text of the service's `canonical_json` (Python's
// `json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`), and the
// SHA-256 of it: what derived message ids and a compaction's `range_sha256` hash.
//
// The service reads the JSON this client sends, so a value here is hashed as Python hashes
// what `JSON.parse` of our own serialization gives it. Three things differ from
// `JSON.stringify` and are done by hand:
// - keys sort by code point, as Python sorts strings (UTF-16 order differs above U+FFFF);
// - numbers take Python's spelling: a JSON number with a fraction or an exponent is a Python
//   float, written as `repr` writes it (`1e-07`, `1.5e-05`, `1e+21`); one without is an int;
// - a lone surrogate is kept as it is (Python keeps it; `JSON.stringify` escapes it) and
//   hashed as Python's `surrogatepass` encodes it.

import { createHash } from "node:crypto";

import { InvalidSnapshot } from "./errors.js";

/** A JSON value as this client reads and writes it. */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };
/** A JSON object. */
export type JsonObject = { [key: string]: JsonValue };

/** The canonical JSON text of `value`. Throws {@link InvalidSnapshot} (its `field` the path
 * as the service names fields, `messages[3].content`; empty for the value itself) for what JSON cannot hold: a number that is not finite, a bigint,
 * `undefined` or a function in an array, an object that is not a plain object or array (a
 * `Date`, a `Uint8Array`, a `Map`). A property whose value is `undefined` is left out, as
 * `JSON.stringify` leaves it out. */
export function canonicalJson(value: unknown): string {
  const out: string[] = [];
  write(value, "", out);
  return out.join("");
}

/** SHA-256 (64 lowercase hex digits) of the UTF-8 of `text`, a lone surrogate encoded as
 * Python's `surrogatepass` encodes it (a message holding one hashes as the service hashes it). */
export function sha256Hex(text: string): string {
  return createHash("sha256").update(utf8(text)).digest("hex");
}

/** The UTF-8 bytes of `text`; a lone surrogate as its three-byte form (`surrogatepass`). */
export function utf8(text: string): Uint8Array {
  if (text.isWellFormed()) {
    return Buffer.from(text, "utf8");
  }
  const bytes: number[] = [];
  for (const char of text) {
    const code = char.codePointAt(0) ?? 0;
    if (code >= 0xd800 && code <= 0xdfff) {
      bytes.push(0xe0 | (code >> 12), 0x80 | ((code >> 6) & 0x3f), 0x80 | (code & 0x3f));
    } else {
      bytes.push(...Buffer.from(char, "utf8"));
    }
  }
  return Uint8Array.from(bytes);
}

function write(value: unknown, path: string, out: string[]): void {
  if (value === null) {
    out.push("null");
  } else if (typeof value === "string") {
    out.push(quote(value));
  } else if (typeof value === "boolean") {
    out.push(value ? "true" : "false");
  } else if (typeof value === "number") {
    out.push(pythonNumber(value, path));
  } else if (Array.isArray(value)) {
    writeArray(value, path, out);
  } else if (isPlainObject(value)) {
    writeObject(value, path, out);
  } else {
    throw new InvalidSnapshot(path, `${describe(value)} is not JSON`);
  }
}

function writeArray(items: readonly unknown[], path: string, out: string[]): void {
  out.push("[");
  items.forEach((item, index) => {
    if (index > 0) out.push(",");
    write(item, `${path}[${index}]`, out);
  });
  out.push("]");
}

function writeObject(object: Record<string, unknown>, path: string, out: string[]): void {
  const keys = Object.keys(object)
    .filter((key) => object[key] !== undefined)
    .sort(compareCodePoints);
  out.push("{");
  keys.forEach((key, index) => {
    if (index > 0) out.push(",");
    out.push(quote(key), ":");
    write(object[key], path ? `${path}.${key}` : key, out);
  });
  out.push("}");
}

/** Whether `value` is an object literal (or `Object.create(null)`): what JSON has objects for. */
export function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (typeof value !== "object" || value === null) return false;
  const prototype: unknown = Object.getPrototypeOf(value);
  return prototype === Object.prototype || prototype === null;
}

function describe(value: unknown): string {
  if (value === undefined) return "undefined";
  if (typeof value === "object" && value !== null) {
    return `an object of class ${value.constructor?.name ?? "unknown"}`;
  }
  return `a ${typeof value}`;
}

// --- strings --------------------------------------------------------------------------------

const ESCAPES: Record<string, string> = {
  '"': '\\"',
  "\\": "\\\\",
  "\b": "\\b",
  "\f": "\\f",
  "\n": "\\n",
  "\r": "\\r",
  "\t": "\\t",
};
// What Python's encoder escapes with ensure_ascii=False: the quote, the backslash and the
// C0 controls; everything else (DEL, U+2028, non-ASCII, a lone surrogate) is written as is.
const NEEDS_ESCAPE = /["\\\u0000-\u001f]/g;

function quote(text: string): string {
  const body = text.replace(
    NEEDS_ESCAPE,
    (char) => ESCAPES[char] ?? `\\u${char.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
  return `"${body}"`;
}

/** Python's order of two strings: by code point (a lone surrogate is its own code point). */
export function compareCodePoints(a: string, b: string): number {
  const length = Math.min(a.length, b.length);
  let i = 0;
  while (i < length && a.charCodeAt(i) === b.charCodeAt(i)) i++;
  if (i === length) return a.length - b.length;
  const x = a.charCodeAt(i);
  const y = b.charCodeAt(i);
  if (!isSurrogate(x) && !isSurrogate(y)) return x - y;
  // A surrogate on either side: compare the code points from here on (rare: only then do
  // UTF-16 units and code points order differently).
  const left = Array.from(a.slice(i), (c) => c.codePointAt(0) ?? 0);
  const right = Array.from(b.slice(i), (c) => c.codePointAt(0) ?? 0);
  const both = Math.min(left.length, right.length);
  for (let k = 0; k < both; k++) {
    const diff = (left[k] ?? 0) - (right[k] ?? 0);
    if (diff !== 0) return diff;
  }
  return left.length - right.length;
}

function isSurrogate(unit: number): boolean {
  return unit >= 0xd800 && unit <= 0xdfff;
}

// --- numbers --------------------------------------------------------------------------------

/** The text Python's `canonical_json` writes for the number `JSON.stringify` writes as
 * `String(value)`: the same digits (both are the shortest that read back as the value), in
 * Python's layout. */
export function pythonNumber(value: number, path = ""): string {
  if (!Number.isFinite(value)) {
    throw new InvalidSnapshot(path, `${value} is not valid JSON (only finite numbers are)`);
  }
  const text = String(value); // "-0" never: String(-0) is "0", as JSON.stringify writes it
  if (!/[.e]/.test(text)) return text; // an int to Python
  const { negative, digits, point } = decimal(text);
  return (negative ? "-" : "") + floatRepr(digits, point);
}

/** `0.DIGITS * 10**point`: the significant digits of a JS number's text and where the
 * decimal point goes (the `decpt` of David Gay's dtoa, which Python formats from). */
function decimal(text: string): { negative: boolean; digits: string; point: number } {
  const negative = text.startsWith("-");
  const [mantissa = "", exponent = "0"] = (negative ? text.slice(1) : text).split("e");
  const [whole = "", fraction = ""] = mantissa.split(".");
  const all = whole + fraction;
  const leading = all.length - all.replace(/^0+/, "").length;
  const digits = all.slice(leading).replace(/0+$/, "") || "0";
  return { negative, digits, point: whole.length - leading + Number(exponent) };
}

/** Python's `float.__repr__` of `0.DIGITS * 10**point`: positional while -4 < point <= 16,
 * else scientific with a signed exponent of at least two digits. */
function floatRepr(digits: string, point: number): string {
  if (point > -4 && point <= 16) {
    if (point <= 0) return `0.${"0".repeat(-point)}${digits}`;
    if (point >= digits.length) return `${digits}${"0".repeat(point - digits.length)}.0`;
    return `${digits.slice(0, point)}.${digits.slice(point)}`;
  }
  const exponent = point - 1;
  const mantissa = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
  const sign = exponent < 0 ? "-" : "+";
  return `${mantissa}e${sign}${String(Math.abs(exponent)).padStart(2, "0")}`;
}
