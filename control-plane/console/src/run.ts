// One run, live, at /runs/<run_id>: what it was asked (command, prompt),
// its chunks as a conversation with their times and a timeline, followed
// from the log (the client resumes after the last offset received when the
// connection drops), its status, its failure in words, and Cancel (behind
// a confirmation) while it runs. A request the run waits on (a permission,
// a connection under a network ask rule) shows Allow and Deny (a network
// one also Allow for the run) until it is answered, here or anywhere.

import {
  ChunkType,
  isFileChanged,
  isHarnessWarning,
  isSandboxFile,
  RunStatus,
  SandholdError,
  type Run,
  type TypedChunk,
  type Usage,
} from "@sandhold/client";
import { clock, confirmDialog, duration, h, offset, problem, shellLine, when } from "./dom.js";
import { markdown } from "./markdown.js";
import { statusBadge } from "./runs.js";
import { client } from "./session.js";

export function renderRun(main: HTMLElement, runId: string, signal: AbortSignal): void {
  const status = h("span", { id: "run-status", "aria-live": "polite" });
  const facts = h("dl", { class: "facts" });
  const asked = h("section", { id: "asked", class: "asked", "aria-label": "What the run was asked" });
  const failure = h("div", { id: "failure" });
  const cancel = h("button", { id: "cancel", type: "button", class: "danger", hidden: true }, "Cancel run");
  const connection = h("p", { id: "connection", class: "muted", "aria-live": "polite" });
  const log = h("div", { id: "conversation", class: "conversation", role: "log", "aria-label": "Conversation" });
  const timeline = h("ol", { class: "timeline-list" });
  const timelineCount = h("span", {}, "Timeline");
  main.replaceChildren(
    h("h1", { class: "run-title" }, "Run ", h("code", {}, runId)),
    h("div", { class: "run-head" }, h("span", {}, "Status: ", status), cancel),
    failure,
    facts,
    asked,
    h("details", { id: "timeline", class: "timeline" }, h("summary", {}, timelineCount), timeline),
    connection,
    h("h2", { class: "visually-hidden" }, "Events"),
    log,
  );

  let terminal = false;
  let shownAsk = false;
  const show = (run: Run) => {
    status.replaceChildren(statusBadge(run));
    // Interrupted is not an end: a replica takes the run over.
    terminal = [RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.ABORTED].includes(run.status);
    // Cancel exists only while there is something to cancel.
    if (terminal) {
      if (cancel.isConnected) {
        const hadFocus = document.activeElement === cancel;
        cancel.remove();
        if (hadFocus) main.focus();
      }
    } else {
      cancel.hidden = false;
      cancel.disabled = run.cancelRequested;
    }
    failure.replaceChildren(run.error?.code ? failureNote(run.error.code, run.error.message, run.status) : "");
    facts.replaceChildren(
      ...fact("Thread", h("a", { href: `/?thread=${encodeURIComponent(run.threadId)}` }, run.threadId)),
      ...fact("Harness", run.harness),
      ...fact("Started", when(run.startedAtMs)),
      ...fact("Duration", duration(run.startedAtMs, run.finishedAtMs)),
      ...(run.sandboxId ? fact("Sandbox", h("a", { href: `/sandboxes/${encodeURIComponent(run.sandboxId)}` }, run.sandboxId.slice(0, 16))) : []),
      ...(hasUsage(run.usage) ? fact("Tokens", usageLine(run.usage)) : []),
    );
    if (!shownAsk) {
      shownAsk = true;
      asked.replaceChildren(...askedOf(run));
    }
    view.started ??= Number(run.startedAtMs);
  };
  const poll = async () => {
    try {
      const run = await client.getRun(runId);
      if (run) show(run);
    } catch (e) {
      if (e instanceof SandholdError && e.reason === "NOT_FOUND") {
        main.replaceChildren(h("h1", {}, "Run ", h("code", {}, runId)), problem("No such run."), h("p", {}, h("a", { href: "/" }, "All runs")));
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

  cancel.addEventListener("click", async () => {
    const sure = await confirmDialog({
      id: "cancel-dialog",
      title: "Cancel this run?",
      body: "Its command is stopped at once and its sandbox destroyed. This cannot be undone.",
      keep: "Keep running",
      confirm: "Cancel run",
    });
    if (!sure) return;
    cancel.disabled = true;
    try {
      const run = await client.cancelRun(runId);
      if (run) show(run);
    } catch (e) {
      connection.replaceChildren(problem(`Cancel failed: ${(e as Error).message}`));
      cancel.disabled = false;
    }
  });

  const view = new Conversation(log, timeline, timelineCount, runId);
  void poll();
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

/** What a run was asked: its command and its prompt. */
function askedOf(run: Run): HTMLElement[] {
  const parts: HTMLElement[] = [];
  if (run.command.length) {
    parts.push(h("h2", {}, "Command"), h("pre", { class: "command" }, h("code", {}, shellLine(run.command))));
  }
  if (run.prompt) {
    parts.push(h("h2", {}, "Prompt"), h("div", { class: "prompt" }, markdown(run.prompt)));
    if (run.promptTruncated) parts.push(h("p", { class: "muted" }, "(The prompt was longer; its first 16 KiB are shown.)"));
  }
  if (!parts.length) parts.push(h("p", { class: "muted" }, "This run's record does not say what it was asked (it predates that record)."));
  return parts;
}

/**
 * What a failure code means, for the heading of a failed or cancelled run:
 * Sandhold's codes (`CANCELLED`, ...), and the ones harnesses end with
 * (`exit_code`, Claude Code's result subtypes, Codex's `turn_failed`).
 */
const FAILURES: Record<string, string> = {
  CANCELLED: "Cancelled",
  CLIENT_DISCONNECTED: "Stopped: its client went away",
  exit_code: "The command failed",
  error_max_turns: "It used all its turns",
  error_during_execution: "The agent failed while working",
  turn_failed: "The agent's turn failed",
  MODEL_UNREACHABLE: "The model could not be reached",
  BUDGET_EXCEEDED: "Its token budget was used up",
  UNAVAILABLE: "The sandbox could not be reached",
  DEADLINE_EXCEEDED: "Timed out",
  JOURNAL_FULL: "Its output outgrew the journal",
  LINE_TOO_LONG: "It printed a line too long to read",
  SECRETS_MISSING: "Secrets it needs were not given",
  RESOURCE_EXHAUSTED: "Over a quota",
  STORAGE_FULL: "The server's storage is full",
  INTERNAL: "Sandhold failed (an internal error)",
};

/** A failure's heading in words; the code stays, small, for searching and reports. */
export function failureTitle(code: string): string {
  return FAILURES[code] ?? "The run failed";
}

function failureNote(code: string, message: string, status: RunStatus): HTMLElement {
  return h(
    "div",
    { class: `failure ${status === RunStatus.ABORTED ? "aborted" : "failed"}` },
    h("p", { class: "failure-title" }, failureTitle(code)),
    message ? h("p", {}, message) : "",
    h("p", { class: "muted" }, "Code ", h("code", {}, code)),
  );
}

function hasUsage(u: Usage | undefined): u is Usage {
  return !!u && (u.inputTokens > 0n || u.outputTokens > 0n || u.costUsd !== undefined);
}

function usageLine(u: Usage): string {
  const n = (v: bigint) => Number(v).toLocaleString("en");
  return `${n(u.inputTokens)} in · ${n(u.outputTokens)} out${u.costUsd !== undefined ? ` · $${u.costUsd.toFixed(4)}` : ""}`;
}

function fact(name: string, value: Node | string): HTMLElement[] {
  return [h("dt", {}, name), h("dd", {}, value)];
}

/** Kinds of events the timeline lists (file events and notes stay out of it). */
type Marked = "message" | "reasoning" | "tool" | "diff" | "warning" | "end" | "start";

/**
 * The chunks of a run as a conversation, updated in place as they arrive:
 * each event with its clock time, agent text as Markdown, and a timeline
 * of the main events (time after the start, linked to the event). The page
 * itself scrolls; it follows new events while the reader is at its end.
 */
class Conversation {
  readonly #texts = new Map<string, { body: HTMLElement; text: string; kind: "message" | "reasoning"; pending: boolean }>();
  readonly #tools = new Map<string, { args: string; argsEl: HTMLElement; el: HTMLElement }>();
  /** Requests shown, by id: where their answer goes. */
  readonly #requests = new Map<string, HTMLElement>();
  #events = 0;
  #marks = 0;
  started: number | undefined;

  constructor(
    readonly root: HTMLElement,
    readonly timeline: HTMLElement,
    readonly timelineCount: HTMLElement,
    readonly runId: string,
  ) {}

  add(c: TypedChunk): void {
    const page = document.scrollingElement ?? document.documentElement;
    const stick = page.scrollHeight - page.scrollTop - innerHeight < 80;
    this.#at = Number(c.timestampMs);
    this.#render(c);
    if (stick) page.scrollTop = page.scrollHeight;
  }

  #at = 0;

  /** An event block: its time first, then what it shows; listed in the timeline when `mark`ed. */
  #block<T extends HTMLElement>(el: T, mark?: { kind: Marked; label: string }): T {
    const id = `event-${++this.#events}`;
    el.id = id;
    el.dataset.ts = String(this.#at);
    if (this.#at) {
      // In a <details>, inside its summary: what precedes the summary folds away.
      const summary = el instanceof HTMLDetailsElement ? el.querySelector("summary") : null;
      if (summary) summary.append(" ", h("span", { class: "ts" }, clock(this.#at)));
      else el.prepend(h("span", { class: "ts" }, clock(this.#at)));
    }
    this.root.append(el);
    if (mark) this.#mark(id, mark.kind, mark.label);
    return el;
  }

  #mark(id: string, kind: Marked, label: string): void {
    this.started ??= this.#at;
    this.#marks += 1;
    this.timelineCount.textContent = `Timeline · ${this.#marks} event${this.#marks === 1 ? "" : "s"}`;
    this.timeline.append(
      h(
        "li",
        { class: `mark mark-${kind}` },
        h("span", { class: "offset" }, this.#at ? offset(this.started, this.#at) : ""),
        " ",
        h("a", { href: `#${id}`, onclick: (e: Event) => jumpTo(e, id) }, label),
      ),
    );
  }

  #render(c: TypedChunk): void {
    switch (c.type) {
      case "RUN_STARTED":
        this.#block(h("p", { class: "note" }, "Run started"), { kind: "start", label: "Started" });
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
        const el = this.#block(
          h(
            "details",
            { class: "tool", open: true },
            h("summary", {}, "Tool call ", h("strong", {}, c.toolName)),
            h("h3", { class: "label" }, "Arguments"),
            argsEl,
          ),
          { kind: "tool", label: `Tool call ${c.toolName}` },
        );
        this.#tools.set(c.toolCallId, { args: "", argsEl, el });
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
          h("h3", { class: "label" }, c.isError ? "Result (error)" : "Result", c.exitCode !== undefined ? ` · exit ${c.exitCode}` : "", this.#at ? " · " : "", this.#at ? clock(this.#at) : ""),
          h("pre", { class: "result" }, c.content),
        );
        return;
      }
      case "RUN_FINISHED":
        this.#block(
          h("section", { class: "end finished" }, h("h2", {}, `Finished (${c.finishReason || "stop"})`), usageTable(c.usage)),
          { kind: "end", label: "Finished" },
        );
        return;
      case "RUN_ERROR":
        this.#block(
          h(
            "section",
            { class: "end errored", role: "alert" },
            h("h2", {}, `Ended: ${failureTitle(c.errorCode)}`),
            c.errorMessage ? h("p", {}, c.errorMessage) : "",
            h("p", { class: "muted" }, "Code ", h("code", {}, c.errorCode || "none")),
          ),
          { kind: "end", label: `Ended: ${failureTitle(c.errorCode)}` },
        );
        return;
      case "CUSTOM":
        this.#custom(c);
        return;
      case "UNKNOWN":
        if (c.raw.type === ChunkType.PERMISSION_REQUESTED) return this.#asked(c.raw);
        if (c.raw.type === ChunkType.PERMISSION_RESOLVED) return this.#answered(c.raw);
        this.#note(`(an event this console does not know: ${ChunkType[c.raw.type] ?? c.raw.type})`);
        return;
    }
  }

  /** A request the run waits on, with its answers as buttons. */
  #asked(c: { toolName: string; request?: { requestId: string; kind: string; rule: string; inputJson: string } }): void {
    const r = c.request;
    if (!r || this.#requests.has(r.requestId)) return;
    let input: Record<string, unknown> = {};
    try {
      input = JSON.parse(r.inputJson) as Record<string, unknown>;
    } catch {
      // shown as it came
    }
    const network = r.kind === "network";
    const what = network
      ? `${String(input.method || "CONNECT")} ${String(input.host)}:${String(input.port)}${String(input.path || "")}`
      : c.toolName;
    const title = network ? "Network request" : "Permission request";
    const outcome = h("p", { class: "request-outcome", "aria-live": "polite" });
    const answer = async (allow: boolean, scope?: "once" | "run") => {
      for (const b of buttons.querySelectorAll("button")) (b as HTMLButtonElement).disabled = true;
      try {
        await client.respondToRequest(this.runId, r.requestId, { allow, ...(scope ? { scope } : {}) });
      } catch (e) {
        outcome.replaceChildren(problem(`Answer failed: ${(e as Error).message}`));
        for (const b of buttons.querySelectorAll("button")) (b as HTMLButtonElement).disabled = false;
      }
    };
    const buttons = h(
      "div",
      { class: "request-answers" },
      h("button", { type: "button", class: "allow", onclick: () => void answer(true, network ? "once" : undefined) }, "Allow"),
      ...(network ? [h("button", { type: "button", class: "allow-run", onclick: () => void answer(true, "run") }, "Allow for the run")] : []),
      h("button", { type: "button", class: "danger deny", onclick: () => void answer(false) }, "Deny"),
    );
    const el = this.#block(
      h(
        "section",
        { class: "request", "data-request": r.requestId, "aria-label": `${title}: ${what}` },
        h("h3", {}, title, " ", h("code", {}, what)),
        r.rule ? h("p", { class: "muted" }, "Rule ", h("code", {}, r.rule)) : "",
        network ? "" : h("pre", { class: "args" }, JSON.stringify(input, null, 2)),
        buttons,
        outcome,
      ),
      { kind: "warning", label: `${title} ${what}` },
    );
    this.#requests.set(r.requestId, el);
  }

  /** A request's answer: its buttons give way to what was decided. */
  #answered(c: { request?: { requestId: string; allowed: boolean; answeredBy: string; scope: string } }): void {
    const r = c.request;
    const el = r && this.#requests.get(r.requestId);
    if (!r || !el) return;
    el.querySelector(".request-answers")?.remove();
    const scope = r.allowed && r.scope ? ` (${r.scope})` : "";
    el.querySelector(".request-outcome")?.replaceChildren(`${r.allowed ? "Allowed" : "Denied"}${scope} by ${r.answeredBy}`);
    el.classList.add(r.allowed ? "allowed" : "denied");
  }

  #custom(c: TypedChunk & { type: "CUSTOM" }): void {
    if (isSandboxFile(c)) {
      this.#note(`${c.value.type} ${c.value.path}`, "file-event");
    } else if (isFileChanged(c)) {
      this.#block(h("section", { class: "diff" }, h("h3", {}, "Changed ", h("code", {}, c.value.path)), diff(c.value.diff)), {
        kind: "diff",
        label: `Changed ${c.value.path}`,
      });
    } else if (isHarnessWarning(c)) {
      this.#block(h("p", { class: "warning" }, `Warning: ${c.value.message}`), { kind: "warning", label: "Warning" });
    } else if (c.name === "run.accepted") {
      this.#block(h("p", { class: "note" }, "Run accepted"), { kind: "start", label: "Accepted" });
    } else if (c.name.endsWith(".session-id")) {
      const id = (c.value as { session_id?: string } | null)?.session_id ?? "";
      this.#note(`Session ${id}`);
    } else {
      this.#note(`${c.name}: ${JSON.stringify(c.value)}`);
    }
  }

  #text(id: string, kind: "message" | "reasoning", delta: string): void {
    let text = this.#texts.get(id);
    if (!text) {
      const body = h("div", { class: "body" });
      this.#block(
        kind === "reasoning"
          ? h("details", { class: "reasoning" }, h("summary", {}, "Reasoning"), body)
          : h("div", { class: "message" }, body),
        { kind, label: kind === "reasoning" ? "Reasoning" : "Message" },
      );
      text = { body, text: "", kind, pending: false };
      this.#texts.set(id, text);
    }
    if (!delta) return;
    text.text += delta;
    this.#paint(text);
  }

  /** Render a message's Markdown again with what has arrived (at most once a frame). */
  #paint(text: { body: HTMLElement; text: string; kind: "message" | "reasoning"; pending: boolean }): void {
    if (text.pending) return;
    text.pending = true;
    const draw = () => {
      text.pending = false;
      text.body.replaceChildren(markdown(text.text));
    };
    // A hidden tab gets no animation frames: draw at once there.
    if (document.hidden) draw();
    else requestAnimationFrame(draw);
  }

  #tool(id: string) {
    let tool = this.#tools.get(id);
    if (!tool) {
      const argsEl = h("pre", { class: "args" });
      const el = this.#block(h("details", { class: "tool", open: true }, h("summary", {}, "Tool call"), argsEl), { kind: "tool", label: "Tool call" });
      tool = { args: "", argsEl, el };
      this.#tools.set(id, tool);
    }
    return tool;
  }

  #note(text: string, kind = "note"): void {
    this.#block(h("p", { class: kind }, text));
  }
}

/** Scroll to an event of the timeline and give it the focus, without leaving the page's address. */
function jumpTo(e: Event, id: string): void {
  e.preventDefault();
  const el = document.getElementById(id);
  if (!el) return;
  el.tabIndex = -1;
  el.scrollIntoView({ block: "start" });
  el.focus({ preventScroll: true });
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

