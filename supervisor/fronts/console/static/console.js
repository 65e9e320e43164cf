// Stockade console: the live parts of the server-rendered pages (no framework, no inline
// script: the Content-Security-Policy allows this file only). Every change of state is a
// POST carrying the session's CSRF token (the body's data-csrf) in X-CSRF-Token.
"use strict";

(function () {
  const body = document.body;
  const csrf = body.dataset.csrf || "";
  const refreshMs = Math.max(200, 1000 * Number(body.dataset.refresh || "2"));

  // as html.visible and html.short on the server: every character that is not printable
  // (controls, bidi overrides and isolates, zero-width marks) shown as its escape in a marked
  // span; a long value cut, the whole on hover
  const HIDDEN = /(?! )[\p{C}\p{Z}]/gu; // what Python's str.isprintable refuses
  const SHORT = 64;

  function escaped(c) {
    const code = c.codePointAt(0);
    if (c === "\n") return "\\n";
    if (c === "\t") return "\\t";
    if (c === "\r") return "\\r";
    const hex = code.toString(16);
    if (code < 0x100) return "\\x" + hex.padStart(2, "0");
    return code < 0x10000 ? "\\u" + hex.padStart(4, "0") : "\\U" + hex.padStart(8, "0");
  }

  function visibleInto(parent, text) {
    let last = 0;
    for (const m of text.matchAll(HIDDEN)) {
      parent.appendChild(document.createTextNode(text.slice(last, m.index)));
      const span = document.createElement("span");
      span.className = "ctl";
      span.textContent = escaped(m[0]);
      parent.appendChild(span);
      last = m.index + m[0].length;
    }
    parent.appendChild(document.createTextNode(text.slice(last)));
  }

  function shortInto(parent, text) {
    const span = document.createElement("span");
    span.className = "val";
    const chars = Array.from(text);
    const cut = chars.length > SHORT ? chars.slice(0, SHORT - 1).join("") : text;
    HIDDEN.lastIndex = 0;
    if (cut !== text || HIDDEN.test(text)) span.title = text.replace(HIDDEN, escaped);
    visibleInto(span, cut);
    if (cut !== text) {
      const more = document.createElement("span");
      more.className = "more";
      more.textContent = "…";
      span.appendChild(more);
    }
    parent.appendChild(span);
  }

  function cell(row, text, href) {
    const td = document.createElement("td");
    if (href) {
      const a = document.createElement("a");
      a.href = href;
      shortInto(a, text);
      td.appendChild(a);
    } else {
      shortInto(td, text);
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
        const state = cell(tr, s.state_text); // sandboxes.state_text on the server
        state.className = "state " + s.state_class;
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

  function askAlways(form, ask) {
    const confirm = form.querySelector(".confirm-always");
    if (!confirm) return;
    confirm.hidden = !ask;
    if (ask) confirm.querySelector("button[type=submit]").focus();
    else form.querySelector("button[name=decision][value=allow-always]").focus();
  }

  function hook(form) {
    if (!form || form.dataset.hooked) return;
    form.dataset.hooked = "1";
    const row = form.closest("tr");
    if (row) {
      row.tabIndex = 0; // the keys act on the row that has the focus, never on another
      row.classList.add("request");
      row.addEventListener("click", (event) => {
        if (event.target === row || !event.target.closest("button, a, input")) row.focus();
      });
    }
    const cancel = form.querySelector("button.always-no");
    if (cancel) cancel.addEventListener("click", () => askAlways(form, false));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const by = event.submitter;
      if (by && by.name === "decision" && by.value === "allow-always") {
        askAlways(form, true); // Always is asked twice: the row's confirming button decides
        return;
      }
      const data = new FormData(form, by);
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
      if (event.ctrlKey || event.metaKey || event.altKey || event.repeat) return;
      const target = event.target;
      if (target && (target.tagName === "INPUT" || target.tagName === "SELECT")) return;
      const wanted = { o: "allow-once", a: "allow-always", d: "deny" }[event.key];
      const tbody = pendingBody();
      if (!wanted || !tbody) return;
      // only the request whose row has the (visible) focus: a key pressed with the focus
      // elsewhere does nothing
      const row = document.activeElement && document.activeElement.closest("tr.request");
      if (!row || !tbody.contains(row)) return;
      const form = row.querySelector("form.decision");
      if (wanted === "allow-always") { askAlways(form, true); return; }
      const button = row.querySelector("button[name=decision][value=" + wanted + "]");
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
      for (const c of data.counts || []) { // overview.counts: each a link to its list
        const n = document.querySelector("#" + CSS.escape(c.id) + " .n");
        if (n) n.textContent = String(c.value);
      }
    } catch (_e) { /* the next refresh tries again */ }
  }

  // A sandbox's CPU and memory: the server draws the charts (escaped SVG), swapped in here.
  async function refreshUsage(source) {
    try {
      const answer = await fetch(source, { credentials: "same-origin" });
      if (!answer.ok) return;
      const data = await answer.json();
      const old = document.getElementById("usage");
      if (!old) return;
      const box = document.createElement("div");
      box.innerHTML = data.chart; // workspace.usage_chart: every value escaped on the server
      if (box.firstElementChild) old.replaceWith(box.firstElementChild);
    } catch (_e) { /* the next refresh tries again */ }
  }

  // Times: the page says UTC (<time datetime>); shown in the viewer's zone, UTC on hover
  const pad = (n) => String(n).padStart(2, "0");
  function zoneName(minutes) {
    const sign = minutes < 0 ? "-" : "+";
    const a = Math.abs(minutes);
    return "UTC" + sign + pad(Math.floor(a / 60)) + ":" + pad(a % 60);
  }
  function localTimes(root) {
    for (const t of root.querySelectorAll("time[datetime]")) {
      const d = new Date(t.getAttribute("datetime"));
      if (isNaN(d)) continue;
      t.textContent = d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " "
        + pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
    }
  }
  function sinceInZone() {
    // the audit filter's `since` is read in the viewer's zone: tz carries it to the server
    const tz = document.getElementById("tz");
    if (!tz) return;
    const here = -new Date().getTimezoneOffset();
    const was = Number(tz.value || "0");
    const since = tz.form.querySelector("input[name=since]");
    if (since && since.value && was !== here) { // shown in another zone: the same moment here
      const d = new Date(since.value + ":00Z");
      d.setUTCMinutes(d.getUTCMinutes() + here - was);
      since.value = d.toISOString().slice(0, 16);
    }
    tz.value = String(here);
    const label = document.getElementById("since-zone");
    if (label) label.textContent = "(your time, " + zoneName(here) + ")";
  }
  localTimes(document);
  sinceInZone();

  function every(fn, source) {
    fn(source);
    window.setInterval(() => fn(source), refreshMs);
  }

  if (body.dataset.liveSandboxes) every(refreshSandboxes, body.dataset.liveSandboxes);
  if (body.dataset.liveOverview) every(refreshOverview, body.dataset.liveOverview);
  if (body.dataset.liveUsage) every(refreshUsage, body.dataset.liveUsage);
  if (body.dataset.liveApprovals) followApprovals(body.dataset.liveApprovals);
})();
