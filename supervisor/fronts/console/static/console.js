// Stockade console: the live parts of the server-rendered pages (no framework, no inline
// script: the Content-Security-Policy allows this file only). Every change of state is a
// POST carrying the session's CSRF token (the body's data-csrf) in X-CSRF-Token.
"use strict";

(function () {
  const body = document.body;
  const csrf = body.dataset.csrf || "";
  const refreshMs = Math.max(200, 1000 * Number(body.dataset.refresh || "2"));

  function cell(row, text, href) {
    const td = document.createElement("td");
    if (href) {
      const a = document.createElement("a");
      a.href = href;
      a.textContent = text;
      td.appendChild(a);
    } else {
      td.textContent = text;
    }
    row.appendChild(td);
    return td;
  }

  function emptyRow(tbody, columns, text) {
    const tr = document.createElement("tr");
    tr.className = "empty";
    const td = cell(tr, text);
    td.colSpan = columns;
    tbody.appendChild(tr);
  }

  // Sandboxes: the list, refreshed while the page is open.
  async function refreshSandboxes(source) {
    const table = document.getElementById("sandboxes");
    if (!table) return;
    try {
      const answer = await fetch(source, { credentials: "same-origin" });
      if (answer.status === 401) { window.location.assign("/login"); return; }
      if (!answer.ok) return;
      const data = await answer.json();
      const tbody = document.createElement("tbody");
      for (const s of data.sandboxes) {
        const tr = document.createElement("tr");
        tr.dataset.key = s.key;
        cell(tr, s.tenant);
        cell(tr, s.key, s.href);
        // as sandboxes.state_text on the server
        const state = s.quarantined_since
          ? cell(tr, "QUARANTINED since " + s.quarantined_since + ": " + s.quarantine_reason)
          : cell(tr, s.state + (s.paused_since ? " since " + s.paused_since : ""));
        state.className = "state " + (s.quarantined_since ? "quarantined" : s.state.toLowerCase());
        cell(tr, s.engine);
        cell(tr, s.network || "-");
        cell(tr, s.age);
        cell(tr, s.idle);
        cell(tr, s.cpu_s === null ? "-" : String(s.cpu_s));
        cell(tr, s.memory_mb === null ? "-" : String(s.memory_mb));
        tbody.appendChild(tr);
      }
      if (!data.sandboxes.length) emptyRow(tbody, 9, "No sandboxes.");
      table.replaceChild(tbody, table.tBodies[0]);
    } catch (_e) { /* the next refresh tries again */ }
  }

  // Approvals: the pending queue over server-sent events, decisions without a page load.
  function pendingBody() {
    const table = document.getElementById("pending");
    return table ? table.tBodies[0] : null;
  }

  function rowOf(id) {
    const tbody = pendingBody();
    if (!tbody) return null;
    for (const input of tbody.querySelectorAll("input[name=id]")) {
      if (input.value === id) return input.closest("tr");
    }
    return null;
  }

  function tidy() {
    const tbody = pendingBody();
    if (!tbody) return;
    const rows = tbody.querySelectorAll("tr:not(.empty)");
    const empty = tbody.querySelector("tr.empty");
    if (rows.length && empty) empty.remove();
    if (!rows.length && !empty) emptyRow(tbody, 7, "Nothing waits.");
  }

  function addPending(item) {
    const tbody = pendingBody();
    if (!tbody || rowOf(item.id)) return;
    const tr = document.createElement("tr");
    for (const html of item.cells) {
      const td = document.createElement("td");
      td.innerHTML = html; // built and escaped by the server (approvals.pending_cells)
      tr.appendChild(td);
    }
    tbody.appendChild(tr);
    hook(tr.querySelector("form.decision"));
    tidy();
    tick();
  }

  function removePending(id) {
    const tr = rowOf(id);
    if (tr) tr.remove();
    tidy();
  }

  function hook(form) {
    if (!form || form.dataset.hooked) return;
    form.dataset.hooked = "1";
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const data = new FormData(form, event.submitter);
      const answer = await fetch(form.action, {
        method: "POST",
        credentials: "same-origin",
        headers: { "X-CSRF-Token": csrf },
        body: new URLSearchParams(data),
      });
      const id = data.get("id");
      if (answer.ok || answer.status === 404) removePending(String(id));
    });
  }

  function tick() {
    const now = Date.now() / 1000;
    for (const span of document.querySelectorAll(".deadline[data-expires]")) {
      const left = Math.max(0, Math.round(Number(span.dataset.expires) - now));
      span.textContent = left + " s left";
    }
  }

  function followApprovals(source) {
    document.querySelectorAll("form.decision").forEach(hook);
    const stream = new EventSource(source);
    stream.addEventListener("pending", (m) => addPending(JSON.parse(m.data)));
    stream.addEventListener("closed", (m) => removePending(JSON.parse(m.data).id));
    stream.addEventListener("open", () => body.setAttribute("data-stream", "open"));
    window.setInterval(tick, 1000);
    tick();
    document.addEventListener("keydown", (event) => {
      const target = event.target;
      if (target && (target.tagName === "INPUT" || target.tagName === "SELECT")) return;
      const wanted = { o: "allow-once", a: "allow-always", d: "deny" }[event.key];
      const tbody = pendingBody();
      if (!wanted || !tbody) return;
      const button = tbody.querySelector("button[value=" + wanted + "]");
      if (button) button.click();
    });
  }

  // Overview: the figures, refreshed while the page is open.
  async function refreshOverview(source) {
    try {
      const answer = await fetch(source, { credentials: "same-origin" });
      if (!answer.ok) return;
      const data = await answer.json();
      const shown = (v, unit) => (v === null || v === undefined ? "-" : String(v) + (unit || ""));
      const set = (id, text) => {
        const el = document.getElementById(id);
        if (el) el.textContent = text;
      };
      set("calls-per-s", shown(data.calls_per_s));
      set("calls", shown(data.calls));
      set("redactions", shown(data.redactions));
      set("p50", shown(data.p50_ms, " ms"));
      set("p95", shown(data.p95_ms, " ms"));
    } catch (_e) { /* the next refresh tries again */ }
  }

  function every(fn, source) {
    fn(source);
    window.setInterval(() => fn(source), refreshMs);
  }

  if (body.dataset.liveSandboxes) every(refreshSandboxes, body.dataset.liveSandboxes);
  if (body.dataset.liveOverview) every(refreshOverview, body.dataset.liveOverview);
  if (body.dataset.liveApprovals) followApprovals(body.dataset.liveApprovals);
})();
