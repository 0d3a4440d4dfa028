// The inspector's one script. Everything it shows is also on the page without it; it inserts
// text only (textContent), never markup.
// - A conversation's timeline: live updates over the same SSE stream /v1 serves (a session
//   cookie instead of a key).
// - A held compaction's editor: the edit counted again as it is typed, by the server (the
//   project's tokenizer, the approval's own checks), through the page's "Count the edit" form.
"use strict";

(function () {
  const live = document.getElementById("live");
  const table = document.getElementById("events");
  if (!live || !table || !window.EventSource) {
    return;
  }
  const url = new URL(live.dataset.events, window.location.href);
  url.searchParams.set("after", live.dataset.after || "0");
  // The types the table lists (the page's filter), or every type.
  const listed = new Set((live.dataset.types || "").split(" ").filter(Boolean));
  const source = new EventSource(url.toString(), { withCredentials: true });
  let fresh = 0;

  function cell(row, text) {
    const td = document.createElement("td");
    td.textContent = text;
    row.appendChild(td);
    return td;
  }

  // As the page writes it: a narrow column breaks it after a dot, never inside a word.
  function eventName(td, type) {
    td.textContent = "";
    const name = document.createElement("span");
    name.className = "event-name";
    const parts = type.split(".");
    parts.forEach(function (part, k) {
      const word = document.createElement("span");
      word.className = "word";
      word.textContent = k < parts.length - 1 ? part + "." : part;
      name.appendChild(word);
    });
    td.appendChild(name);
  }

  function tokens(event) {
    const c = event.compaction;
    if (c && Number.isInteger(c.tokens_before)) {
      return c.tokens_before.toLocaleString() + " → " + c.tokens_after.toLocaleString();
    }
    const t = event.trigger;
    return t && Number.isInteger(t.projected_tokens) ? t.projected_tokens.toLocaleString() : "—";
  }

  source.addEventListener("message", function (message) {
    let event;
    try {
      event = JSON.parse(message.data);
    } catch (_error) {
      return;
    }
    if (document.getElementById("e-" + event.stream_id)) {
      return; // already on the page
    }
    if (listed.size && !listed.has(String(event.type))) {
      return; // not a type the table lists
    }
    const row = document.createElement("tr");
    row.id = "e-" + event.stream_id;
    row.className = "fresh";
    cell(row, String(event.revision));
    eventName(cell(row, ""), String(event.type));
    cell(row, tokens(event));
    const trigger = event.trigger;
    cell(row, trigger && Number.isInteger(trigger.threshold_tokens)
      ? trigger.threshold_tokens.toLocaleString() : "—");
    cell(row, String(event.reason || (event.reverted_event_id
      ? "restored compaction " + event.reverted_event_id : "")));
    cell(row, "");
    table.tBodies[0].appendChild(row);
    fresh += 1;
    live.textContent = fresh + " new event" + (fresh === 1 ? "" : "s") +
      " since this page was loaded (reload to redraw the chart and the actions).";
  });

  window.addEventListener("pagehide", function () {
    source.close();
  });
})();

(function () {
  const editor = document.getElementById("summary-edit");
  const figures = document.getElementById("edit-figures");
  if (!editor || !figures || !editor.dataset.preview || !window.fetch) {
    return;
  }
  const form = editor.form;
  const WAIT_MS = 400; // after the last keystroke: one count per pause, not per key
  let timer = 0;
  let asked = 0; // the newest count asked for; an older answer arriving late is dropped
  let pending = null;

  function show(text, failed) {
    figures.textContent = text;
    figures.classList.toggle("error", failed);
  }

  async function count() {
    const mine = ++asked;
    if (pending) {
      pending.abort();
    }
    pending = new AbortController();
    const body = new URLSearchParams(new FormData(form));
    figures.setAttribute("aria-busy", "true");
    try {
      const answer = await fetch(editor.dataset.preview, {
        method: "POST",
        body: body,
        headers: { "Accept": "application/json" },
        credentials: "same-origin",
        signal: pending.signal,
      });
      const data = await answer.json();
      if (mine !== asked) {
        return;
      }
      if (answer.ok) {
        show(String(data.text), false);
      } else {
        show("This edit cannot be approved: " + String(data.message || data.reason || data.error),
          true);
      }
    } catch (error) {
      if (mine === asked && error.name !== "AbortError") {
        show("The edit could not be counted just now (" + error.message + "); " +
          "Count the edit tries again.", true);
      }
    } finally {
      if (mine === asked) {
        figures.removeAttribute("aria-busy");
      }
    }
  }

  editor.addEventListener("input", function () {
    window.clearTimeout(timer);
    timer = window.setTimeout(count, WAIT_MS);
  });
})();
