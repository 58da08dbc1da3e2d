// The web console in a real browser: headless Chromium (Debian's package)
// driven by puppeteer-core, against a real `sandhold serve`. Signs in with
// a token, watches a run started by the test stream in on /runs/<id> (its
// command and prompt, timed events, a timeline, Markdown that stays text),
// cancels it behind a confirmation; lists, searches and pages runs; shows
// sandboxes with their state and resource use; answers a network request
// with Allow and sees the connection through; says how to start when
// there is nothing. Each page is audited with axe-core and checked at
// 1280×900 and 390×844 (no horizontal overflow, the page the one scroll
// container); the screenshots go to test/artifacts/ (not committed).

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import puppeteer from "puppeteer-core";

import { RunStatus } from "../dist/index.js";
import { putLocalDefinition, repo, startProxy, startServer } from "./support.mjs";

const artifacts = join(dirname(fileURLToPath(import.meta.url)), "artifacts");
const chromium = process.env.CHROMIUM ?? ["/usr/bin/chromium", "/usr/bin/chromium-browser"].find((p) => existsSync(p));
// Under scripts/test (SANDHOLD_REQUIRE_SERVICES=1) a missing browser fails the test.
const required = process.env.SANDHOLD_REQUIRE_SERVICES === "1";
const skip = !chromium && !required ? "no Chromium (apt-get install chromium, or set CHROMIUM)" : false;

/**
 * What the run prints: a conversation (reasoning, a tool call) in chunk
 * JSON, then numbered lines. (File events and diffs are the server's own,
 * which command output cannot pose as, issue 33: the second test makes
 * real ones.)
 */
function demoScript(lines) {
  const chunk = (c) => JSON.stringify(c);
  const script = [
    chunk({ type: "REASONING_START", message_id: "think" }),
    chunk({ type: "REASONING_CONTENT", message_id: "think", delta: "The greeting should use an f-string; look at the file first." }),
    chunk({ type: "REASONING_END", message_id: "think" }),
    chunk({ type: "TOOL_CALL_START", tool_call_id: "call-1", tool_name: "Bash" }),
    chunk({ type: "TOOL_CALL_ARGS", tool_call_id: "call-1", delta: JSON.stringify({ command: "cat greet.py" }) }),
    chunk({ type: "TOOL_CALL_END", tool_call_id: "call-1" }),
    chunk({ type: "TOOL_CALL_RESULT", tool_call_id: "call-1", content: "def greet(name):\n    print('hi ' + name)\n", exit_code: 0 }),
    chunk({ type: "TEXT_MESSAGE_START", message_id: "plan" }),
    chunk({ type: "TEXT_MESSAGE_CONTENT", message_id: "plan", delta: HOSTILE_MARKDOWN }),
    chunk({ type: "TEXT_MESSAGE_END", message_id: "plan" }),
  ].join("\n");
  return ["sh", "-c", `cat <<'EOF'\n${script}\nEOF\ni=1; while [ $i -le ${lines} ]; do echo "working on step $i"; i=$((i+1)); sleep 0.2; done`];
}

/**
 * An agent's message in Markdown, with what a hostile tenant could write:
 * an element with a handler, a script, and links to javascript: and
 * data: addresses. None of it may become an element or an address.
 */
const HOSTILE_MARKDOWN = [
  "## Plan",
  "",
  "I will **fix** `greet.py`:",
  "",
  "- read it",
  "- change it",
  "",
  "See [the docs](https://example.com/docs), [x](javascript:alert(1)) and [y](data:text/html,hi).",
  "",
  '<img src=x onerror="window.__pwned = 1"> <script>window.__pwned = 2</script>',
].join("\n");

const axePath = createRequire(import.meta.url).resolve("axe-core/axe.min.js");

/**
 * The accessibility problems axe-core finds on the page as it is (WCAG 2 A
 * and AA rules: contrast, names of controls, landmarks, ...), as
 * `rule: target` strings. The page's CSP forbids injected scripts, so
 * pages that are audited bypass it.
 */
async function accessibilityProblems(page) {
  if (!(await page.evaluate(() => "axe" in globalThis))) await page.addScriptTag({ path: axePath });
  return page.evaluate(async () => {
    const result = await globalThis.axe.run(document, { runOnly: { type: "tag", values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"] } });
    if (result.passes.length === 0) return ["axe checked nothing"];
    return result.violations.flatMap((v) => v.nodes.map((n) => `${v.id}: ${n.target.join(" ")}`));
  });
}

const settle = (page) => page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));

/**
 * The page as it is, at a desktop's 1280×900 and a phone's 390×844: no
 * wider than the screen, no element of its own that scrolls (the page is
 * the one scroll container), no accessibility problem; a screenshot of
 * each in test/artifacts/<name>-<width>x<height>.png.
 */
async function checkLayouts(page, name) {
  mkdirSync(artifacts, { recursive: true });
  for (const [width, height] of [[1280, 900], [390, 844]]) {
    await page.setViewport({ width, height });
    await settle(page);
    const layout = await page.evaluate(() => ({
      wider: document.scrollingElement.scrollWidth - innerWidth,
      scrollers: [...document.querySelectorAll("body *")]
        .filter((el) => {
          const style = getComputedStyle(el);
          const scrolls = /auto|scroll/.test(style.overflowY) || /auto|scroll/.test(style.overflowX);
          return scrolls && (el.scrollHeight > el.clientHeight + 1 || el.scrollWidth > el.clientWidth + 1);
        })
        .map((el) => `${el.tagName.toLowerCase()}#${el.id}.${el.className}`),
    }));
    assert.ok(layout.wider <= 0, `${name} at ${width}px is ${layout.wider}px wider than the screen`);
    assert.deepEqual(layout.scrollers, [], `${name} at ${width}px: only the page scrolls`);
    assert.deepEqual(await accessibilityProblems(page), [], `${name} at ${width}×${height}`);
    await page.screenshot({ path: join(artifacts, `${name}-${width}x${height}.png`) });
  }
  await page.setViewport({ width: 1280, height: 900 });
}

/** A page of headless Chromium, closed after the test; script errors collected. */
async function openPage(t) {
  const browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  t.after(() => browser.close());
  const page = await browser.newPage();
  await page.setBypassCSP(true); // for the accessibility audit's script
  await page.setViewport({ width: 1200, height: 1500 });
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  return { page, pageErrors };
}

test("the console signs in, follows a run live and cancels it", { skip, timeout: 120_000 }, async (t) => {
  assert.ok(chromium, "Chromium is required here (SANDHOLD_REQUIRE_SERVICES=1): apt-get install chromium");
  const server = await startServer(t);
  const client = server.client();
  await putLocalDefinition(client, "console-demo");
  // The browser goes through a proxy whose connections the test cuts.
  const proxy = await startProxy(t, server.port);

  const { page, pageErrors } = await openPage(t);

  // Sign in: a wrong token is refused, the right one lets us in.
  await page.goto(proxy.url + "/", { waitUntil: "load" });
  await page.waitForSelector("#sign-in #token");
  const loadMs = await page.evaluate(() => performance.getEntriesByType("navigation")[0].loadEventEnd);
  assert.ok(loadMs > 0 && loadMs < 1000, `the first page loads in well under a second (${loadMs} ms)`);
  assert.deepEqual(await accessibilityProblems(page), [], "the sign-in page");
  await page.type("#token", "wrong-token-123");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => document.querySelector("#sign-in [role=alert]")?.textContent.includes("refused"));
  await page.$eval("#token", (el) => (el.value = ""));
  await page.type("#token", server.token);
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => document.querySelector("#who")?.textContent.includes("Tenant ts"));
  assert.equal(await page.evaluate(() => sessionStorage.getItem("sandhold.token")), server.token);

  // A run started by the test (durable: it goes on after the test's stream is closed).
  const stream = client.startRun({
    threadId: "console-thread",
    definitionId: "console-demo",
    harness: "command",
    durable: true,
    prompt: "Say **hello**, then list the files.",
    options: { command: demoScript(600) },
  });
  for await (const item of stream) if (item.kind === "chunk") break;
  const runId = stream.runId;

  // The runs page lists it (linked), live.
  await page.waitForSelector(`tr[data-run="${runId}"] a[href="/runs/${runId}"]`);
  assert.deepEqual(await accessibilityProblems(page), [], "the runs page");
  await page.click(`tr[data-run="${runId}"] a[href="/runs/${runId}"]`);
  await page.waitForFunction((id) => location.pathname === `/runs/${id}`, {}, runId);

  // Its text streams in: later steps appear while we watch.
  await page.waitForFunction(() => document.querySelector("#conversation")?.textContent.includes("working on step 3"));
  await page.waitForFunction(() => document.querySelector("#conversation")?.textContent.includes("working on step 8"), { timeout: 20_000 });
  const rendered = await page.evaluate(() => ({
    status: document.querySelector("#run-status [data-status]")?.dataset.status,
    reasoningFolded: document.querySelector(".reasoning") && !document.querySelector(".reasoning").open,
    tool: document.querySelector(".tool summary")?.textContent,
    args: document.querySelector(".tool .args")?.textContent,
  }));
  assert.equal(rendered.status, "running");
  assert.equal(rendered.reasoningFolded, true, "reasoning is folded");

  // What it was asked: the command, and the prompt as Markdown.
  await page.waitForSelector("#asked pre.command");
  assert.match(await page.$eval("#asked pre.command", (el) => el.textContent), /^sh -c 'cat <<'\\''EOF'\\''/);
  assert.equal(await page.$eval("#asked .prompt strong", (el) => el.textContent), "hello");

  // The agent's Markdown rendered, and nothing it wrote became markup or an address.
  await page.waitForSelector(".message .md h4");
  const md = await page.evaluate(() => {
    const message = document.querySelector(".message .md");
    return {
      heading: message.querySelector("h4")?.textContent,
      strong: message.querySelector("strong")?.textContent,
      code: message.querySelector("code")?.textContent,
      items: [...message.querySelectorAll("ul > li")].map((li) => li.textContent),
      links: [...document.querySelectorAll("a[href]")].map((a) => a.getAttribute("href")).filter((h) => !h.startsWith("/") && !h.startsWith("#")),
      text: message.textContent,
      elements: document.querySelectorAll("#conversation img, #conversation script, #conversation [onerror]").length,
      pwned: window.__pwned,
    };
  });
  assert.equal(md.heading, "Plan");
  assert.equal(md.strong, "fix");
  assert.equal(md.code, "greet.py");
  assert.deepEqual(md.items, ["read it", "change it"]);
  assert.deepEqual(md.links, ["https://example.com/docs"], "only the http(s) link is a link");
  assert.match(md.text, /\[x\]|x and y|, x and y/, "the other links keep their text");
  assert.match(md.text, /<img src=x onerror="window.__pwned = 1">/, "markup stays text");
  assert.equal(md.elements, 0, "no element from the message's text");
  assert.equal(md.pwned, undefined, "nothing ran");

  // Every event says when; the timeline lists the main ones, after the start.
  const times = await page.evaluate(() => ({
    events: document.querySelectorAll("#conversation > [id^=event-]").length,
    timed: [...document.querySelectorAll("#conversation > [id^=event-]")].filter((el) => el.querySelector(".ts > time[datetime]")).length,
  }));
  assert.ok(times.events > 5 && times.timed === times.events, `every event has its time: ${JSON.stringify(times)}`);
  await page.click("#timeline summary");
  const marks = await page.$$eval("#timeline li", (lis) => lis.map((li) => li.textContent));
  assert.ok(marks.some((m) => /^\+\d+\.\ds Tool call Bash$/.test(m)), `the tool call in the timeline: ${marks}`);
  assert.ok(marks.some((m) => / Message$/.test(m)), `the message in the timeline: ${marks}`);
  await page.click('#timeline a[href^="#event-"]');
  assert.match(rendered.tool, /Bash/);
  assert.match(rendered.args, /"command": "cat greet.py"/, "arguments pretty-printed once complete");
  // The connection drops: the page attaches again after the last chunk it
  // got, and the text goes on with every step exactly once, in order.
  await page.evaluate(() => {
    window.reconnects = 0;
    const status = document.querySelector("#connection");
    new MutationObserver(() => {
      if (status.textContent.includes("reconnecting")) window.reconnects += 1;
    }).observe(status, { childList: true, characterData: true, subtree: true });
  });
  proxy.cut();
  const before = await page.$eval("#conversation", (el) => el.textContent.match(/working on step \d+/g).length);
  await page.waitForFunction(
    (n) => document.querySelector("#conversation")?.textContent.includes(`working on step ${n}\n`),
    { timeout: 20_000 },
    before + 5,
  );
  const steps = await page.$eval("#conversation", (el) => el.textContent.match(/working on step \d+/g));
  assert.deepEqual(steps, steps.map((_, i) => `working on step ${i + 1}`));
  assert.ok(await page.evaluate(() => window.reconnects) >= 1, "the page said it was reconnecting");

  await checkLayouts(page, "run-running");
  // Keyboard: Cancel asks first; the safe choice has the focus, Escape
  // keeps the run and gives the focus back.
  await page.focus("#cancel");
  await page.keyboard.press("Enter");
  await page.waitForSelector("#cancel-dialog[open]");
  assert.equal(await page.evaluate(() => document.activeElement?.textContent), "Keep running");
  assert.deepEqual(await accessibilityProblems(page), [], "the cancel dialog");
  await page.screenshot({ path: join(artifacts, "run-cancel-dialog.png") });
  await page.keyboard.press("Escape");
  await page.waitForFunction(() => !document.querySelector("#cancel-dialog"));
  assert.equal(await page.evaluate(() => document.activeElement?.id), "cancel", "the focus is back on Cancel");
  assert.equal((await client.getRun(runId)).cancelRequested, false, "dismissed: nothing cancelled");
  // Confirmed: cancelled, and Cancel is gone from the finished run.
  await page.keyboard.press("Enter");
  await page.waitForSelector("#cancel-dialog[open]");
  await page.click('#cancel-dialog button[value="confirm"]');
  await page.waitForSelector('#run-status [data-status="aborted"]', { timeout: 30_000 });
  await page.waitForFunction(() => document.querySelector(".end.errored h2")?.textContent === "Ended: Cancelled");
  await page.waitForFunction(() => document.querySelector("#failure .failure-title")?.textContent === "Cancelled");
  assert.match(await page.$eval(".end.errored", (el) => el.textContent), /Code CANCELLED/, "the code, beside the words");
  assert.equal(await page.$("#cancel"), null, "no Cancel on an ended run");
  const run = await client.getRun(runId);
  assert.equal(run.status, RunStatus.ABORTED);
  await checkLayouts(page, "run-cancelled");

  // The runs list: what each run was asked, searched by the server.
  await page.goto(proxy.url + "/", { waitUntil: "load" });
  await page.waitForSelector(`tr[data-run="${runId}"] td[data-label="Asked"] code`);
  assert.match(await page.$eval(`tr[data-run="${runId}"] td[data-label="Asked"] code`, (el) => el.title), /^sh -c /);
  await page.type("#filter-query", "no run says this");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => document.querySelector(".empty h2")?.textContent === "No runs match");
  await page.$eval("#filter-query", (el) => (el.value = ""));
  await page.type("#filter-query", "LIST THE FILES");
  await page.keyboard.press("Enter");
  await page.waitForFunction((id) => document.querySelectorAll("tr[data-run]").length === 1 && document.querySelector(`tr[data-run="${id}"]`), {}, runId);
  assert.equal(new URL(page.url()).search, "?q=LIST+THE+FILES", "the search is in the address");
  await checkLayouts(page, "runs");
  assert.deepEqual(pageErrors, [], "no script errors in the page");
});

test("the console browses a sandbox's files, destroys it, reads and forks a snapshot", { skip, timeout: 120_000 }, async (t) => {
  assert.ok(chromium, "Chromium is required here (SANDHOLD_REQUIRE_SERVICES=1): apt-get install chromium");
  // Single-user on loopback: the local token, no API tokens.
  const server = await startServer(t, { tokens: false });
  const client = server.client();
  await client.sandboxes.putDefinition({
    definition: {
      id: "console-files",
      provider: { provider: { case: "local", value: {} } },
      lifecycle: { portableSnapshots: { enabled: true } },
    },
  });
  const run = client.startRun({
    threadId: "files-thread",
    definitionId: "console-files",
    harness: "command",
    durable: true,
    options: {
      // A committed file changed (the run's file events, then its diff
      // after the run), and a new one.
      command: [
        "sh",
        "-c",
        [
          `printf "def greet(name):\\n    print('hi ' + name)\\n" > greet.py`,
          "git init -q && git add greet.py && git -c user.name=demo -c user.email=demo@example.com commit -qm greet",
          // File events are reported once the run's output has begun.
          "echo committed",
          "sleep 1",
          `printf "def greet(name):\\n    message = f'hello, {name}'\\n    print(message)\\n" > greet.py`,
          // File events are best effort and coalesced: give the watch time
          // to deliver this one before the run ends.
          "sleep 1",
          "mkdir -p notes && echo hello-from-sandbox > notes/hello.txt && echo wrote notes/hello.txt",
        ].join(" && "),
      ],
    },
  });
  for await (const _ of run) {
    // to its end
  }
  const [sandbox] = (await client.sandboxes.listSandboxes({ threadId: "files-thread" })).sandboxes;
  assert.ok(sandbox, "the thread keeps its sandbox");

  // One more run, then one that fails: three to page through.
  for await (const _ of client.startRun({ threadId: "files-thread", harness: "command", durable: true, options: { command: ["true"] } })) {
    // to its end
  }
  const failing = client.startRun({
    threadId: "files-thread",
    harness: "command",
    durable: true,
    options: { command: ["sh", "-c", "echo about to fail; exit 3"] },
  });
  for await (const _ of failing) {
    // to its end
  }

  const { page, pageErrors } = await openPage(t);
  // A single-user server takes its local token too (issue 33): the
  // session holds it as a sign-in would.
  await page.goto(server.url + "/", { waitUntil: "load" });
  await page.evaluate((token) => sessionStorage.setItem("sandhold.token", token), server.token);
  await page.goto(server.url + "/sandboxes", { waitUntil: "load" });
  await page.waitForFunction(() => document.querySelector("#who")?.textContent.includes("Tenant default"));
  assert.equal(await page.$("#sign-in"), null, "signed in with the local token");

  // A finished run. (Its usage once came from a RUN_FINISHED line the
  // command printed; command output can no longer end a run or claim
  // usage, issue 33.)
  await page.goto(`${server.url}/runs/${run.runId}`, { waitUntil: "load" });
  await page.waitForSelector('#run-status [data-status="completed"]');
  assert.deepEqual(await accessibilityProblems(page), [], "the run page, finished");
  await page.emulateMediaFeatures([{ name: "prefers-color-scheme", value: "dark" }]);
  assert.deepEqual(await accessibilityProblems(page), [], "the run page, finished, dark");
  await page.emulateMediaFeatures([{ name: "prefers-color-scheme", value: "light" }]);
  assert.match(await page.$eval("#conversation", (el) => el.textContent), /wrote notes\/hello.txt/);
  // The server's file events and the diff after the run.
  const files = await page.evaluate(() => ({
    events: [...document.querySelectorAll(".file-event")].map((e) => e.textContent),
    added: [...document.querySelectorAll("section.diff")]
      .filter((d) => d.querySelector("h3")?.textContent === "Changed greet.py")
      .flatMap((d) => [...d.querySelectorAll(".diff-body .add")].map((e) => e.textContent)),
  }));
  assert.ok(files.events.some((e) => / greet\.py$/.test(e)), `a file event of greet.py: ${files.events}`);
  assert.deepEqual(files.added, ["+    message = f'hello, {name}'", "+    print(message)"]);

  // A failed run reads as words, its code beside them.
  await page.goto(`${server.url}/runs/${failing.runId}`, { waitUntil: "load" });
  await page.waitForSelector('#run-status [data-status="failed"]');
  await page.waitForFunction(() => document.querySelector(".end.errored h2")?.textContent === "Ended: The command failed");
  const failure = await page.$eval("#failure", (el) => ({ title: el.querySelector(".failure-title")?.textContent, text: el.textContent }));
  assert.equal(failure.title, "The command failed");
  assert.match(failure.text, /Code exit_code/);
  assert.equal(await page.$("#cancel"), null, "no Cancel on a failed run");
  await checkLayouts(page, "run-failed");

  // Runs a page at a time (two here, `?limit=2`), newest first.
  await page.goto(`${server.url}/?limit=2`, { waitUntil: "load" });
  await page.waitForFunction(() => document.querySelectorAll("tr[data-run]").length === 2 && !document.querySelector("#page-older").disabled);
  const firstPage = await page.$$eval("tr[data-run]", (rows) => rows.map((r) => r.dataset.run));
  assert.equal(firstPage[0], failing.runId, "newest first");
  assert.equal(await page.$eval("#page-newer", (b) => b.disabled), true);
  await page.click("#page-older");
  await page.waitForFunction((first) => !document.querySelector(`tr[data-run="${first}"]`), {}, firstPage[0]);
  const secondPage = await page.$$eval("tr[data-run]", (rows) => rows.map((r) => r.dataset.run));
  assert.ok(secondPage.includes(run.runId) && !secondPage.some((id) => firstPage.includes(id)), `${firstPage} then ${secondPage}`);
  await page.click("#page-newer");
  await page.waitForFunction((first) => !!document.querySelector(`tr[data-run="${first}"]`), {}, firstPage[0]);

  // Sandboxes: state, keep-alive, CPU and memory (a rate once read twice).
  await page.goto(server.url + "/sandboxes", { waitUntil: "load" });
  const row = `tr[data-sandbox="${sandbox.sandboxId}"]`;
  await page.waitForSelector(`${row} [data-state="running"]`);
  const shown = await page.$eval(row, (tr) => ({
    keepAlive: tr.querySelector('[data-label="Keep-alive"]').textContent,
    memory: tr.querySelector(".memory").textContent,
  }));
  assert.equal(shown.keepAlive, "never stopped", "the definition sets no keep-alive");
  assert.match(shown.memory, /^\d+(\.\d)? (KiB|MiB)$/, "the local provider measures memory, with no limit");
  await page.waitForFunction((r) => /^\d+% now · \d+\.\d s in all$/.test(document.querySelector(`${r} .cpu`)?.textContent), { timeout: 20_000 }, row);
  await checkLayouts(page, "sandboxes");

  // The file browser: a directory, then a file in it.
  await page.waitForSelector(`a[href="/sandboxes/${sandbox.sandboxId}"]`);
  await page.click(`a[href="/sandboxes/${sandbox.sandboxId}"]`);
  await page.waitForSelector('a[href$="path=notes"]');
  await page.click('a[href$="path=notes"]');
  await page.waitForSelector('a[href$="path=notes%2Fhello.txt"]');
  await page.click('a[href$="path=notes%2Fhello.txt"]');
  await page.waitForSelector("pre.file");
  assert.equal(await page.$eval("pre.file", (el) => el.textContent), "hello-from-sandbox\n");
  assert.deepEqual(await accessibilityProblems(page), [], "a file of a sandbox");

  // Snapshots of the thread: the checkpoint saved after the run; read an artifact; fork.
  await page.goto(server.url + "/threads/files-thread/snapshots", { waitUntil: "load" });
  await page.waitForSelector('input[name="path"]');
  await page.type('input[name="path"]', "notes/hello.txt");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => [...document.querySelectorAll("pre.file")].some((p) => p.textContent === "hello-from-sandbox\n"));
  await page.type('input[placeholder="new thread id"]', "forked-thread");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => document.querySelector("main")?.textContent.includes("Forked into forked-thread"));
  assert.deepEqual(await accessibilityProblems(page), [], "the snapshots page");
  const forked = await client.snapshots.listSnapshots({ threadId: "forked-thread" });
  assert.equal(forked.checkpoints.length, 1);

  // Destroy the sandbox from the list, once confirmed.
  await page.goto(server.url + "/sandboxes", { waitUntil: "load" });
  await page.waitForSelector(`button[aria-label^="Destroy sandbox"]`);
  await page.click(`button[aria-label^="Destroy sandbox"]`);
  await page.waitForSelector("#destroy-dialog[open]");
  await page.click('#destroy-dialog button[value="confirm"]');
  await page.waitForSelector("#empty-sandboxes");
  assert.equal((await client.sandboxes.listSandboxes({ threadId: "" })).sandboxes.length, 0);
  assert.deepEqual(pageErrors, []);
});

test("the console says how to start when there is nothing yet", { skip, timeout: 120_000 }, async (t) => {
  assert.ok(chromium, "Chromium is required here (SANDHOLD_REQUIRE_SERVICES=1): apt-get install chromium");
  const server = await startServer(t, { tokens: false });
  const { page, pageErrors } = await openPage(t);
  await page.goto(server.url + "/", { waitUntil: "load" });
  await page.evaluate((token) => sessionStorage.setItem("sandhold.token", token), server.token);
  await page.goto(server.url + "/", { waitUntil: "load" });
  await page.waitForSelector("#empty-runs");
  assert.match(await page.$eval("#empty-runs", (el) => el.textContent), /sandhold run -- echo hello/);
  assert.equal(await page.$eval("table.runs", (t) => t.hidden), true, "no empty table");
  await checkLayouts(page, "runs-empty");
  await page.goto(server.url + "/sandboxes", { waitUntil: "load" });
  await page.waitForSelector("#empty-sandboxes");
  assert.match(await page.$eval("#empty-sandboxes", (el) => el.textContent), /sandhold run --thread demo -- echo hello/);
  await checkLayouts(page, "sandboxes-empty");
  assert.deepEqual(pageErrors, []);
});

test("the console shows the token usage a harness reported", { skip, timeout: 180_000 }, async (t) => {
  assert.ok(chromium, "Chromium is required here (SANDHOLD_REQUIRE_SERVICES=1): apt-get install chromium");
  const claude = join(process.env.SANDHOLD_CLI_DIR ?? "/opt/sandhold-clis", "node_modules", ".bin", "claude");
  if (!existsSync(claude)) {
    assert.ok(!required, `Claude Code is required here (SANDHOLD_REQUIRE_SERVICES=1): scripts/install-agent-clis (${claude})`);
    t.skip("Claude Code is not installed (scripts/install-agent-clis)");
    return;
  }
  // The fake model answers every turn with 12 tokens in and 7 out.
  const model = spawn("python3", [join(repo, "tests/fake-model/fake_model.py"), "--scenario", "plain", "--port", "0"], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  t.after(() => model.kill("SIGKILL"));
  const port = await new Promise((resolve, reject) => {
    let out = "";
    model.stdout.on("data", (d) => {
      out += d;
      const m = /PORT=(\d+)/.exec(out);
      if (m) resolve(Number(m[1]));
    });
    model.on("exit", (code) => reject(new Error(`the fake model exited (${code})`)));
  });
  const server = await startServer(t, { tokens: false });
  const client = server.client();
  const home = mkdtempSync(join(tmpdir(), "sandhold-ts-home-"));
  t.after(() => rmSync(home, { recursive: true, force: true }));
  await putLocalDefinition(client, "console-usage");
  const run = client.startRun({
    threadId: "usage-thread",
    definitionId: "console-usage",
    harness: "claude-code",
    durable: true,
    prompt: "say hello",
    options: {
      program: claude,
      env: { HOME: home, ANTHROPIC_BASE_URL: `http://127.0.0.1:${port}`, ANTHROPIC_API_KEY: "x", IS_SANDBOX: "1" },
    },
  });
  let runId = "";
  for await (const item of run) {
    runId ||= item.kind === "chunk" ? item.chunk.runId : "";
  }
  const { page, pageErrors } = await openPage(t);
  await page.goto(server.url + "/", { waitUntil: "load" });
  await page.evaluate((token) => sessionStorage.setItem("sandhold.token", token), server.token);
  await page.goto(`${server.url}/runs/${runId}`, { waitUntil: "load" });
  await page.waitForSelector('#run-status [data-status="completed"]');
  const tokens = await page.waitForFunction(() => {
    const dt = [...document.querySelectorAll("dl.facts dt")].find((d) => d.textContent === "Tokens");
    return dt?.nextElementSibling?.textContent;
  });
  assert.match(await tokens.jsonValue(), /^\d+ in · \d+ out/);
  const [input, output] = (await tokens.jsonValue()).match(/\d+/g).map(Number);
  assert.ok(input >= 12 && output >= 7 && output % 7 === 0, `the model's usage, summed over its turns: ${input} in, ${output} out`);
  assert.deepEqual(pageErrors, []);
});

test("the console shows a set of attempts side by side and promotes one", { skip, timeout: 180_000 }, async (t) => {
  assert.ok(chromium, "Chromium is required here (SANDHOLD_REQUIRE_SERVICES=1): apt-get install chromium");
  const server = await startServer(t, { tokens: false });
  const client = server.client();
  await client.sandboxes.putDefinition({
    definition: {
      id: "console-attempts",
      provider: { provider: { case: "local", value: {} } },
      workspace: { scripts: { test: "test -f pass.txt" } },
      lifecycle: { portableSnapshots: { enabled: true } },
    },
  });
  const script = 'if [ "$SANDHOLD_ATTEMPT" = 1 ]; then echo pass > pass.txt; else echo "no $SANDHOLD_ATTEMPT" > notes.txt; fi';
  const set = await client.startAttempts(
    { threadId: "console-task", definitionId: "console-attempts", harness: "command", options: { command: ["sh", "-c", script] } },
    { count: 2 },
  );
  const { page, pageErrors } = await openPage(t);
  await page.goto(server.url + "/", { waitUntil: "load" });
  await page.evaluate((token) => sessionStorage.setItem("sandhold.token", token), server.token);
  await page.goto(`${server.url}/attempts/${set.attemptSetId}`, { waitUntil: "load" });
  // Both evaluated: the test outcomes side by side, each diff below.
  await page.waitForFunction(() => document.querySelectorAll("details.diff").length === 2, { timeout: 120_000 });
  const tests = await page.$$eval("table.attempts tbody tr .test", (cells) => cells.map((c) => c.textContent));
  assert.deepEqual(tests, ["failed (1)", "passed"]);
  const diffs = await page.$$eval("details.diff pre.patch", (pres) => pres.map((p) => p.textContent).join("\n"));
  assert.match(diffs, /\+pass/);
  assert.match(diffs, /\+no 0/);
  await checkLayouts(page, "attempts");
  // Promote the passing one, behind the confirmation.
  const winner = set.attempts[1].runId;
  await page.click(`button.promote[data-run="${winner}"]`);
  await page.waitForSelector("#promote-dialog[open]");
  assert.deepEqual(await accessibilityProblems(page), [], "the promote dialog");
  await page.click('#promote-dialog button[value="confirm"]');
  await page.waitForFunction(() => document.querySelector('tr[data-attempt="1"] .tag')?.textContent === "promoted", { timeout: 30_000 });
  assert.equal((await client.getAttemptSet(set.attemptSetId)).promotedRunId, winner);
  assert.equal(await page.$$eval("button.promote", (bs) => bs.every((b) => b.disabled)), true, "a set promotes one attempt");
  assert.deepEqual(pageErrors, []);
});

test("the console answers a network request: Allow lets the waiting connection through", { skip, timeout: 120_000 }, async (t) => {
  assert.ok(chromium, "Chromium is required here (SANDHOLD_REQUIRE_SERVICES=1): apt-get install chromium");
  const { createServer } = await import("node:http");
  const web = createServer((_req, res) => res.end("reached\n"));
  await new Promise((resolve) => web.listen(0, "127.0.0.1", resolve));
  t.after(() => web.close());
  const target = `127.0.0.1:${web.address().port}`;
  const server = await startServer(t, { extraArgs: ["--egress-private-addresses"] });
  const client = server.client();
  await client.sandboxes.putDefinition({
    definition: {
      id: "console-ask",
      provider: { provider: { case: "local", value: {} } },
      workspace: { source: { source: { case: "none", value: {} } } },
      // The proxy allows only a port nothing listens on, and asks for the test's server.
      network: { allowHosts: ["127.0.0.2:9"], ask: [{ host: target }] },
    },
  });
  // One request through the sandbox's proxy (never around it: NO_PROXY names 127.0.0.1).
  const script = [
    "import os, socket",
    'p = int(os.environ["HTTP_PROXY"].rstrip("/").rsplit(":", 1)[1])',
    `t = "${target}"`,
    's = socket.create_connection(("127.0.0.1", p))',
    's.sendall(("GET http://%s/ HTTP/1.1\\r\\nHost: %s\\r\\nConnection: close\\r\\n\\r\\n" % (t, t)).encode())',
    'a = b""',
    "while True:",
    "    d = s.recv(65536)",
    "    if not d: break",
    "    a += d",
    "l = a.decode().strip().splitlines()",
    'print("TRY", l[0].split(" ")[1], l[-1], flush=True)',
  ].join("\n");
  const stream = client.startRun({
    threadId: "ask-thread",
    definitionId: "console-ask",
    harness: "command",
    durable: true,
    options: { command: ["python3", "-c", script] },
  });
  for await (const item of stream) if (item.kind === "chunk") break;
  const runId = stream.runId;

  const { page, pageErrors } = await openPage(t);
  await page.goto(server.url + "/", { waitUntil: "load" });
  await page.evaluate((token) => sessionStorage.setItem("sandhold.token", token), server.token);
  await page.goto(`${server.url}/runs/${runId}`, { waitUntil: "load" });
  await page.waitForSelector("section.request button.allow");
  const shown = await page.$eval("section.request h3", (el) => el.textContent);
  assert.equal(shown, `Network request GET ${target}/`);
  await checkLayouts(page, "run-network-request");
  await page.click("section.request button.allow");
  await page.waitForSelector("section.request.allowed");
  assert.equal(await page.$eval("section.request .request-outcome", (el) => el.textContent), "Allowed (once) by client");
  await page.waitForFunction(() => document.querySelector("#conversation")?.textContent.includes("TRY 200 reached"), { timeout: 30_000 });
  await page.waitForSelector('#run-status [data-status="completed"]');
  const answered = await client.runs.listRequests({ runId, includeAnswered: true });
  assert.deepEqual(
    answered.requests.map((r) => [r.kind, r.answer?.allowed, r.answer?.scope]),
    [["network", true, "once"]],
  );
  assert.deepEqual(pageErrors, []);
});
