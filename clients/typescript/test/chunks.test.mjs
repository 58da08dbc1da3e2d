// The typed chunk union and the error type, from wire messages (no server).

import assert from "node:assert/strict";
import { test } from "node:test";

import { ConnectError, Code as ConnectCode } from "@connectrpc/connect";
import { create } from "@bufbuild/protobuf";
import { ChunkSchema, ChunkType, isFileChanged, isHarnessWarning, isSandboxFile, isTerminal, SandholdError, typedChunk } from "../dist/index.js";
import { ErrorInfoSchema } from "../dist/gen/google/rpc/error_details_pb.js";

test("each chunk type becomes its member of the union, with only its fields", () => {
  const base = { runId: "r", threadId: "t", timestampMs: 5n };
  const tool = typedChunk(create(ChunkSchema, { ...base, type: ChunkType.TOOL_CALL_RESULT, toolCallId: "c", content: "ok", exitCode: 2 }));
  assert.deepEqual(tool, { runId: "r", threadId: "t", timestampMs: 5, type: "TOOL_CALL_RESULT", toolCallId: "c", content: "ok", isError: false, exitCode: 2 });
  const noExit = typedChunk(create(ChunkSchema, { ...base, type: ChunkType.TOOL_CALL_RESULT, toolCallId: "c" }));
  assert.equal("exitCode" in noExit, false, "absent exit code stays absent");
  assert.equal(typedChunk(create(ChunkSchema, { type: ChunkType.RUN_ERROR, errorCode: "CANCELLED" })).type, "RUN_ERROR");
  assert.equal(isTerminal(typedChunk(create(ChunkSchema, { type: ChunkType.RUN_FINISHED }))), true);
  assert.equal(isTerminal(typedChunk(create(ChunkSchema, { type: ChunkType.TEXT_MESSAGE_END }))), false);
  assert.equal(typedChunk(create(ChunkSchema, { type: 99 })).type, "UNKNOWN", "a newer server's type is kept raw");
});

test("CUSTOM values are parsed JSON, with guards for the well-known names", () => {
  const custom = (name, value) => typedChunk(create(ChunkSchema, { type: ChunkType.CUSTOM, name, valueJson: JSON.stringify(value) }));
  const diff = custom("file.changed", { path: "a.txt", diff: "+x\n" });
  assert.equal(isFileChanged(diff), true);
  assert.deepEqual(diff.value, { path: "a.txt", diff: "+x\n" });
  assert.equal(isSandboxFile(custom("sandbox.file", { type: "create", path: "b", timestamp: 1 })), true);
  assert.equal(isHarnessWarning(custom("harness.warning", { message: "m" })), true);
  assert.equal(isFileChanged(custom("file.changed", { path: 3 })), false, "a malformed value is not narrowed");
  assert.equal(typedChunk(create(ChunkSchema, { type: ChunkType.CUSTOM, name: "x", valueJson: "not json" })).value, "not json");
});

test("SandholdError reads the reason of Sandhold's ErrorInfo only", () => {
  const info = (domain, reason) => ({ desc: ErrorInfoSchema, value: { domain, reason, metadata: { max: "10" } } });
  const ours = SandholdError.from(new ConnectError("full", ConnectCode.ResourceExhausted, undefined, [info("sandhold.dev", "JOURNAL_FULL")]));
  assert.equal(ours.reason, "JOURNAL_FULL");
  assert.equal(ours.code, ConnectCode.ResourceExhausted);
  assert.deepEqual(ours.metadata, { max: "10" });
  const theirs = SandholdError.from(new ConnectError("x", ConnectCode.Internal, undefined, [info("proxy.example", "NOT_FOUND")]));
  assert.equal(theirs.reason, "TRANSPORT", "another domain's reason is not ours");
  assert.equal(SandholdError.from(new TypeError("fetch failed")).reason, "TRANSPORT");
});
