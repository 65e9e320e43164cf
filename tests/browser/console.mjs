// The console end to end in headless Chromium (Debian's /usr/bin/chromium, driven by
// playwright-core), against a real supervisor: tests/integration/test_console_browser.py
// starts the supervisor and runs this script with its addresses and tokens in CONSOLE_TEST
// (JSON). gRPC calls go through the `stockade` CLI, run as child processes. Each step
// prints a line; any failure exits non-zero with the reason. Screenshots of each page are
// written to the folder named by `artifacts` (git-ignored).
import { spawn } from "node:child_process";
import { mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { chromium } from "playwright-core";

const cfg = JSON.parse(process.env.CONSOLE_TEST);
const base = cfg.console;
const WAIT = 60_000;
const AXE = createRequire(import.meta.url).resolve("axe-core/axe.min.js");
const BIDI_KEY = cfg.key + "-invoice-\u202egpj.exe";
mkdirSync(cfg.artifacts, { recursive: true });

function step(text) { console.log("step: " + text); }
function check(ok, text) { if (!ok) throw new Error("check failed: " + text); }

function cli(token, args) {
  // a `stockade` CLI call to the gRPC API: { done: Promise<{code, out, err}>, child }
  const child = spawn(cfg.python, ["-m", "stockade.supervisor.cli", ...args], {
    env: { ...process.env, STOCKADE_ADDR: cfg.server, STOCKADE_TOKEN: token },
  });
  let out = "", err = "";
  child.stdout.on("data", (d) => { out += d; });
  child.stderr.on("data", (d) => { err += d; });
  const done = new Promise((resolve) => child.on("close", (code) => resolve({ code, out, err })));
  return { child, done };
}

async function shot(page, name) {
  await page.screenshot({ path: `${cfg.artifacts}/${name}.png`, fullPage: true });
}

async function signIn(context, token) {
  const page = await context.newPage();
  await page.goto(base + "/login");
  await page.fill("#token", token);
  await Promise.all([page.waitForNavigation(), page.click("#sign-in")]);
  return page;
}

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
const cspErrors = [];
try {
  // 1. no session: refused
  step("no session is refused");
  for (const path of ["/sandboxes.json", "/overview.json", "/audit/export.jsonl"]) {
    const answer = await fetch(base + path, { redirect: "manual" });
    check(answer.status === 401, `${path} without a session: ${answer.status}`);
  }
  const posted = await fetch(base + "/sandbox/action", {
    method: "POST", redirect: "manual",
    headers: { origin: base, "content-type": "application/x-www-form-urlencoded" },
    body: "action=destroy&key=" + encodeURIComponent(cfg.key),
  });
  check(posted.status === 401, "an action without a session: " + posted.status);

  const alice = await browser.newContext();
  const page = await alice.newPage();
  page.on("console", (m) => { if (/Content Security Policy/i.test(m.text())) cspErrors.push(m.text()); });
  await page.goto(base + "/sandboxes");
  check(page.url() === base + "/login", "a page without a session leads to /login: " + page.url());

  // 2. sign in: a wrong token is refused, the right one gets in
  step("sign in");
  await page.fill("#token", "not-a-token-at-all-0000");
  await Promise.all([page.waitForNavigation(), page.click("#sign-in")]);
  const refusal = await page.textContent("main");
  check(refusal.includes("not valid"), "a wrong token is refused: " + refusal);
  await shot(page, "login");
  await page.fill("#token", cfg.tokens.alice);
  await Promise.all([page.waitForNavigation(), page.click("#sign-in")]);
  check(page.url() === base + "/sandboxes", "signed in, on /sandboxes: " + page.url());
  const cookies = await alice.cookies();
  const session = cookies.find((c) => c.name === "stockade_console");
  check(session && session.httpOnly && session.sameSite === "Strict", "an HttpOnly, SameSite=Strict cookie");

  // 3. a sandbox appears after a call (the list refreshes by itself)
  step("a sandbox appears after a call");
  check(!(await page.textContent("#sandboxes")).includes(cfg.key), "not there before the call");
  const first = await cli(cfg.tokens.alice, ["exec", cfg.key, "--", "echo", "hello"]).done;
  check(first.code === 0, "the first call: " + first.err);
  // (a refresh taken while the container was being made shows it ABSENT: the next, RUNNING)
  await page.waitForSelector(`#sandboxes tr[data-key="${cfg.key}"] .state.running`, { timeout: WAIT });
  await shot(page, "sandboxes");

  // 4. an approval answered in the browser lets the waiting gRPC call proceed
  step("an approval answered in the browser");
  await page.goto(base + "/approvals");
  await page.waitForSelector("body[data-stream=open]", { timeout: WAIT });
  const waiting = cli(cfg.tokens.alice, ["exec", cfg.key, "--", "touch", "approved-in-browser"]);
  const row = page.locator("#pending tr", { hasText: "approved-in-browser" });
  await row.waitFor({ timeout: WAIT });
  check((await row.textContent()).includes("s left"), "the deadline counts down");
  await shot(page, "approvals");
  await row.locator("button[value=allow-once]").click();
  const answered = await waiting.done;
  check(answered.code === 0, "the call proceeded once allowed: " + answered.code + " " + answered.err);
  await row.waitFor({ state: "detached", timeout: WAIT });

  // 4a. Always: asked twice; the command is allowed from then on, without asking
  step("an approval answered Always, confirmed");
  const always = cli(cfg.tokens.alice, ["exec", cfg.key, "--", "touch", "always-allowed"]);
  const alwaysRow = page.locator("#pending tr", { hasText: "always-allowed" });
  await alwaysRow.waitFor({ timeout: WAIT });
  const confirmAlways = alwaysRow.locator("button[name=confirmed][value=allow-always]");
  check(!(await confirmAlways.isVisible()), "the confirming button shows only once Always is pressed");
  await alwaysRow.locator("button[name=decision][value=allow-always]").click();
  await confirmAlways.waitFor({ state: "visible", timeout: WAIT });
  check(await alwaysRow.isVisible(), "Always alone decided nothing: the row waits for the confirmation");
  await shot(page, "approvals-confirm-always");
  await confirmAlways.click();
  check((await always.done).code === 0, "the call allowed always proceeded");
  await alwaysRow.waitFor({ state: "detached", timeout: WAIT });
  const again = await cli(cfg.tokens.alice, ["exec", cfg.key, "--", "touch", "always-allowed"]).done;
  check(again.code === 0, "the same command again, without a decision: " + again.err);

  // 4b. the keyboard acts on the focused request only: `d` without a focus does nothing,
  // `o` on the focused row (its focus drawn) allows that one
  step("the keys act on the focused request only");
  const keyed = cli(cfg.tokens.alice, ["exec", cfg.key, "--", "touch", "allowed-by-key"]);
  const keyedRow = page.locator("#pending tr", { hasText: "allowed-by-key" });
  await keyedRow.waitFor({ timeout: WAIT });
  await page.evaluate(() => document.activeElement && document.activeElement.blur());
  await page.keyboard.press("d"); // no row has the focus: not a deny
  await page.keyboard.press("a"); // nor an Always
  check(!(await keyedRow.locator(".confirm-always").isVisible()), "a bare `a` asked nothing");
  await keyedRow.focus();
  const outline = await keyedRow.evaluate((tr) => getComputedStyle(tr).outlineStyle);
  check(outline === "solid", "the focused request shows its focus: " + outline);
  await page.keyboard.press("o");
  const keyedDone = await keyed.done;
  check(keyedDone.code === 0, "allowed with `o` on its row, not denied by the bare `d`: "
    + keyedDone.code + " " + keyedDone.out + keyedDone.err);
  await keyedRow.waitFor({ state: "detached", timeout: WAIT });

  // 4c. a 250 KB command: its size, its start and its end beside the buttons, the middle folded
  step("a 250 KB command folded");
  const chunk = "x".repeat(50_000);
  const big = cli(cfg.tokens.alice,
    ["exec", cfg.key, "--", "printf", "%s", "big-start", chunk, chunk, chunk, chunk, chunk, "big-end"]);
  const bigRow = page.locator("#pending tr", { hasText: "big-start" });
  await bigRow.waitFor({ timeout: WAIT });
  const bigText = await bigRow.textContent();
  check(bigText.includes("big-end") && /24\d\.\d KiB/.test(bigText) && bigText.includes("folded"),
    "the size and both ends: " + bigText.slice(0, 300));
  const box = await bigRow.boundingBox();
  check(box.height < 600, "the row stays short: " + box.height + " px");
  const end = await bigRow.locator("code.cmd").last().boundingBox();
  const buttons = await bigRow.locator("button[value=deny]").boundingBox();
  check(Math.abs(end.y - buttons.y) < 600, "the command's end beside its buttons");
  await shot(page, "approvals-big-command");
  await bigRow.locator("button[value=deny]").click();
  check((await big.done).code !== 0, "the big command denied");
  await bigRow.waitFor({ state: "detached", timeout: WAIT });

  // 4d. a write_file asked about (approvals.files) shows the diff it will make, folded with
  // its size, a secret of the file masked; allowed, the write happens
  step("a write's diff shown before it is allowed");
  const secret = "AKIA" + "Q3EXAMPLE7ZXCVB2";  // an AWS key id's shape: the scrubber masks it
  const writeFile = (content) => cli(cfg.tokens.alice,
    ["call", cfg.key, "write_file", JSON.stringify({ path: "diff-shown.toml", content })]);
  const created = writeFile(`key = "${secret}"\nport = 8080\n`);
  const createdRow = page.locator("#pending tr", { hasText: "write_file diff-shown.toml" });
  await createdRow.waitFor({ timeout: WAIT });
  check((await createdRow.textContent()).includes("+port = 8080"), "a new file's diff");
  await createdRow.locator("button[value=allow-once]").click();
  check((await created.done).code === 0, "the file written once allowed");
  await createdRow.waitFor({ state: "detached", timeout: WAIT });
  const changed = writeFile(`key = "${secret}"\nport = 9090\n`);
  const diffRow = page.locator("#pending tr", { hasText: "write_file diff-shown.toml" });
  await diffRow.waitFor({ timeout: WAIT });
  const diff = diffRow.locator("details.diff");
  check(await diff.evaluate((d) => d.open), "a short diff is shown open");
  const diffText = await diff.locator("pre.diff").innerText();
  check(diffText.includes("-port = 8080") && diffText.includes("+port = 9090"),
    "the lines it changes: " + diffText);
  check(diffText.includes("[REDACTED]") && !(await page.content()).includes(secret),
    "the old file's secret masked: " + diffText);
  check(/\d+ B, \d+ lines/.test(await diff.locator("summary").innerText()), "the diff's size");
  const removed = await diffRow.locator("pre.diff .del").first().evaluate((s) => getComputedStyle(s).color);
  const added = await diffRow.locator("pre.diff .add").first().evaluate((s) => getComputedStyle(s).color);
  check(removed !== added, "removed and added lines told apart: " + removed + " " + added);
  await shot(page, "approvals-diff");
  await diffRow.locator("button[value=allow-once]").click();
  check((await changed.done).code === 0, "the change written once allowed");
  await diffRow.waitFor({ state: "detached", timeout: WAIT });

  // 5. the same approval answered from the CLI disappears from the page
  step("an approval answered from the CLI disappears");
  const denied = cli(cfg.tokens.alice, ["exec", cfg.key, "--", "touch", "denied-from-cli"]);
  const other = page.locator("#pending tr", { hasText: "denied-from-cli" });
  await other.waitFor({ timeout: WAIT });
  const id = await other.locator("input[name=id]").inputValue();
  const resolve = await cli(cfg.tokens.alice,
    ["approvals", "resolve", id, "deny", "--approver", "carol-at-the-cli"]).done;
  check(resolve.code === 0, "the CLI resolved it: " + resolve.err);
  await other.waitFor({ state: "detached", timeout: WAIT });
  check((await denied.done).code !== 0, "the denied call failed");
  await page.reload();
  const decided = await page.textContent("#decided");
  check(decided.includes("carol-at-the-cli") && decided.includes("console:tenant:alice"),
    "the decided list names who decided: " + decided);
  await shot(page, "approvals-decided");

  // 6. the audit log, filtered: each row says what ran, what became of it and why
  step("audit filter");
  const guarded = await cli(cfg.tokens.alice, ["exec", cfg.key, "--", "rm", "-rf", "/"]).done;
  check(guarded.code !== 0, "the guard refused rm -rf /: " + guarded.out + guarded.err);
  await page.goto(base + "/audit");
  check(!(await page.isVisible("select[name=tenant]")), "a tenant user has no tenant selector");
  await page.fill("input[name=key]", cfg.key);
  await page.selectOption("select[name=outcome]", "refused");
  await Promise.all([page.waitForNavigation(), page.click("#filter")]);
  const column = (n) => page.locator(`#records tbody tr td:nth-child(${n})`).allTextContents();
  const TOOL = 4, DECISION = 6;
  const refused = await column(DECISION);
  check(refused.length >= 1 && refused.every((o) => /^(refused|failed)/.test(o)), "only refusals: " + refused);
  const rowOfText = async (text) => (await page.locator("#records tbody tr", { hasText: text }).first().innerText());
  const guardRow = await rowOfText("rm -rf /");
  check(/refused/.test(guardRow) && /guard: /.test(guardRow) && !/\ballowed\b/.test(guardRow),
    "a guard refusal: its command, decision and rule: " + guardRow);
  const deniedRow = await rowOfText("denied-from-cli");
  check(deniedRow.includes("approval: deny by carol-at-the-cli"), "a denial and who denied: " + deniedRow);
  const utc = await page.locator("#records tbody tr time").first().getAttribute("title");
  check(/UTC$/.test(utc), "UTC on hover: " + utc);
  check((await page.textContent("#since-zone")).includes("your time"), "since is read in the viewer's zone");
  await shot(page, "audit");
  await page.selectOption("select[name=outcome]", "ok");
  await page.fill("input[name=tool]", "exec");
  await Promise.all([page.waitForNavigation(), page.click("#filter")]);
  const fine = await column(DECISION);
  check(fine.length >= 2 && fine.every((o) => o === "allowed"), "successful calls only: " + fine);
  check((await column(TOOL)).every((t) => t === "exec"), "exec calls only: " + (await column(TOOL)));
  const approvedRow = await rowOfText("approved-in-browser");
  check(approvedRow.includes("approval: allow-once by console:tenant:alice"), "an approval: " + approvedRow);
  const height = await page.locator("#records tbody tr time").first().evaluate((t) => t.getBoundingClientRect().height);
  check(height < 30, "a time on one line: " + height + " px");
  await Promise.all([page.waitForNavigation(), page.locator("#records tbody tr a").first().click()]);
  check((await page.textContent("main")).includes("arguments_json"), "a record's page");
  await shot(page, "audit-record");

  // 7. pause and resume, each behind a confirmation page
  step("pause and resume");
  const sandboxUrl = `${base}/sandbox?tenant=alice&key=${encodeURIComponent(cfg.key)}`;
  await page.goto(sandboxUrl);
  check(!(await page.isVisible("#resume")), "a running sandbox is not offered Resume");
  await Promise.all([page.waitForNavigation(), page.click("#pause")]);
  await shot(page, "confirm-pause");
  await Promise.all([page.waitForNavigation(), page.click("#confirm")]);
  check((await page.textContent("main")).includes("PAUSED"), "paused");
  check((await page.textContent("main")).includes("Pause: done."), "the page says it was done");
  check(!(await page.isVisible("#pause")), "a paused sandbox is not offered Pause");
  const noop = await page.evaluate(async ([key, csrf]) => (await fetch("/sandbox/action", {
    method: "POST",
    headers: { "x-csrf-token": csrf, "content-type": "application/x-www-form-urlencoded" },
    body: "action=pause&tenant=alice&key=" + encodeURIComponent(key),
  })).status, [cfg.key, await page.getAttribute("body", "data-csrf")]);
  check(noop === 409, "a second Pause is refused, nothing done: " + noop);
  await shot(page, "sandbox-paused");
  const listed = await cli(cfg.tokens.alice, ["ls"]).done;
  check(listed.out.includes("PAUSED"), "the gRPC API sees it paused: " + listed.out);
  await Promise.all([page.waitForNavigation(), page.click("#resume")]);
  await Promise.all([page.waitForNavigation(), page.click("#confirm")]);
  check((await page.textContent("main")).includes("RUNNING"), "running again");
  await shot(page, "sandbox");
  const procs = await page.locator("main table").nth(1).locator("tbody tr").allTextContents();
  check(procs.length >= 1 && !procs[0].includes("cannot be read"), "its processes: " + procs.join(" | "));
  await Promise.all([page.waitForNavigation(), page.click("text=Isolation report")]);
  const report = await page.textContent("main pre");
  check(report.includes("namespaces") && report.includes(cfg.key), "its isolation report");
  await shot(page, "isolation");

  // 7a. quarantine from the page: the gRPC call is refused; release: it works again
  step("quarantine and release");
  await page.goto(sandboxUrl);
  await Promise.all([page.waitForNavigation(), page.click("#quarantine")]);
  await page.fill("#reason", "odd <traffic> seen by the browser test");
  await shot(page, "confirm-quarantine");
  await Promise.all([page.waitForNavigation(), page.click("#confirm")]);
  check(page.url() === sandboxUrl + "&done=quarantine", "back on the sandbox's page: " + page.url());
  const held = await page.textContent("main");
  check(held.includes("Quarantined") && held.includes("odd <traffic> seen by the browser test"),
    "the page shows the quarantine and its reason");
  check((await page.textContent("#alarms")).includes("operator"), "the alarm, from the operator");
  check((await page.textContent("#evidence")).includes("exec"), "the audit records around it");
  check(await page.isVisible("#release") && !(await page.isVisible("#pause")), "release offered, not pause");
  await shot(page, "sandbox-quarantined");
  const refusedCall = await cli(cfg.tokens.alice, ["exec", cfg.key, "--", "echo", "quarantined"]).done;
  check(refusedCall.code !== 0 && (refusedCall.out + refusedCall.err).includes("FAILED_PRECONDITION"),
    "a call on a quarantined sandbox: " + refusedCall.code + " " + refusedCall.out + refusedCall.err);
  await page.goto(base + "/quarantines");
  const listedQ = page.locator("#quarantines tbody tr", { hasText: cfg.key });
  check((await listedQ.count()) === 1, "listed among the quarantines");
  await shot(page, "quarantines");
  await page.goto(base + "/sandboxes");
  await page.waitForSelector(`#sandboxes tr[data-key="${cfg.key}"] .state.quarantined`, { timeout: WAIT });
  await page.goto(sandboxUrl);
  await Promise.all([page.waitForNavigation(), page.click("#release")]);
  await Promise.all([page.waitForNavigation(), page.click("#confirm")]);
  check(!(await page.textContent("main")).includes("Quarantined"), "released");
  const backCall = await cli(cfg.tokens.alice, ["exec", cfg.key, "--", "echo", "released"]).done;
  check(backCall.code === 0 && backCall.out.includes("released"), "the call works again: " + backCall.err);

  // 8. a forged CSRF token is refused, in the browser, from the page itself
  step("a forged CSRF token is refused");
  const forged = await page.evaluate(async (key) => {
    const answer = await fetch("/sandbox/action", {
      method: "POST",
      headers: { "x-csrf-token": "forged-token", "content-type": "application/x-www-form-urlencoded" },
      body: "action=destroy&tenant=alice&key=" + encodeURIComponent(key),
    });
    return answer.status;
  }, cfg.key);
  check(forged === 403, "a forged CSRF token: " + forged);
  const noToken = await page.evaluate(async (key) => (await fetch("/sandbox/action", {
    method: "POST",
    headers: { "content-type": "application/x-www-form-urlencoded" },
    body: "action=destroy&tenant=alice&key=" + encodeURIComponent(key),
  })).status, cfg.key);
  check(noToken === 403, "no CSRF token: " + noToken);
  await page.goto(base + "/sandboxes");
  await page.waitForSelector(`#sandboxes tr[data-key="${cfg.key}"]`, { timeout: WAIT });

  // 9. another tenant's sandboxes are invisible
  step("another tenant sees nothing of alice's");
  const bob = await browser.newContext();
  const bobPage = await signIn(bob, cfg.tokens.bob);
  const bobList = await bobPage.evaluate(async () => (await (await fetch("/sandboxes.json?tenant=alice")).json()));
  check(bobList.sandboxes.every((s) => s.tenant === "bob"), "bob's list: " + JSON.stringify(bobList));
  check(!(await bobPage.textContent("main")).includes(cfg.key), "alice's key not on bob's page");
  const peek = await bobPage.goto(`${base}/sandbox?tenant=alice&key=${encodeURIComponent(cfg.key)}`);
  check(peek.status() === 404, "bob opening alice's sandbox: " + peek.status());
  await bobPage.goto(`${base}/audit?tenant=alice&key=${encodeURIComponent(cfg.key)}`);
  check(!(await bobPage.textContent("#records")).includes("exec"), "bob sees none of alice's records");
  await shot(bobPage, "other-tenant");

  // 10. the operator sees every tenant, and the overview
  step("the operator");
  const ops = await browser.newContext();
  const opsPage = await signIn(ops, cfg.tokens.ops);
  check(opsPage.url() === base + "/overview", "an operator lands on the overview: " + opsPage.url());
  await opsPage.waitForFunction(() => document.getElementById("calls").textContent !== "-");
  check(Number(await opsPage.textContent("#calls")) >= 3, "calls counted");
  await shot(opsPage, "overview");
  await opsPage.goto(base + "/sandboxes");
  await opsPage.waitForSelector(`#sandboxes tr[data-key="${cfg.key}"]`, { timeout: WAIT });
  await shot(opsPage, "operator-sandboxes");

  // 10a. a tenant that did not exist when the operator's page opened: its first call waits
  // for that page, and is approved from it
  step("a new tenant's first call approved from an open operator page");
  await opsPage.goto(base + "/approvals");
  await opsPage.waitForSelector("body[data-stream=open]", { timeout: WAIT });
  const daveKey = "first-" + cfg.key;
  const dave = cli(cfg.tokens.dave, ["exec", daveKey, "--", "touch", "dave-first-call"]);
  const daveRow = opsPage.locator("#pending tr", { hasText: "dave-first-call" });
  await daveRow.waitFor({ timeout: WAIT });
  check((await daveRow.locator("td").first().textContent()) === "dave", "the row names the tenant");
  await daveRow.locator("button[value=allow-once]").click();
  const daveDone = await dave.done;
  check(daveDone.code === 0, "the new tenant's first call, approved: " + daveDone.code + " " + daveDone.err);
  await daveRow.waitFor({ state: "detached", timeout: WAIT });
  let tenantsShown = new Set();
  for (let tries = 0; tries < 120 && !(tenantsShown.has("alice") && tenantsShown.has("dave")); tries++) {
    await opsPage.goto(base + "/audit"); // (dave's record reaches the log through its writer)
    tenantsShown = new Set(await opsPage.locator("#records tbody tr td:nth-child(2)").allTextContents());
  }
  check((await opsPage.locator("select[name=tenant] option:checked").textContent()) === "all tenants",
    "an operator's audit opens on every tenant");
  check(tenantsShown.has("alice") && tenantsShown.has("dave"), "alice's and dave's records: " + [...tenantsShown]);
  await shot(opsPage, "operator-audit");

  // 10b. a key with a right-to-left override shows the override, in the list and on its page
  step("a bidi key is shown as it is");
  const bidiCall = await cli(cfg.tokens.alice, ["exec", BIDI_KEY, "--", "echo", "bidi"]).done;
  check(bidiCall.code === 0, "a call in the bidi key: " + bidiCall.err);
  await opsPage.goto(base + "/sandboxes?tenant=alice");
  const bidiRow = opsPage.locator(`#sandboxes tr[data-key="${BIDI_KEY}"]`);
  await bidiRow.waitFor({ timeout: WAIT });
  const bidiText = await bidiRow.locator("td").nth(1).innerText();
  check(bidiText.includes("invoice-\\u202egpj.exe") && !bidiText.includes("\u202e"),
    "the override shown, not obeyed: " + JSON.stringify(bidiText));
  await opsPage.goto(`${base}/sandbox?tenant=alice&key=${encodeURIComponent(BIDI_KEY)}`);
  const heading = await opsPage.innerText("h1");
  check(heading.includes("\\u202e") && !heading.includes("\u202e"), "its page's title: " + heading);
  await shot(opsPage, "bidi-key");

  // 12. the overview's counts match what they link to; its trends and their JSON
  step("overview counts link to their lists");
  const overview = await opsPage.evaluate(async () => (await (await fetch("/overview.json?window=1h")).json()));
  const counted = Object.fromEntries(overview.counts.map((c) => [c.id, c]));
  for (const c of overview.counts.filter((c) => c.id.startsWith("state-") && c.id !== "state-quarantined")) {
    check(c.href === "/sandboxes?state=" + c.id.slice(6).toUpperCase(), "a state's list: " + c.href);
    const listed = await opsPage.evaluate(async (href) => (await (await fetch(href.replace("/sandboxes", "/sandboxes.json"))).json()), c.href);
    check(listed.total === c.value, `${c.id}: ${c.value} counted, ${listed.total} listed`);
  }
  let runningByApi = 0; // the gRPC API's view, tenant by tenant (`stockade ls`)
  for (const token of Object.values(cfg.tokens)) {
    const ls = await cli(token, ["ls"]).done;
    check(ls.code === 0, "stockade ls: " + ls.err);
    runningByApi += ls.out.split("\n").slice(1).filter((l) => /^\S+\s+RUNNING\s/.test(l)).length;
  }
  check(runningByApi === counted["state-running"].value,
    `running: ${counted["state-running"].value} counted, ${runningByApi} through the gRPC API`);
  check(counted["state-quarantined"].href === "/quarantines", "quarantined: the quarantine list");
  check(counted["state-quarantined"].value === 0 && counted["state-running"].value >= 2,
    "released: none quarantined, and not counted as paused: " + JSON.stringify(overview.sandboxes));
  check(counted["pending-approvals"].value === 0 && counted["pending-approvals"].href === "/approvals", "none pending");
  const trend = overview.trends["1h"];
  check(trend.calls >= 10 && trend.refused >= 2 && trend.alarms === 1, "the hour's trend: " + JSON.stringify(trend).slice(0, 300));
  check(Object.keys(trend.refusals).some((r) => r.startsWith("guard: ")) && trend.refusals["approval: deny"] >= 1,
    "refusals by reason: " + JSON.stringify(trend.refusals));
  check(trend.p50_ms !== null && trend.p50_ms <= trend.p95_ms, "p50 and p95: " + trend.p50_ms + " " + trend.p95_ms);
  const decisions = async (href) => {
    await opsPage.goto(base + href);
    return opsPage.locator("#records tbody tr td:nth-child(6)").allTextContents();
  };
  const alarmRows = await decisions(counted["window-alarms"].href);
  check(alarmRows.length === 1 && alarmRows[0].startsWith("alarm"), "the alarms' list: " + alarmRows);
  const refusedRows = (await decisions(counted["window-refused"].href)).filter((d) => d.startsWith("refused"));
  check(refusedRows.length === counted["window-refused"].value,
    `refusals: ${counted["window-refused"].value} counted, ${refusedRows.length} listed`);
  await opsPage.goto(base + "/overview");
  await opsPage.click("#state-running");
  await opsPage.waitForURL(base + "/sandboxes?state=RUNNING");
  await opsPage.goto(base + "/overview");
  check(await opsPage.isVisible("#trend-calls svg") && await opsPage.isVisible("#trend-latency svg"), "the trends' charts");
  await shot(opsPage, "overview-counts");
  await opsPage.click("#window-7d");
  await opsPage.waitForURL(base + "/overview?window=7d");
  await shot(opsPage, "overview-7d");

  // 13. a sandbox's files, background processes and CPU/memory, through the agent
  step("a sandbox's files, processes and usage");
  const wrote = await cli(cfg.tokens.alice, ["exec", cfg.key, "--", 'echo "hello <b>console</b>" > note.txt']).done;
  check(wrote.code === 0, "a file written: " + wrote.err);
  const started = await cli(cfg.tokens.alice, ["call", cfg.key, "process",
    JSON.stringify({ action: "start", command: "sleep 300", name: "sleeper" })]).done;
  check(started.code === 0, "a background process: " + started.out + started.err);
  await page.goto(sandboxUrl);
  await page.waitForSelector("#usage-memory svg", { timeout: WAIT }); // the live trend, a sample or two
  await Promise.all([page.waitForNavigation(), page.click("#files-link")]);
  const names = await page.locator("#files tbody tr td:first-child").allTextContents();
  check(names.includes("note.txt") && names.includes("approved-in-browser"), "the workspace's files: " + names);
  await shot(page, "files");
  await Promise.all([page.waitForNavigation(), page.click("#files a:text-is('note.txt')")]);
  const content = await page.textContent("#content");
  check(content.includes("hello <b>console</b>"), "a file's text, as text: " + content);
  await shot(page, "file");
  await page.goto(sandboxUrl);
  await Promise.all([page.waitForNavigation(), page.click("#processes-link")]);
  const agentProcs = await page.textContent("#agent-processes");
  check(agentProcs.includes("sleeper") && agentProcs.includes("sleep 300"), "its background processes: " + agentProcs);
  await shot(page, "processes");
  const readCalls = await cli(cfg.tokens.alice, ["audit", "--key", cfg.key, "--limit", "30"]).done;
  check(/list_files/.test(readCalls.out) && /read_file/.test(readCalls.out), "the reads are audited: " + readCalls.out.slice(0, 500));
  await page.goto(`${base}/sandbox/isolation?tenant=alice&key=${encodeURIComponent(cfg.key)}`);
  check((await page.textContent("#isolation-fields")).includes("no_new_privs"), "the isolation report's table");
  check(!(await page.isVisible("#raw pre")), "the raw JSON folded away");
  await page.click("#raw summary");
  check(await page.isVisible("#raw pre"), "the raw JSON behind its toggle");
  await shot(page, "isolation-table");

  // 14. approvals: what the guard matched is marked in the command
  step("what the guard matched is marked");
  await page.goto(base + "/approvals");
  await page.waitForSelector("body[data-stream=open]", { timeout: WAIT });
  const dynamic = cli(cfg.tokens.alice, ["exec", cfg.key, "--", "$TOOLNAME --version"]);
  const dynamicRow = page.locator("#pending tr", { hasText: "TOOLNAME" });
  await dynamicRow.waitFor({ timeout: WAIT });
  const marks = await dynamicRow.locator("mark.hit").allTextContents();
  check(marks.length >= 1 && marks.every((m) => m === "$TOOLNAME"), "the matched part marked: " + marks);
  await shot(page, "approvals-marked");
  await dynamicRow.locator("button[value=deny]").click();
  check((await dynamic.done).code !== 0, "denied");

  // 11. every page in both themes at 1440 and 900 px, and axe-core finds no serious or
  // critical violation (a context that lets axe's script in; the pages are the same)
  step("accessibility and screenshots in both themes");
  const pages = {
    overview: "/overview",
    sandboxes: "/sandboxes",
    sandbox: `/sandbox?tenant=alice&key=${encodeURIComponent(cfg.key)}`,
    approvals: "/approvals",
    audit: "/audit?tenant=alice",
    quarantines: "/quarantines",
    files: `/sandbox/files?tenant=alice&key=${encodeURIComponent(cfg.key)}`,
    processes: `/sandbox/processes?tenant=alice&key=${encodeURIComponent(cfg.key)}`,
    isolation: `/sandbox/isolation?tenant=alice&key=${encodeURIComponent(cfg.key)}`,
  };
  const violations = [];
  for (const theme of ["light", "dark"]) {
    const checked = await browser.newContext({ bypassCSP: true, colorScheme: theme });
    const anonymous = await checked.newPage();
    await anonymous.goto(base + "/login");
    const signed = await signIn(checked, cfg.tokens.ops);
    for (const [name, path] of [["login", null], ...Object.entries(pages)]) {
      const p = path === null ? anonymous : signed;
      if (path !== null) await p.goto(base + path);
      for (const width of [1440, 900]) {
        await p.setViewportSize({ width, height: 900 });
        await shot(p, `${name}-${theme}-${width}`);
      }
      await p.addScriptTag({ path: AXE });
      const found = await p.evaluate(async () => (await window.axe.run(document)).violations
        .filter((v) => v.impact === "serious" || v.impact === "critical")
        .map((v) => v.id + " (" + v.impact + "): " + v.nodes.slice(0, 3).map((n) => n.target.join(" ")).join(", ")));
      for (const v of found) violations.push(`${name} ${theme}: ${v}`);
    }
    await checked.close();
  }
  check(violations.length === 0, "axe-core: " + violations.join("\n"));

  check(cspErrors.length === 0, "no Content-Security-Policy violation: " + cspErrors.join("; "));
  step("done");
} finally {
  await browser.close();
}
