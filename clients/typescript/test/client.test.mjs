// The TypeScript client against a real `sandhold serve` over gRPC-Web.

import assert from "node:assert/strict";
import { test } from "node:test";

import { Code, ERROR_REASONS, ErrorReasonEnum, SandholdClient, SandholdError } from "../dist/index.js";
import { numberedLines, putLocalDefinition, startProxy, startServer } from "./support.mjs";

test("a durable run survives dropped connections: every line exactly once, in order", async (t) => {
  const server = await startServer(t);
  const proxy = await startProxy(t, server.port);
  const client = new SandholdClient({ baseUrl: proxy.url, token: server.token, resume: { initialDelayMs: 50 } });
  await putLocalDefinition(client, "ts-lines");

  const reconnects = [];
  const stream = client.startRun(
    { threadId: "ts-drop", definitionId: "ts-lines", harness: "command", durable: true, options: { command: numberedLines(40, 50) } },
    { onReconnect: (info) => reconnects.push(info) },
  );
  let text = "";
  const offsets = [];
  const types = [];
  for await (const item of stream) {
    if (item.kind !== "chunk") continue;
    offsets.push(item.offset);
    types.push(item.chunk.type);
    if (item.chunk.type === "TEXT_MESSAGE_CONTENT") {
      text += item.chunk.delta;
      // Cut once while StartRun streams, once while the resumed AttachRun does.
      if (proxy.cuts === 0 && text.includes("line-5\n")) proxy.cut();
      if (proxy.cuts === 1 && reconnects.length === 1 && text.includes("line-20\n")) proxy.cut();
    }
  }
  const lines = text.split("\n").filter(Boolean);
  assert.deepEqual(lines, Array.from({ length: 40 }, (_, i) => `line-${i + 1}`));
  assert.equal(proxy.cuts, 2);
  assert.ok(reconnects.length >= 2, `resumed after each cut: ${JSON.stringify(reconnects.map((r) => r.afterOffset))}`);
  assert.equal(new Set(offsets).size, offsets.length, "no offset delivered twice");
  assert.equal(types.at(-1), "RUN_FINISHED");
  assert.equal(types.filter((t) => t === "RUN_STARTED").length, 1);
  assert.equal(stream.lastOffset, offsets.at(-1));

  // The stored log says the same: attaching from the start replays it.
  const replay = [];
  for await (const item of server.client().attachRun(stream.runId)) replay.push(item.offset);
  assert.deepEqual(replay, offsets);
  const run = await client.getRun(stream.runId);
  assert.equal(run.runId, stream.runId);
});

test("attachRun resumes after the offset it is given", async (t) => {
  const server = await startServer(t);
  const client = server.client();
  await putLocalDefinition(client, "ts-lines");
  const start = client.startRun({
    threadId: "ts-after", definitionId: "ts-lines", harness: "command", durable: true, options: { command: numberedLines(6, 10) },
  });
  const all = [];
  for await (const item of start) if (item.kind === "chunk") all.push(item);
  const middle = all[3];
  const rest = [];
  for await (const item of client.attachRun(start.runId, { afterOffset: middle.offset })) rest.push(item);
  assert.deepEqual(rest.map((i) => i.offset), all.slice(4).map((i) => i.offset));
});

test("errors surface typed: reasons, codes, metadata", async (t) => {
  const server = await startServer(t);
  const client = server.client();

  await assert.rejects(
    async () => {
      for await (const _ of client.attachRun("no-such-run")) assert.fail("an unknown run has no chunks");
    },
    (e) => e instanceof SandholdError && e.reason === "NOT_FOUND" && e.code === Code.NotFound,
  );
  await assert.rejects(client.cancelRun("no-such-run"), (e) => e instanceof SandholdError && e.reason === "NOT_FOUND");

  const stranger = new SandholdClient({ baseUrl: server.url, token: "not-a-token" });
  await assert.rejects(stranger.serverInfo(), (e) => e.reason === "UNAUTHENTICATED" && e.code === Code.Unauthenticated);
  const anonymous = new SandholdClient({ baseUrl: server.url });
  await assert.rejects(anonymous.listRuns(), (e) => e.reason === "UNAUTHENTICATED");

  const info = await client.serverInfo();
  assert.equal(info.tenant, "ts");

  // A bad request names the reason too.
  await assert.rejects(
    client.listRuns().then(() => client.runs.startRun({ threadId: "", definitionId: "" })[Symbol.asyncIterator]().next()),
    (e) => SandholdError.from(e).reason === "INVALID_ARGUMENT",
  );
});

test("the reason union is errors.proto's set", () => {
  const fromProto = Object.keys(ErrorReasonEnum).filter((k) => Number.isNaN(Number(k)) && k !== "UNSPECIFIED");
  assert.deepEqual([...ERROR_REASONS].sort(), fromProto.sort());
});

test("attempts: a set started, compared and one promoted", async (t) => {
  const server = await startServer(t);
  const client = server.client();
  await client.sandboxes.putDefinition({
    definition: {
      id: "ts-attempts",
      provider: { provider: { case: "local", value: {} } },
      lifecycle: { portableSnapshots: { enabled: true } },
    },
  });
  const script = 'echo "mine $SANDHOLD_ATTEMPT" > "attempt-$SANDHOLD_ATTEMPT.txt"';
  const started = await client.startAttempts(
    { threadId: "ts-task", definitionId: "ts-attempts", harness: "command", options: { command: ["sh", "-c", script] } },
    { count: 2 },
  );
  assert.equal(started.attempts.length, 2);
  for (const attempt of started.attempts) {
    const types = [];
    for await (const item of client.attachRun(attempt.runId)) if (item.kind === "chunk") types.push(item.chunk.type);
    assert.equal(types.at(-1), "RUN_FINISHED");
  }
  let set = await client.getAttemptSet(started.attemptSetId);
  for (let i = 0; i < 240 && !set.attempts.every((a) => a.evaluated); i++) {
    await new Promise((r) => setTimeout(r, 500));
    set = await client.getAttemptSet(started.attemptSetId);
  }
  assert.deepEqual(set.attempts.map((a) => a.files.map((f) => f.path)), [["attempt-0.txt"], ["attempt-1.txt"]]);
  const winner = set.attempts[1];
  assert.match(await client.getAttemptPatch(set.attemptSetId, winner.runId), /\+mine 1/);
  const promoted = await client.promoteAttempt(set.attemptSetId, winner.runId);
  assert.equal(promoted.promotedRunId, winner.runId);
});
