// The web console in a real browser: headless Chromium (Debian's package)
// driven by puppeteer-core, against a real `sandhold serve`. Signs in with
// a token, watches a run started by the test stream in on /runs/<id>,
// cancels it with the button and sees it aborted. The screenshot goes to
// test/artifacts/run-page.png.

import assert from "node:assert/strict";
import { existsSync, mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import puppeteer from "puppeteer-core";

import { RunStatus } from "../dist/index.js";
import { putLocalDefinition, startProxy, startServer } from "./support.mjs";

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
  ].join("\n");
  return ["sh", "-c", `cat <<'EOF'\n${script}\nEOF\ni=1; while [ $i -le ${lines} ]; do echo "working on step $i"; i=$((i+1)); sleep 0.2; done`];
}

const axePath = createRequire(import.meta.url).resolve("axe-core/axe.min.js");

/**
 * The accessibility problems axe-core finds on the page as it is (WCAG 2 A
 * and AA rules: contrast, names of controls, landmarks, ...), as
 * `rule: target` strings. The page's CSP forbids injected scripts, so
 * pages that are audited bypass it.
 */
async function accessibilityProblems(page) {
  await page.addScriptTag({ path: axePath });
  return page.evaluate(async () => {
    const result = await globalThis.axe.run(document, { runOnly: { type: "tag", values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"] } });
    if (result.passes.length === 0) return ["axe checked nothing"];
    return result.violations.flatMap((v) => v.nodes.map((n) => `${v.id}: ${n.target.join(" ")}`));
  });
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

  assert.deepEqual(await accessibilityProblems(page), [], "the run page, running");
  // Keyboard: the Cancel button takes focus and Enter presses it.
  await page.focus("#cancel");
  await page.keyboard.press("Enter");
  await page.waitForSelector('#run-status [data-status="aborted"]', { timeout: 30_000 });
  await page.waitForFunction(() => document.querySelector(".end.errored")?.textContent.includes("CANCELLED"));
  assert.equal(await page.$eval("#cancel", (b) => b.disabled), true);
  const run = await client.getRun(runId);
  assert.equal(run.status, RunStatus.ABORTED);

  mkdirSync(artifacts, { recursive: true });
  await page.screenshot({ path: join(artifacts, "run-page.png"), fullPage: false });
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

  const { page, pageErrors } = await openPage(t);
  page.on("dialog", (d) => d.accept());
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
  await page.goto(server.url + "/sandboxes", { waitUntil: "load" });

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

  // Destroy the sandbox from the list (the confirmation accepted).
  await page.goto(server.url + "/sandboxes", { waitUntil: "load" });
  await page.waitForSelector(`button[aria-label^="Destroy sandbox"]`);
  await page.click(`button[aria-label^="Destroy sandbox"]`);
  await page.waitForFunction(() => document.querySelector("main")?.textContent.includes("No sandboxes."));
  assert.equal((await client.sandboxes.listSandboxes({ threadId: "" })).sandboxes.length, 0);
  assert.deepEqual(pageErrors, []);
});
