// The runs page: newest first, what each was asked, searched and filtered
// by the server (text, thread, status) a page at a time, refreshed every
// two seconds so status changes show up live; how to start when empty.

import { RunStatus, type Run } from "@sandhold/client";
import { duration, h, problem, shellLine, when } from "./dom.js";
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

/** Runs a page shows, unless the address says `?limit=N` (1 to 200). */
const PAGE = 25;

/** What a run was asked, in one line: its command, else its prompt's first line. */
export function askedLine(run: Run): string {
  if (run.command.length) return shellLine(run.command);
  return run.prompt.split("\n").find((l) => l.trim()) ?? "";
}

export function renderRuns(main: HTMLElement, signal: AbortSignal): void {
  const query = new URLSearchParams(location.search);
  const limit = Math.min(200, Math.max(1, Number(query.get("limit")) || PAGE));
  const search = h("input", { id: "filter-query", name: "q", type: "search", value: query.get("q") ?? "", placeholder: "command, prompt, id…" });
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
  const note = h("div", { class: "note-area", "aria-live": "polite" });
  const newer = h("button", { id: "page-newer", type: "button", class: "secondary", disabled: true }, "← Newer");
  const older = h("button", { id: "page-older", type: "button", class: "secondary", disabled: true }, "Older →");
  const where = h("span", { id: "page-where", class: "muted" });
  // The tokens of the pages before this one (empty: the first page).
  let tokens: string[] = [];
  let next = "";
  const form = h(
    "form",
    {
      class: "filters",
      role: "search",
      onsubmit: (e: Event) => {
        e.preventDefault();
        const q = new URLSearchParams();
        if (search.value.trim()) q.set("q", search.value.trim());
        if (thread.value.trim()) q.set("thread", thread.value.trim());
        if (status.value) q.set("status", status.value);
        if (limit !== PAGE) q.set("limit", String(limit));
        history.replaceState(null, "", q.size ? `/?${q}` : "/");
        tokens = [];
        void refresh();
      },
    },
    h("label", { for: "filter-query" }, "Search"),
    search,
    h("label", { for: "filter-thread" }, "Thread"),
    thread,
    h("label", { for: "filter-status" }, "Status"),
    status,
    h("button", { type: "submit" }, "Filter"),
  );
  status.addEventListener("change", () => form.requestSubmit());
  newer.addEventListener("click", () => {
    tokens.pop();
    void refresh();
  });
  older.addEventListener("click", () => {
    tokens.push(next);
    void refresh();
  });
  const table = h(
    "table",
    { class: "list runs" },
    h("caption", { class: "visually-hidden" }, "Runs, newest first"),
    h(
      "thead",
      {},
      h("tr", {}, ...["Run", "Command or prompt", "Harness", "Status", "Thread", "Started", "Duration"].map((c) => h("th", { scope: "col" }, c))),
    ),
    body,
  );
  const pager = h("nav", { class: "pager", "aria-label": "Pages of runs" }, newer, where, older);
  main.replaceChildren(h("h1", {}, "Runs"), form, table, note, pager);

  const filtered = () => !!(search.value.trim() || thread.value.trim() || status.value);
  async function refresh(): Promise<void> {
    try {
      const wanted = Object.entries(STATUS).find(([, name]) => name === status.value)?.[0];
      const page = await client.runs.listRuns(
        {
          threadId: thread.value.trim(),
          query: search.value.trim(),
          status: wanted ? (Number(wanted) as RunStatus) : RunStatus.UNSPECIFIED,
          limit,
          pageToken: tokens.at(-1) ?? "",
        },
        { signal },
      );
      next = page.nextPageToken;
      body.replaceChildren(...page.runs.map(row));
      table.hidden = page.runs.length === 0;
      newer.disabled = tokens.length === 0;
      older.disabled = !next;
      where.textContent = page.runs.length ? `Page ${tokens.length + 1}` : "";
      pager.hidden = newer.disabled && older.disabled;
      note.replaceChildren(page.runs.length ? "" : filtered() ? noMatch() : noRunsYet());
    } catch (e) {
      if (!signal.aborted) note.replaceChildren(problem(`Could not list runs: ${(e as Error).message}`));
    }
  }
  void refresh();
  const timer = setInterval(() => void refresh(), 2000);
  signal.addEventListener("abort", () => clearInterval(timer));
}

function row(r: Run): HTMLElement {
  const asked = askedLine(r);
  const cell = (label: string, ...children: (Node | string)[]) => h("td", { "data-label": label }, ...children);
  return h(
    "tr",
    { "data-run": r.runId },
    cell("Run", h("a", { href: `/runs/${encodeURIComponent(r.runId)}` }, r.runId)),
    cell("Asked", asked ? h("code", { class: "asked-line", title: asked }, asked.length > 90 ? `${asked.slice(0, 89)}…` : asked) : h("span", { class: "muted" }, "not recorded")),
    cell("Harness", r.harness),
    cell("Status", statusBadge(r)),
    cell("Thread", h("a", { href: `/?thread=${encodeURIComponent(r.threadId)}` }, r.threadId)),
    cell("Started", when(r.startedAtMs)),
    cell("Duration", duration(r.startedAtMs, r.finishedAtMs)),
  );
}

/** The empty state of a server with no runs: how to start one. */
function noRunsYet(): HTMLElement {
  return h(
    "section",
    { class: "empty", id: "empty-runs" },
    h("h2", {}, "No runs yet"),
    h("p", {}, "Start one from a terminal, with this server as ", h("code", {}, "SANDHOLD_SERVER"), ":"),
    h("pre", {}, h("code", {}, "sandhold run -- echo hello")),
    h("p", {}, "or an agent on a task:"),
    h("pre", {}, h("code", {}, "sandhold run --harness claude-code --secret ANTHROPIC_API_KEY=ANTHROPIC_API_KEY -- 'Fix the failing test'")),
    h("p", {}, "It shows up here while it runs, and its page follows it live."),
  );
}

function noMatch(): HTMLElement {
  return h("section", { class: "empty" }, h("h2", {}, "No runs match"), h("p", {}, "Nothing matches these filters. ", h("a", { href: "/" }, "Show all runs"), "."));
}
