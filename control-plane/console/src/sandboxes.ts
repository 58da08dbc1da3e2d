// Sandboxes: the tenant's list (destroy), and a file browser of one live
// sandbox at /sandboxes/<id>?path=<dir or file>.

import { FileType, SandholdError, type FileInfo } from "@sandhold/client";
import { bytes, concat, h, problem, when } from "./dom.js";
import { client } from "./session.js";

export function renderSandboxes(main: HTMLElement, signal: AbortSignal): void {
  const body = h("tbody");
  const note = h("div", { "aria-live": "polite" });
  main.replaceChildren(
    h("h1", {}, "Sandboxes"),
    h(
      "table",
      { class: "list" },
      h("thead", {}, h("tr", {}, ...["Sandbox", "Thread", "Definition", "Provider", "Created", ""].map((c) => h("th", { scope: "col" }, c)))),
      body,
    ),
    note,
  );
  const refresh = async () => {
    try {
      const { sandboxes } = await client.sandboxes.listSandboxes({ threadId: "" }, { signal });
      body.replaceChildren(
        ...sandboxes.map((s) =>
          h(
            "tr",
            {},
            h("td", {}, h("a", { href: `/sandboxes/${encodeURIComponent(s.sandboxId)}` }, h("code", {}, s.sandboxId.slice(0, 16)))),
            h("td", {}, h("a", { href: `/?thread=${encodeURIComponent(s.threadId)}` }, s.threadId)),
            h("td", {}, s.definitionId),
            h("td", {}, s.provider),
            h("td", {}, when(s.createdAtMs)),
            h(
              "td",
              {},
              h(
                "button",
                {
                  type: "button",
                  class: "danger",
                  "aria-label": `Destroy sandbox ${s.sandboxId.slice(0, 16)}`,
                  onclick: async () => {
                    if (!confirm(`Destroy sandbox ${s.sandboxId.slice(0, 16)} of thread ${s.threadId}?`)) return;
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
          ),
        ),
      );
      note.replaceChildren(sandboxes.length ? "" : h("p", { class: "muted" }, "No sandboxes."));
    } catch (e) {
      if (!signal.aborted) note.replaceChildren(problem(`Could not list sandboxes: ${SandholdError.from(e).message}`));
    }
  };
  void refresh();
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
