// Sandboxes: the tenant's list with what each is doing (state, keep-alive,
// CPU and memory as its provider measures them, unknown when it cannot),
// destroy behind a confirmation, and a file browser of one live sandbox at
// /sandboxes/<id>?path=<dir or file>.

import { FileType, SandboxState, SandholdError, type FileInfo, type Sandbox } from "@sandhold/client";
import { bytes, concat, confirmDialog, h, problem, when } from "./dom.js";
import { client } from "./session.js";

const STATES: Record<SandboxState, string> = {
  [SandboxState.UNSPECIFIED]: "unknown",
  [SandboxState.RUNNING]: "running",
  [SandboxState.STOPPED]: "stopped",
  [SandboxState.MISSING]: "missing",
};

/** A keep-alive in words. */
function keepAlive(ms: bigint | undefined): string {
  if (ms === undefined) return "unknown (its definition is gone)";
  if (ms === 0n) return "never stopped";
  const s = Number(ms) / 1000;
  return `stopped after ${s < 60 ? `${s}s` : s < 3600 ? `${Math.round(s / 60)} min` : `${(s / 3600).toFixed(1)} h`} idle`;
}

export function renderSandboxes(main: HTMLElement, signal: AbortSignal): void {
  const body = h("tbody");
  const note = h("div", { class: "note-area", "aria-live": "polite" });
  const table = h(
    "table",
    { class: "list sandboxes" },
    h("caption", { class: "visually-hidden" }, "Sandboxes"),
    h(
      "thead",
      {},
      h("tr", {}, ...["Sandbox", "State", "Thread", "Definition", "Provider", "Keep-alive", "CPU", "Memory", "Created", "Actions"].map((c) => h("th", { scope: "col" }, c))),
    ),
    body,
  );
  table.hidden = true;
  main.replaceChildren(h("h1", {}, "Sandboxes"), table, note);
  // The previous reading of each sandbox's CPU time: its rate is the
  // difference over the time between readings.
  const previous = new Map<string, { cpuMs: number; atMs: number }>();
  const cpu = (s: Sandbox): string => {
    const u = s.usage;
    if (s.state !== SandboxState.RUNNING) return "—";
    if (!u || u.cpuTimeMs === undefined) return "unknown";
    const now = { cpuMs: Number(u.cpuTimeMs), atMs: Number(u.measuredAtMs) };
    const before = previous.get(s.sandboxId);
    previous.set(s.sandboxId, now);
    const total = `${(now.cpuMs / 1000).toFixed(1)} s`;
    if (!before || now.atMs <= before.atMs) return total;
    const percent = ((now.cpuMs - before.cpuMs) / (now.atMs - before.atMs)) * 100;
    return `${Math.max(0, percent).toFixed(0)}% now · ${total} in all`;
  };
  const memory = (s: Sandbox): string => {
    if (s.state !== SandboxState.RUNNING) return "—";
    const u = s.usage;
    if (!u || u.memoryBytes === undefined) return "unknown";
    return u.memoryLimitBytes !== undefined ? `${bytes(u.memoryBytes)} of ${bytes(u.memoryLimitBytes)}` : bytes(u.memoryBytes);
  };
  const refresh = async () => {
    try {
      const { sandboxes } = await client.sandboxes.listSandboxes({ threadId: "", withState: true }, { signal });
      body.replaceChildren(
        ...sandboxes.map((s) => {
          const short = s.sandboxId.slice(0, 16);
          const state = STATES[s.state] ?? "unknown";
          const cell = (label: string, ...children: (Node | string)[]) => h("td", { "data-label": label }, ...children);
          return h(
            "tr",
            { "data-sandbox": s.sandboxId },
            cell("Sandbox", h("a", { href: `/sandboxes/${encodeURIComponent(s.sandboxId)}` }, h("code", {}, short))),
            cell("State", h("span", { class: `state state-${state}`, "data-state": state }, state)),
            cell("Thread", h("a", { href: `/?thread=${encodeURIComponent(s.threadId)}` }, s.threadId)),
            cell("Definition", s.definitionId),
            cell("Provider", s.provider),
            cell("Keep-alive", keepAlive(s.keepAliveMs)),
            cell("CPU", h("span", { class: "cpu" }, cpu(s))),
            cell("Memory", h("span", { class: "memory" }, memory(s))),
            cell("Created", when(s.createdAtMs)),
            cell(
              "Actions",
              h(
                "button",
                {
                  type: "button",
                  class: "danger",
                  "aria-label": `Destroy sandbox ${short}`,
                  onclick: async () => {
                    const sure = await confirmDialog({
                      id: "destroy-dialog",
                      title: `Destroy sandbox ${short}?`,
                      body: `Its files and processes go with it; thread ${s.threadId} gets a new sandbox on its next run.`,
                      keep: "Keep it",
                      confirm: "Destroy",
                    });
                    if (!sure) return;
                    try {
                      await client.sandboxes.destroySandbox({ sandboxId: s.sandboxId });
                      await refresh();
                    } catch (e) {
                      note.replaceChildren(problem(`Destroy failed: ${SandholdError.from(e).message}`));
                    }
                  },
                },
                "Destroy",
              ),
            ),
          );
        }),
      );
      table.hidden = sandboxes.length === 0;
      note.replaceChildren(sandboxes.length ? "" : noSandboxes());
    } catch (e) {
      if (!signal.aborted) note.replaceChildren(problem(`Could not list sandboxes: ${SandholdError.from(e).message}`));
    }
  };
  void refresh();
  const timer = setInterval(() => void refresh(), 5000);
  signal.addEventListener("abort", () => clearInterval(timer));
}

/** The empty state: where sandboxes come from. */
function noSandboxes(): HTMLElement {
  return h(
    "section",
    { class: "empty", id: "empty-sandboxes" },
    h("h2", {}, "No sandboxes"),
    h("p", {}, "A run makes one, and a thread keeps it for its next runs:"),
    h("pre", {}, h("code", {}, "sandhold run --thread demo -- echo hello")),
    h("p", {}, "Then browse its files here. From a terminal: ", h("code", {}, "sandhold sandboxes ls"), "."),
  );
}

/** Bytes of a file the browser shows at most. */
const SHOW_MAX = 1024 * 1024;

export function renderFiles(main: HTMLElement, sandboxId: string, signal: AbortSignal): void {
  const path = new URLSearchParams(location.search).get("path") ?? "";
  const here = (p: string) => `/sandboxes/${encodeURIComponent(sandboxId)}?path=${encodeURIComponent(p)}`;
  const crumbs = h("nav", { class: "crumbs", "aria-label": "Path" }, h("a", { href: here("") }, "root"));
  let so = "";
  for (const part of path.split("/").filter(Boolean)) {
    so = so ? `${so}/${part}` : part;
    crumbs.append(" / ", h("a", { href: here(so) }, part));
  }
  const content = h("div", { "aria-live": "polite" }, h("p", { class: "muted" }, "Loading…"));
  main.replaceChildren(h("h1", {}, "Sandbox ", h("code", {}, sandboxId.slice(0, 16))), crumbs, content);

  void (async () => {
    try {
      const stat = path ? (await client.sandboxes.statFile({ sandboxId, path }, { signal })).info : undefined;
      if (stat && stat.type !== FileType.DIRECTORY) {
        content.replaceChildren(await fileView(sandboxId, path, stat, signal));
        return;
      }
      const { entries } = await client.sandboxes.listFiles({ sandboxId, path, depth: 1 }, { signal });
      entries.sort((a, b) => Number(b.type === FileType.DIRECTORY) - Number(a.type === FileType.DIRECTORY) || a.name.localeCompare(b.name));
      content.replaceChildren(
        h(
          "table",
          { class: "list" },
          h("thead", {}, h("tr", {}, ...["Name", "Size", "Modified"].map((c) => h("th", { scope: "col" }, c)))),
          h(
            "tbody",
            {},
            ...entries.map((f) =>
              h(
                "tr",
                {},
                h("td", {}, h("a", { href: here(f.path) }, f.type === FileType.DIRECTORY ? `${f.name}/` : f.name)),
                h("td", {}, f.type === FileType.DIRECTORY ? "" : bytes(f.size)),
                h("td", {}, when(f.mtimeMs)),
              ),
            ),
          ),
        ),
        entries.length ? "" : h("p", { class: "muted" }, "Empty directory."),
      );
    } catch (e) {
      if (!signal.aborted) content.replaceChildren(problem(SandholdError.from(e).message));
    }
  })();
}

async function fileView(sandboxId: string, path: string, info: FileInfo | undefined, signal: AbortSignal): Promise<HTMLElement> {
  const parts: Uint8Array[] = [];
  for await (const piece of client.sandboxes.readFile({ sandboxId, path, offset: 0n, limit: BigInt(SHOW_MAX) }, { signal })) {
    parts.push(piece.data);
  }
  const all = concat(parts);
  const total = all.length;
  const binary = all.subarray(0, 8000).includes(0);
  const size = info ? Number(info.size) : total;
  return h(
    "section",
    {},
    h("p", { class: "muted" }, `${bytes(size)}${size > total ? `, first ${bytes(total)} shown` : ""}`),
    binary ? h("p", {}, "Binary file: not shown.") : h("pre", { class: "file", tabindex: 0 }, new TextDecoder().decode(all)),
  );
}
