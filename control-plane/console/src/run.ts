// One run, live, at /runs/<run_id>: its chunks as a conversation, followed
// from the log (the client resumes after the last offset received when the
// connection drops), its status, and a Cancel button.

import {
  isFileChanged,
  isHarnessWarning,
  isSandboxFile,
  RunStatus,
  SandholdError,
  type Run,
  type TypedChunk,
  type Usage,
} from "@sandhold/client";
import { duration, h, problem, when } from "./dom.js";
import { statusBadge } from "./runs.js";
import { client } from "./session.js";

export function renderRun(main: HTMLElement, runId: string, signal: AbortSignal): void {
  const status = h("span", { id: "run-status", "aria-live": "polite" });
  const facts = h("dl", { class: "facts" });
  const cancel = h("button", { id: "cancel", type: "button", class: "danger", disabled: true }, "Cancel run");
  const connection = h("p", { id: "connection", class: "muted", "aria-live": "polite" });
  const log = h("div", { id: "conversation", class: "conversation", role: "log", "aria-label": "Conversation" });
  main.replaceChildren(
    h("h1", {}, "Run ", h("code", {}, runId)),
    h("div", { class: "run-head" }, h("span", {}, "Status: ", status), cancel),
    facts,
    connection,
    log,
  );

  let terminal = false;
  const show = (run: Run) => {
    status.replaceChildren(statusBadge(run));
    // Interrupted is not an end: a replica takes the run over.
    terminal = [RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.ABORTED].includes(run.status);
    cancel.disabled = terminal || run.cancelRequested;
    facts.replaceChildren(
      ...fact("Thread", h("a", { href: `/?thread=${encodeURIComponent(run.threadId)}` }, run.threadId)),
      ...fact("Harness", run.harness),
      ...fact("Started", when(run.startedAtMs)),
      ...fact("Duration", duration(run.startedAtMs, run.finishedAtMs)),
      ...(run.sandboxId ? fact("Sandbox", h("a", { href: `/sandboxes/${encodeURIComponent(run.sandboxId)}` }, run.sandboxId.slice(0, 16))) : []),
      ...(run.error?.code ? fact("Error", `${run.error.code}: ${run.error.message}`) : []),
    );
  };
  const poll = async () => {
    try {
      const run = await client.getRun(runId);
      if (run) show(run);
    } catch (e) {
      if (e instanceof SandholdError && e.reason === "NOT_FOUND") {
        main.replaceChildren(h("h1", {}, "Run ", h("code", {}, runId)), problem("No such run."));
        stop();
      }
    }
  };
  // The record's status (cancel requested, aborted, detached) changes
  // apart from the log: ask again until it is terminal.
  const timer = setInterval(() => {
    if (!terminal) void poll();
  }, 1000);
  const stop = () => clearInterval(timer);
  signal.addEventListener("abort", stop);
  void poll();

  cancel.addEventListener("click", async () => {
    cancel.disabled = true;
    try {
      const run = await client.cancelRun(runId);
      if (run) show(run);
    } catch (e) {
      connection.replaceChildren(problem(`Cancel failed: ${(e as Error).message}`));
      cancel.disabled = false;
    }
  });

  const view = new Conversation(log);
  void (async () => {
    try {
      const stream = client.attachRun(runId, {
        signal,
        onReconnect: ({ attempt }) => {
          connection.textContent = `Connection lost; reconnecting (attempt ${attempt})…`;
        },
      });
      for await (const item of stream) {
        connection.textContent = "";
        if (item.kind === "chunk") view.add(item.chunk);
      }
      void poll();
    } catch (e) {
      if (signal.aborted) return;
      const err = SandholdError.from(e);
      if (err.reason !== "NOT_FOUND") connection.replaceChildren(problem(`Stream ended: ${err.message}`));
    }
  })();
}

function fact(name: string, value: Node | string): HTMLElement[] {
  return [h("dt", {}, name), h("dd", {}, value)];
}

/** The chunks of a run as a conversation, updated in place as they arrive. */
class Conversation {
  readonly #texts = new Map<string, HTMLElement>();
  readonly #tools = new Map<string, { args: string; argsEl: HTMLElement; el: HTMLElement }>();

  constructor(readonly root: HTMLElement) {}

  add(c: TypedChunk): void {
    const stick = this.root.scrollHeight - this.root.scrollTop - this.root.clientHeight < 40;
    this.#render(c);
    if (stick) this.root.scrollTop = this.root.scrollHeight;
  }

  #render(c: TypedChunk): void {
    switch (c.type) {
      case "RUN_STARTED":
        this.#note(`Run started ${when(c.timestampMs)}`);
        return;
      case "TEXT_MESSAGE_START":
      case "TEXT_MESSAGE_CONTENT":
        this.#text(c.messageId, "message", c.type === "TEXT_MESSAGE_CONTENT" ? c.delta : "");
        return;
      case "REASONING_START":
      case "REASONING_CONTENT":
        this.#text(c.messageId, "reasoning", c.type === "REASONING_CONTENT" ? c.delta : "");
        return;
      case "TEXT_MESSAGE_END":
      case "REASONING_END":
        return;
      case "TOOL_CALL_START": {
        const argsEl = h("pre", { class: "args" });
        const el = h(
          "details",
          { class: "tool", open: true },
          h("summary", {}, "Tool call ", h("strong", {}, c.toolName)),
          h("h3", { class: "label" }, "Arguments"),
          argsEl,
        );
        this.#tools.set(c.toolCallId, { args: "", argsEl, el });
        this.root.append(el);
        return;
      }
      case "TOOL_CALL_ARGS": {
        const tool = this.#tool(c.toolCallId);
        tool.args += c.delta;
        tool.argsEl.textContent = tool.args;
        return;
      }
      case "TOOL_CALL_END": {
        const tool = this.#tool(c.toolCallId);
        try {
          tool.argsEl.textContent = JSON.stringify(JSON.parse(tool.args), null, 2);
        } catch {
          // not JSON after all: shown as it came
        }
        return;
      }
      case "TOOL_CALL_RESULT": {
        const tool = this.#tool(c.toolCallId);
        tool.el.classList.toggle("failed", c.isError);
        tool.el.append(
          h("h3", { class: "label" }, c.isError ? "Result (error)" : "Result", c.exitCode !== undefined ? ` · exit ${c.exitCode}` : ""),
          h("pre", { class: "result" }, c.content),
        );
        return;
      }
      case "RUN_FINISHED":
        this.root.append(
          h("section", { class: "end finished" }, h("h2", {}, `Finished (${c.finishReason || "stop"})`), usageTable(c.usage)),
        );
        return;
      case "RUN_ERROR":
        this.root.append(
          h("section", { class: "end errored", role: "alert" }, h("h2", {}, `Ended: ${c.errorCode || "error"}`), h("p", {}, c.errorMessage)),
        );
        return;
      case "CUSTOM":
        this.#custom(c);
        return;
      default:
        this.#note(`(an event this console does not know: ${c.type})`);
    }
  }

  #custom(c: TypedChunk & { type: "CUSTOM" }): void {
    if (isSandboxFile(c)) {
      this.#note(`${c.value.type} ${c.value.path}`, "file-event");
    } else if (isFileChanged(c)) {
      this.root.append(h("section", { class: "diff" }, h("h3", {}, "Changed ", h("code", {}, c.value.path)), diff(c.value.diff)));
    } else if (isHarnessWarning(c)) {
      this.#note(`Warning: ${c.value.message}`, "warning");
    } else if (c.name === "run.accepted") {
      this.#note("Run accepted");
    } else if (c.name.endsWith(".session-id")) {
      const id = (c.value as { session_id?: string } | null)?.session_id ?? "";
      this.#note(`Session ${id}`);
    } else {
      this.#note(`${c.name}: ${JSON.stringify(c.value)}`);
    }
  }

  #text(id: string, kind: "message" | "reasoning", delta: string): void {
    let body = this.#texts.get(id);
    if (!body) {
      body = h("div", { class: "body" });
      this.root.append(
        kind === "reasoning"
          ? h("details", { class: "reasoning" }, h("summary", {}, "Reasoning"), body)
          : h("div", { class: "message" }, body),
      );
      this.#texts.set(id, body);
    }
    if (delta) body.append(delta);
  }

  #tool(id: string) {
    let tool = this.#tools.get(id);
    if (!tool) {
      const argsEl = h("pre", { class: "args" });
      const el = h("details", { class: "tool", open: true }, h("summary", {}, "Tool call"), argsEl);
      tool = { args: "", argsEl, el };
      this.#tools.set(id, tool);
      this.root.append(el);
    }
    return tool;
  }

  #note(text: string, kind = "note"): void {
    this.root.append(h("p", { class: kind }, text));
  }
}

function usageTable(u: Usage | undefined): HTMLElement {
  if (!u) return h("p", { class: "muted" }, "No usage reported.");
  const rows: [string, string][] = [
    ["Input tokens", String(u.inputTokens)],
    ["Output tokens", String(u.outputTokens)],
    ["Cache read", String(u.cacheReadTokens)],
    ["Cache write", String(u.cacheWriteTokens)],
    ["Reasoning tokens", String(u.reasoningTokens)],
    ["Cost", u.costUsd !== undefined ? `$${u.costUsd.toFixed(4)}` : "not reported"],
  ];
  return h("dl", { class: "usage" }, ...rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

/** A unified diff, each line marked added, removed or context. */
function diff(text: string): HTMLElement {
  const pre = h("pre", { class: "diff-body" });
  for (const line of text.replace(/\n$/, "").split("\n")) {
    const kind = line.startsWith("+++") || line.startsWith("---") ? "meta"
      : line.startsWith("@@") ? "hunk"
      : line.startsWith("+") ? "add"
      : line.startsWith("-") ? "del"
      : "ctx";
    // Block lines: copying the diff still gives one line per line.
    pre.append(h("span", { class: `line ${kind}` }, line || " "));
  }
  return pre;
}

