// The inspector's one script: live updates of a conversation's timeline over the same SSE
// stream /v1 serves (a session cookie instead of a key). Everything it shows is also on the
// page without it; it inserts text only (textContent), never markup.
"use strict";

(function () {
  const live = document.getElementById("live");
  const table = document.getElementById("events");
  if (!live || !table || !window.EventSource) {
    return;
  }
  const url = new URL(live.dataset.events, window.location.href);
  url.searchParams.set("after", live.dataset.after || "0");
  const source = new EventSource(url.toString(), { withCredentials: true });
  let fresh = 0;

  function cell(row, text) {
    const td = document.createElement("td");
    td.textContent = text;
    row.appendChild(td);
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
    const row = document.createElement("tr");
    row.id = "e-" + event.stream_id;
    row.className = "fresh";
    cell(row, String(event.revision));
    cell(row, String(event.type));
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
