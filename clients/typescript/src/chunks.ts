// A run's chunks as a discriminated union on `type`, from the wire's
// `sandhold.v1.Chunk` (one message with every field): each member has the
// fields its type uses, and CUSTOM values are parsed JSON.

import { ChunkType, type Chunk, type Usage } from "./gen/sandhold/v1/events_pb.js";

interface Base {
  runId: string;
  threadId: string;
  timestampMs: number;
}

export type RunStartedChunk = Base & { type: "RUN_STARTED" };
export type TextChunk = Base &
  (
    | { type: "TEXT_MESSAGE_START"; messageId: string }
    | { type: "TEXT_MESSAGE_CONTENT"; messageId: string; delta: string }
    | { type: "TEXT_MESSAGE_END"; messageId: string }
  );
export type ReasoningChunk = Base &
  (
    | { type: "REASONING_START"; messageId: string }
    | { type: "REASONING_CONTENT"; messageId: string; delta: string }
    | { type: "REASONING_END"; messageId: string }
  );
export type ToolCallChunk = Base &
  (
    | { type: "TOOL_CALL_START"; toolCallId: string; toolName: string; parentMessageId: string }
    | { type: "TOOL_CALL_ARGS"; toolCallId: string; delta: string }
    | { type: "TOOL_CALL_END"; toolCallId: string }
    | { type: "TOOL_CALL_RESULT"; toolCallId: string; content: string; isError: boolean; exitCode?: number }
  );
export type RunFinishedChunk = Base & { type: "RUN_FINISHED"; finishReason: string; usage?: Usage };
export type RunErrorChunk = Base & { type: "RUN_ERROR"; errorMessage: string; errorCode: string };
/** An event outside the fixed set; `value` is its JSON value parsed (see the `is*` guards). */
export type CustomChunk = Base & { type: "CUSTOM"; name: string; value: unknown };
/** A type this client does not know (a newer server); `raw` is the wire message. */
export type UnknownChunk = Base & { type: "UNKNOWN"; raw: Chunk };

export type TypedChunk =
  | RunStartedChunk
  | TextChunk
  | ReasoningChunk
  | ToolCallChunk
  | RunFinishedChunk
  | RunErrorChunk
  | CustomChunk
  | UnknownChunk;

/** `sandbox.file`: a file event while the run was active. */
export interface SandboxFileEvent {
  type: "create" | "change" | "delete";
  path: string;
  timestamp: number;
}
/** `file.changed`: the workspace's git diff of one file after the run. */
export interface FileChanged {
  path: string;
  diff: string;
}
/** `harness.warning`: a malformed journal line or a CLI warning; the run goes on. */
export interface HarnessWarning {
  message: string;
  line?: string;
}

export const isSandboxFile = (c: TypedChunk): c is CustomChunk & { value: SandboxFileEvent } =>
  c.type === "CUSTOM" && c.name === "sandbox.file" && hasString(c.value, "path");
export const isFileChanged = (c: TypedChunk): c is CustomChunk & { value: FileChanged } =>
  c.type === "CUSTOM" && c.name === "file.changed" && hasString(c.value, "path") && hasString(c.value, "diff");
export const isHarnessWarning = (c: TypedChunk): c is CustomChunk & { value: HarnessWarning } =>
  c.type === "CUSTOM" && c.name === "harness.warning" && hasString(c.value, "message");

/** Whether a chunk ends its run. */
export const isTerminal = (c: TypedChunk): c is RunFinishedChunk | RunErrorChunk =>
  c.type === "RUN_FINISHED" || c.type === "RUN_ERROR";

function hasString(v: unknown, key: string): boolean {
  return typeof v === "object" && v !== null && typeof (v as Record<string, unknown>)[key] === "string";
}

/** The typed form of a wire chunk. */
export function typedChunk(c: Chunk): TypedChunk {
  const base: Base = { runId: c.runId, threadId: c.threadId, timestampMs: Number(c.timestampMs) };
  switch (c.type) {
    case ChunkType.RUN_STARTED:
      return { ...base, type: "RUN_STARTED" };
    case ChunkType.TEXT_MESSAGE_START:
      return { ...base, type: "TEXT_MESSAGE_START", messageId: c.messageId };
    case ChunkType.TEXT_MESSAGE_CONTENT:
      return { ...base, type: "TEXT_MESSAGE_CONTENT", messageId: c.messageId, delta: c.delta };
    case ChunkType.TEXT_MESSAGE_END:
      return { ...base, type: "TEXT_MESSAGE_END", messageId: c.messageId };
    case ChunkType.REASONING_START:
      return { ...base, type: "REASONING_START", messageId: c.messageId };
    case ChunkType.REASONING_CONTENT:
      return { ...base, type: "REASONING_CONTENT", messageId: c.messageId, delta: c.delta };
    case ChunkType.REASONING_END:
      return { ...base, type: "REASONING_END", messageId: c.messageId };
    case ChunkType.TOOL_CALL_START:
      return {
        ...base,
        type: "TOOL_CALL_START",
        toolCallId: c.toolCallId,
        toolName: c.toolName,
        parentMessageId: c.parentMessageId,
      };
    case ChunkType.TOOL_CALL_ARGS:
      return { ...base, type: "TOOL_CALL_ARGS", toolCallId: c.toolCallId, delta: c.delta };
    case ChunkType.TOOL_CALL_END:
      return { ...base, type: "TOOL_CALL_END", toolCallId: c.toolCallId };
    case ChunkType.TOOL_CALL_RESULT:
      return {
        ...base,
        type: "TOOL_CALL_RESULT",
        toolCallId: c.toolCallId,
        content: c.content,
        isError: c.isError,
        ...(c.exitCode !== undefined ? { exitCode: c.exitCode } : {}),
      };
    case ChunkType.RUN_FINISHED:
      return { ...base, type: "RUN_FINISHED", finishReason: c.finishReason, usage: c.usage };
    case ChunkType.RUN_ERROR:
      return { ...base, type: "RUN_ERROR", errorMessage: c.errorMessage, errorCode: c.errorCode };
    case ChunkType.CUSTOM:
      return { ...base, type: "CUSTOM", name: c.name, value: parseJson(c.valueJson) };
    default:
      return { ...base, type: "UNKNOWN", raw: c };
  }
}

function parseJson(text: string): unknown {
  if (text === "") return null;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}
