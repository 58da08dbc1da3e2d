// The thin hand-written layer over the generated services: one client for
// the four public services over gRPC-Web, with runs as async iterables that
// resume after the last offset received when the connection drops.

import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import { AdminService, type GetServerInfoResponse } from "./gen/sandhold/v1/admin_pb.js";
import {
  RunService,
  StartRunRequestSchema,
  type AttemptSet,
  type Run,
  type RunEvent,
  type StartRunRequest,
  type RunRequest,
} from "./gen/sandhold/v1/run_pb.js";
import type { EnsureProgress } from "./gen/sandhold/v1/sandbox_pb.js";
import { SandboxService } from "./gen/sandhold/v1/sandbox_pb.js";
import { SnapshotService } from "./gen/sandhold/v1/snapshot_pb.js";
import { isTerminal, typedChunk, type TypedChunk } from "./chunks.js";
import { SandholdError } from "./errors.js";
import { traceContext, type OtelApi } from "./tracing.js";

export interface SandholdClientOptions {
  /** The server, e.g. `http://127.0.0.1:7443`; in a page of the server's own console, `location.origin`. */
  baseUrl: string;
  /** An API token, or a function asked before each call; none on a single-user server. */
  token?: string | (() => string | undefined);
  /** Another transport (e.g. `@connectrpc/connect-node`'s); default gRPC-Web over `fetch`. */
  transport?: Transport;
  /** The `fetch` of the default transport. */
  fetch?: typeof globalThis.fetch;
  /** Waits between attempts to resume a run's stream: from `initialDelayMs`, doubling to `maxDelayMs`. */
  resume?: { initialDelayMs?: number; maxDelayMs?: number; maxAttempts?: number };
  /**
   * The OpenTelemetry API whose active context each call carries (`traceparent`); default: `@opentelemetry/api`
   * when installed; `false`: none. Applies to the default transport.
   */
  otel?: OtelApi | false;
}

/** One item of a run's stream. */
export type RunItem =
  | { kind: "progress"; progress: EnsureProgress }
  | { kind: "chunk"; offset: string; chunk: TypedChunk };

export interface AttachOptions {
  /** Resume after this offset (one a RunItem carried); default: from the start. */
  afterOffset?: string;
  /** When set, must be the run's thread. */
  threadId?: string;
  signal?: AbortSignal;
  /** Called before each attempt to resume after a dropped connection. */
  onReconnect?: (info: { attempt: number; afterOffset: string; error: SandholdError }) => void;
}

export type StartOptions = Omit<AttachOptions, "afterOffset" | "threadId">;

export type StartRunInit = MessageInitShape<typeof StartRunRequestSchema>;

/**
 * A run's stream. Iterate it with `for await`; `lastOffset` is the offset
 * of the last chunk it delivered (attach after it to continue elsewhere).
 */
export interface RunStream extends AsyncIterable<RunItem> {
  readonly runId: string;
  readonly lastOffset: string;
}

/** Codes of a stream cut by the network rather than answered by the server. */
const TRANSIENT = new Set<Code>([Code.Unavailable, Code.Unknown, Code.Internal, Code.DeadlineExceeded, Code.Aborted]);

/**
 * Worth attaching again: the connection broke (no Sandhold reason), or the
 * server said UNAVAILABLE (starting, stopping, a dependency down). A
 * Sandhold answer with any other reason is final.
 */
function resumable(error: SandholdError): boolean {
  return error.reason === "UNAVAILABLE" || (error.reason === "TRANSPORT" && TRANSIENT.has(error.code));
}

export class SandholdClient {
  readonly runs: Client<typeof RunService>;
  readonly sandboxes: Client<typeof SandboxService>;
  readonly snapshots: Client<typeof SnapshotService>;
  readonly admin: Client<typeof AdminService>;
  readonly #resume: Required<NonNullable<SandholdClientOptions["resume"]>>;

  constructor(options: SandholdClientOptions) {
    const token = options.token;
    const auth: Interceptor = (next) => (req) => {
      const value = typeof token === "function" ? token() : token;
      if (value) req.header.set("authorization", `Bearer ${value}`);
      return next(req);
    };
    const transport =
      options.transport ??
      createGrpcWebTransport({
        baseUrl: options.baseUrl,
        interceptors: [auth, traceContext(options.otel)],
        ...(options.fetch ? { fetch: options.fetch } : {}),
      });
    this.runs = createClient(RunService, transport);
    this.sandboxes = createClient(SandboxService, transport);
    this.snapshots = createClient(SnapshotService, transport);
    this.admin = createClient(AdminService, transport);
    this.#resume = {
      initialDelayMs: options.resume?.initialDelayMs ?? 100,
      maxDelayMs: options.resume?.maxDelayMs ?? 2_000,
      maxAttempts: options.resume?.maxAttempts ?? Number.POSITIVE_INFINITY,
    };
  }

  /** Who the caller is (its tenant) and what the server is. */
  async serverInfo(): Promise<GetServerInfoResponse> {
    return wrap(() => this.admin.getServerInfo({}));
  }

  /**
   * Start a run and stream it. A durable run (`durable: true`) resumes
   * after a dropped connection through AttachRun from the last offset
   * received, so every chunk arrives exactly once; it gets a run id if it
   * has none. A run that is not durable ends with its connection.
   */
  startRun(init: StartRunInit, options: StartOptions = {}): RunStream {
    const request: StartRunRequest = create(StartRunRequestSchema, init);
    if (request.durable && request.runId === "") request.runId = newRunId();
    let lastOffset = "";
    let sawChunk = false;
    const self = this;
    async function* items(): AsyncGenerator<RunItem> {
      const abort = linkedAbort(options.signal);
      try {
        try {
          for await (const event of self.runs.startRun(request, { signal: abort.signal })) {
            const item = toItem(event);
            if (!item) continue;
            if (item.kind === "chunk") {
              lastOffset = item.offset;
              sawChunk = true;
            }
            yield item;
            if (item.kind === "chunk" && isTerminal(item.chunk)) return;
          }
          return;
        } catch (e) {
          const error = SandholdError.from(e);
          if (!request.durable || options.signal?.aborted || !resumable(error)) throw error;
          options.onReconnect?.({ attempt: 1, afterOffset: lastOffset, error });
        }
        // The connection dropped: the run goes on (durable runs detach);
        // continue after the last chunk delivered.
        const rest = self.#follow(request.runId, { ...options, afterOffset: lastOffset, signal: abort.signal }, !sawChunk);
        for await (const item of rest) {
          if (item.kind === "chunk") lastOffset = item.offset;
          yield item;
        }
      } finally {
        abort.abort();
      }
    }
    const generator = items();
    return {
      runId: request.runId,
      get lastOffset() {
        return lastOffset;
      },
      [Symbol.asyncIterator]: () => generator,
    };
  }

  /**
   * Replay a run's log after `afterOffset`, then follow it until the run
   * ends; a dropped connection is resumed after the last chunk delivered.
   */
  attachRun(runId: string, options: AttachOptions = {}): RunStream {
    let lastOffset = options.afterOffset ?? "";
    const generator = (async function* (self: SandholdClient): AsyncGenerator<RunItem> {
      for await (const item of self.#follow(runId, options, false)) {
        if (item.kind === "chunk") lastOffset = item.offset;
        yield item;
      }
    })(this);
    return {
      runId,
      get lastOffset() {
        return lastOffset;
      },
      [Symbol.asyncIterator]: () => generator,
    };
  }

  async *#follow(runId: string, options: AttachOptions, mayNotExistYet: boolean): AsyncGenerator<RunItem> {
    let after = options.afterOffset ?? "";
    let attempt = 0;
    let delay = this.#resume.initialDelayMs;
    for (;;) {
      try {
        const stream = this.runs.attachRun(
          { runId, afterOffset: after, threadId: options.threadId ?? "" },
          { signal: options.signal },
        );
        for await (const event of stream) {
          const item = toItem(event);
          if (!item || item.kind !== "chunk") continue;
          after = item.offset;
          attempt = 0;
          delay = this.#resume.initialDelayMs;
          yield item;
          if (isTerminal(item.chunk)) return;
        }
        return;
      } catch (e) {
        const error = SandholdError.from(e);
        // A StartRun cut before the server recorded the run: its id is not
        // known yet, for a moment.
        const early = mayNotExistYet && after === "" && error.reason === "NOT_FOUND";
        if (options.signal?.aborted || (!resumable(error) && !early)) throw error;
        attempt += 1;
        if (attempt > this.#resume.maxAttempts) throw error;
        options.onReconnect?.({ attempt, afterOffset: after, error });
        await sleep(delay, options.signal);
        delay = Math.min(delay * 2, this.#resume.maxDelayMs);
      }
    }
  }

  /** Cancel a run: its CLI is killed, its sandbox destroyed, its record `aborted`. */
  async cancelRun(runId: string): Promise<Run | undefined> {
    return wrap(async () => (await this.runs.cancelRun({ runId })).run);
  }

  /**
   * Answer a permission or network request of a run (the first answer, from
   * any client, wins). `scope`, for a network request's allow: "once" (this
   * connection), "run" (the same host and port for the rest of the run) or
   * "thread" (every run of the thread in this sandbox).
   */
  async respondToRequest(
    runId: string,
    requestId: string,
    answer: { allow: boolean; message?: string; scope?: "once" | "run" | "thread" },
  ): Promise<RunRequest | undefined> {
    const permission = { allow: answer.allow, message: answer.message ?? "", always: false, scope: answer.scope ?? "" };
    return wrap(
      async () =>
        (await this.runs.respondToRequest({ runId, requestId, answer: { case: "permission", value: permission } })).request,
    );
  }

  /** Remove an ended run with its log and requests (a run still going is refused: cancel it first). */
  async deleteRun(runId: string): Promise<void> {
    await wrap(async () => this.runs.deleteRun({ runId }));
  }

  async getRun(runId: string): Promise<Run | undefined> {
    return wrap(async () => (await this.runs.getRun({ runId })).run);
  }

  /** Runs newest first; of one thread when `threadId` is set. */
  async listRuns(options: { threadId?: string; limit?: number } = {}): Promise<Run[]> {
    return wrap(async () => (await this.runs.listRuns({ threadId: options.threadId ?? "", limit: options.limit ?? 0 })).runs);
  }

  /**
   * Run one task several times: `run` is what every attempt runs (its
   * `runId` is ignored), `count` how many, or `attempts` a mix of
   * `{ harness, model }`. Each attempt is a durable run in a fork of the
   * thread's latest checkpoint; follow it with `attach(attempt.runId)`.
   */
  async startAttempts(
    run: StartRunInit,
    options: { count?: number; attempts?: { harness?: string; model?: string }[] } = {},
  ): Promise<AttemptSet | undefined> {
    const request = { run: { durable: true, ...run }, count: options.count ?? 0, attempts: options.attempts ?? [] };
    return wrap(async () => (await this.runs.startAttempts(request)).set);
  }

  /** A set of attempts: each attempt's status and, once evaluated, its diff, test exit code, tokens and duration. */
  async getAttemptSet(attemptSetId: string): Promise<AttemptSet | undefined> {
    return wrap(async () => (await this.runs.getAttemptSet({ attemptSetId })).set);
  }

  /** An evaluated attempt's changes as a unified diff. */
  async getAttemptPatch(attemptSetId: string, runId: string): Promise<string> {
    return wrap(async () => (await this.runs.getAttemptPatch({ attemptSetId, runId })).patch);
  }

  /** Make an evaluated attempt the thread's: its files and conversation are what the thread's next run continues. */
  async promoteAttempt(attemptSetId: string, runId: string): Promise<AttemptSet | undefined> {
    return wrap(async () => (await this.runs.promoteAttempt({ attemptSetId, runId })).set);
  }
}

/** `fn`'s result; its failure as a SandholdError. */
export async function wrap<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    throw SandholdError.from(e);
  }
}

function toItem(event: RunEvent): RunItem | undefined {
  switch (event.event.case) {
    case "chunk": {
      const { offset, chunk } = event.event.value;
      return chunk ? { kind: "chunk", offset, chunk: typedChunk(chunk) } : undefined;
    }
    case "progress":
      return { kind: "progress", progress: event.event.value };
    default:
      return undefined;
  }
}

/**
 * A fresh run id: `run-` and 32 random hex digits. Web Crypto when there is
 * one (Node 18 has no global `crypto`, and `randomUUID` needs a secure
 * context in browsers; `getRandomValues` does not).
 */
function newRunId(): string {
  const bytes = new Uint8Array(16);
  if (globalThis.crypto?.getRandomValues) globalThis.crypto.getRandomValues(bytes);
  else for (let i = 0; i < bytes.length; i++) bytes[i] = Math.floor(Math.random() * 256);
  return `run-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

/** An AbortController that also aborts with `outer`. */
function linkedAbort(outer?: AbortSignal): AbortController {
  const inner = new AbortController();
  if (outer?.aborted) inner.abort(outer.reason);
  else outer?.addEventListener("abort", () => inner.abort(outer.reason), { once: true });
  return inner;
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
