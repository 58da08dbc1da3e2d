// The runs page: newest first, filtered by thread and status, refreshed
// every two seconds so status changes show up live.

import { RunStatus, type Run } from "@sandhold/client";
import { duration, h, problem, when } from "./dom.js";
import { client } from "./session.js";

export const STATUS: Record<RunStatus, string> = {
  [RunStatus.UNSPECIFIED]: "unknown",
  [RunStatus.RUNNING]: "running",
  [RunStatus.INTERRUPTED]: "interrupted",
  [RunStatus.COMPLETED]: "completed",
  [RunStatus.FAILED]: "failed",
  [RunStatus.ABORTED]: "aborted",
};

export function statusBadge(run: Run): HTMLElement {
  const name = STATUS[run.status] ?? "unknown";
  return h("span", { class: `status status-${name}`, "data-status": name }, run.cancelRequested && name === "running" ? "cancelling" : name);
}

export function renderRuns(main: HTMLElement, signal: AbortSignal): void {
  const query = new URLSearchParams(location.search);
  const thread = h("input", { id: "filter-thread", name: "thread", value: query.get("thread") ?? "", placeholder: "any thread" });
  const status = h(
    "select",
    { id: "filter-status", name: "status" },
    h("option", { value: "" }, "any status"),
    ...Object.values(STATUS)
      .filter((s) => s !== "unknown")
      .map((s) => h("option", { value: s, selected: query.get("status") === s }, s)),
  );
  const body = h("tbody");
  const note = h("p", { class: "muted", "aria-live": "polite" });
  const form = h(
    "form",
    {
      class: "filters",
      role: "search",
      onsubmit: (e: Event) => {
        e.preventDefault();
        const q = new URLSearchParams();
        if (thread.value.trim()) q.set("thread", thread.value.trim());
        if (status.value) q.set("status", status.value);
        history.replaceState(null, "", q.size ? `/?${q}` : "/");
        void refresh();
      },
    },
    h("label", { for: "filter-thread" }, "Thread"),
    thread,
    h("label", { for: "filter-status" }, "Status"),
    status,
    h("button", { type: "submit" }, "Filter"),
  );
  status.addEventListener("change", () => form.requestSubmit());
  main.replaceChildren(
    h("h1", {}, "Runs"),
    form,
    h(
      "table",
      { class: "list" },
      h("caption", { class: "visually-hidden" }, "Runs, newest first"),
      h(
        "thead",
        {},
        h("tr", {}, ...["Run", "Thread", "Status", "Harness", "Started", "Duration"].map((c) => h("th", { scope: "col" }, c))),
      ),
      body,
    ),
    note,
  );

  async function refresh(): Promise<void> {
    try {
      const runs = await client.listRuns({ threadId: thread.value.trim(), limit: 200 });
      const wanted = status.value;
      const shown = runs.filter((r) => !wanted || STATUS[r.status] === wanted);
      body.replaceChildren(
        ...shown.map((r) =>
          h(
            "tr",
            { "data-run": r.runId },
            h("td", {}, h("a", { href: `/runs/${encodeURIComponent(r.runId)}` }, r.runId)),
            h("td", {}, h("a", { href: `/?thread=${encodeURIComponent(r.threadId)}` }, r.threadId)),
            h("td", {}, statusBadge(r)),
            h("td", {}, r.harness),
            h("td", {}, when(r.startedAtMs)),
            h("td", {}, duration(r.startedAtMs, r.finishedAtMs)),
          ),
        ),
      );
      note.textContent = shown.length ? "" : "No runs.";
    } catch (e) {
      note.replaceChildren(problem(`Could not list runs: ${(e as Error).message}`));
    }
  }
  void refresh();
  const timer = setInterval(() => void refresh(), 2000);
  signal.addEventListener("abort", () => clearInterval(timer));
}
