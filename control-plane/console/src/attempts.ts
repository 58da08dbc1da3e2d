// A set of attempts at /attempts/<set>: the attempts side by side (status,
// files changed, lines, the test's outcome, tokens, time), each one's diff,
// and Promote (behind a confirmation) until the set has promoted one.

import { SandholdError, type AttemptSet } from "@sandhold/client";
import { confirmDialog, h, problem } from "./dom.js";
import { client } from "./session.js";

const STATUS = ["unspecified", "running", "interrupted", "completed", "failed", "aborted"];

export function renderAttempts(main: HTMLElement, setId: string, signal: AbortSignal): void {
  const body = h("tbody");
  const note = h("div", { "aria-live": "polite" });
  const diffs = h("section", { "aria-label": "Diffs" });
  const summary = h("p", { class: "muted" });
  main.replaceChildren(
    h("h1", {}, "Attempts ", h("code", {}, setId)),
    summary,
    h(
      "table",
      { class: "list attempts" },
      h(
        "thead",
        {},
        h("tr", {}, ...["#", "Run", "Harness", "Status", "Files", "Lines", "Test", "Tokens", "Time", ""].map((c) => h("th", { scope: "col" }, c))),
      ),
      body,
    ),
    note,
    h("h2", {}, "Diffs"),
    diffs,
  );
  let shownDiffs = "";
  const show = (set: AttemptSet) => {
    summary.replaceChildren(
      "Thread ",
      h("a", { href: `/threads/${encodeURIComponent(set.threadId)}/snapshots` }, set.threadId),
      ` · from checkpoint ${set.baseCheckpointId.slice(0, 12)}`,
      set.promotedRunId ? ` · promoted ${set.promotedRunId}` : "",
    );
    body.replaceChildren(
      ...set.attempts.map((a) => {
        const status = STATUS[a.status] ?? "unknown";
        const test = a.testExitCode !== undefined ? (a.testExitCode === 0 ? "passed" : `failed (${a.testExitCode})`) : a.evaluated ? a.testError || "none" : "…";
        const tokens = a.usage ? Number(a.usage.inputTokens + a.usage.outputTokens) : 0;
        const promote = h("button", { type: "button", class: "promote", "data-run": a.runId }, "Promote");
        promote.disabled = !a.evaluated || !a.checkpointId || set.promotedRunId !== "";
        promote.addEventListener("click", async () => {
          const sure = await confirmDialog({
            id: "promote-dialog",
            title: `Promote attempt ${a.attempt}?`,
            body: "Its files and its conversation become the thread's; the other attempts' sandboxes are destroyed. A set promotes one attempt.",
            keep: "Keep comparing",
            confirm: "Promote",
          });
          if (!sure) return;
          promote.disabled = true;
          try {
            const promoted = await client.promoteAttempt(setId, a.runId);
            if (promoted) show(promoted);
            note.replaceChildren(h("p", {}, `Attempt ${a.attempt} is the thread's now.`));
          } catch (e) {
            note.replaceChildren(problem(`Promote failed: ${SandholdError.from(e).message}`));
            promote.disabled = false;
          }
        });
        const cell = (label: string, ...children: (Node | string)[]) => h("td", { "data-label": label }, ...children);
        return h(
          "tr",
          { "data-attempt": a.attempt },
          cell("#", String(a.attempt)),
          cell("Run", h("a", { href: `/runs/${encodeURIComponent(a.runId)}` }, a.runId)),
          cell("Harness", [a.harness, a.model].filter(Boolean).join(" ")),
          cell("Status", h("span", { class: `status ${status}` }, status), a.runId === set.promotedRunId ? h("span", { class: "tag" }, "promoted") : ""),
          cell("Files", String(a.filesChanged)),
          cell("Lines", `+${a.linesAdded} −${a.linesRemoved}`),
          cell("Test", h("span", { class: "test" }, test)),
          cell("Tokens", tokens ? String(tokens) : "—"),
          cell("Time", a.durationMs ? `${(Number(a.durationMs) / 1000).toFixed(1)}s` : "—"),
          cell("Promote", promote),
        );
      }),
    );
    // Each evaluated attempt's diff, fetched once.
    const ready = set.attempts.filter((a) => a.evaluated && a.checkpointId).map((a) => a.runId).join(",");
    if (ready !== shownDiffs) {
      shownDiffs = ready;
      void Promise.all(
        set.attempts
          .filter((a) => a.evaluated && a.checkpointId)
          .map(async (a) => {
            const patch = await client.getAttemptPatch(setId, a.runId);
            return h(
              "details",
              { class: "diff", "data-attempt": a.attempt },
              h("summary", {}, `Attempt ${a.attempt}: ${a.filesChanged} file(s), +${a.linesAdded} −${a.linesRemoved}`),
              h("pre", { class: "patch" }, h("code", {}, patch || "(no changes)")),
              a.testOutputTail ? h("pre", { class: "patch" }, h("code", {}, a.testOutputTail)) : "",
            );
          }),
      ).then(
        (parts) => diffs.replaceChildren(...parts),
        (e) => signal.aborted || diffs.replaceChildren(problem(`Diffs: ${SandholdError.from(e).message}`)),
      );
    }
    return set.attempts.every((a) => a.evaluated);
  };
  const poll = async () => {
    try {
      const set = await client.getAttemptSet(setId);
      if (set && show(set)) stop();
    } catch (e) {
      if (signal.aborted) return;
      const err = SandholdError.from(e);
      main.replaceChildren(h("h1", {}, "Attempts ", h("code", {}, setId)), problem(err.reason === "NOT_FOUND" ? "No such set of attempts." : err.message));
      stop();
    }
  };
  const timer = setInterval(() => void poll(), 1000);
  const stop = () => clearInterval(timer);
  signal.addEventListener("abort", stop);
  void poll();
}
