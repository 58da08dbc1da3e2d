// Snapshots of a thread at /threads/<thread>/snapshots: its checkpoints,
// an artifact read from one, and a fork into a new thread.

import { SandholdError } from "@sandhold/client";
import { bytes, concat, h, problem, when } from "./dom.js";
import { navigate } from "./router.js";
import { client } from "./session.js";

/** /snapshots: pick a thread (recent ones offered). */
export function renderSnapshotThreads(main: HTMLElement, signal: AbortSignal): void {
  const input = h("input", { id: "snapshot-thread", name: "thread", required: true });
  const recent = h("ul", { class: "plain" });
  main.replaceChildren(
    h("h1", {}, "Snapshots"),
    h(
      "form",
      {
        class: "filters",
        onsubmit: (e: Event) => {
          e.preventDefault();
          navigate(`/threads/${encodeURIComponent(input.value.trim())}/snapshots`);
        },
      },
      h("label", { for: "snapshot-thread" }, "Thread"),
      input,
      h("button", { type: "submit" }, "Show"),
    ),
    h("h2", {}, "Recent threads"),
    recent,
  );
  void client.listRuns({ limit: 200 }).then(
    (runs) => {
      const threads = [...new Set(runs.map((r) => r.threadId))];
      recent.replaceChildren(...threads.map((t) => h("li", {}, h("a", { href: `/threads/${encodeURIComponent(t)}/snapshots` }, t))));
      if (!threads.length) {
        recent.replaceChildren(
          h(
            "li",
            { class: "empty" },
            "No threads yet. A thread's runs are saved as snapshots when its definition turns portable snapshots on (",
            h("code", {}, "lifecycle.portable_snapshots"),
            "); start one with ",
            h("code", {}, "sandhold run --thread demo -- echo hello"),
            ".",
          ),
        );
      }
    },
    (e) => signal.aborted || recent.replaceChildren(problem(SandholdError.from(e).message)),
  );
}

export function renderSnapshots(main: HTMLElement, threadId: string, signal: AbortSignal): void {
  const body = h("tbody");
  const note = h("div", { "aria-live": "polite" });
  const artifact = h("section", { "aria-live": "polite" });
  main.replaceChildren(
    h("h1", {}, "Snapshots of ", h("code", {}, threadId)),
    h(
      "table",
      { class: "list" },
      h("thead", {}, h("tr", {}, ...["Checkpoint", "Label", "Run", "Created", "Files", "Size", "Read an artifact", "Fork"].map((c) => h("th", { scope: "col" }, c)))),
      body,
    ),
    note,
    artifact,
  );
  void (async () => {
    try {
      const { checkpoints } = await client.snapshots.listSnapshots({ threadId }, { signal });
      body.replaceChildren(
        ...checkpoints.map((c) => {
          const short = c.checkpointId.slice(0, 12);
          const pathId = `artifact-${c.checkpointId}`;
          const path = h("input", { id: pathId, name: "path", placeholder: "path in the workspace", required: true });
          const fork = h("input", { id: `fork-${c.checkpointId}`, name: "thread", placeholder: "new thread id", required: true });
          return h(
            "tr",
            {},
            h("td", {}, h("code", {}, short), c.head ? h("span", { class: "tag" }, "head") : ""),
            h("td", {}, c.label),
            h("td", {}, c.runId ? h("a", { href: `/runs/${encodeURIComponent(c.runId)}` }, c.runId) : ""),
            h("td", {}, when(c.createdAtMs)),
            h("td", {}, String(c.fileCount)),
            h("td", {}, bytes(c.totalBytes)),
            h(
              "td",
              {},
              h(
                "form",
                {
                  class: "inline",
                  onsubmit: (e: Event) => {
                    e.preventDefault();
                    void readArtifact(threadId, c.checkpointId, path.value.trim(), artifact);
                  },
                },
                h("label", { for: pathId, class: "visually-hidden" }, `Path to read from ${short}`),
                path,
                h("button", { type: "submit" }, "Read"),
              ),
            ),
            h(
              "td",
              {},
              h(
                "form",
                {
                  class: "inline",
                  onsubmit: async (e: Event) => {
                    e.preventDefault();
                    try {
                      const forked = await client.snapshots.forkSnapshot({ threadId, checkpointId: c.checkpointId, newThreadId: fork.value.trim() });
                      note.replaceChildren(
                        h("p", {}, "Forked into ", h("a", { href: `/threads/${encodeURIComponent(fork.value.trim())}/snapshots` }, fork.value.trim()),
                          ` with ${forked.runIds.length} run(s).`),
                      );
                    } catch (err) {
                      note.replaceChildren(problem(`Fork failed: ${SandholdError.from(err).message}`));
                    }
                  },
                },
                h("label", { for: `fork-${c.checkpointId}`, class: "visually-hidden" }, `New thread forked from ${short}`),
                fork,
                h("button", { type: "submit" }, "Fork"),
              ),
            ),
          );
        }),
      );
      note.replaceChildren(
        checkpoints.length
          ? ""
          : h(
              "p",
              { class: "empty" },
              "No snapshots of this thread. One is saved after each of its runs when its definition turns on ",
              h("code", {}, "lifecycle.portable_snapshots"),
              "; the API's ",
              h("code", {}, "SaveSnapshot"),
              " saves one at any time.",
            ),
      );
    } catch (e) {
      if (!signal.aborted) note.replaceChildren(problem(SandholdError.from(e).message));
    }
  })();
}

async function readArtifact(threadId: string, checkpointId: string, path: string, into: HTMLElement): Promise<void> {
  into.replaceChildren(h("p", { class: "muted" }, `Reading ${path}…`));
  try {
    const parts: Uint8Array[] = [];
    let size = 0n;
    for await (const piece of client.snapshots.readArtifact({ threadId, checkpointId, path })) {
      if (piece.info) size = piece.info.size;
      parts.push(piece.data);
    }
    const text = new TextDecoder().decode(concat(parts));
    into.replaceChildren(h("h2", {}, h("code", {}, path), ` (${bytes(size)})`), h("pre", { class: "file", tabindex: 0 }, text));
  } catch (e) {
    into.replaceChildren(problem(`Could not read ${path}: ${SandholdError.from(e).message}`));
  }
}
