// The TypeScript quickstart of docs/api.md: a durable run of a command in a local
// sandbox, streamed (and resumed after a dropped connection) to stdout.
//   SANDHOLD_URL=http://127.0.0.1:7443 [SANDHOLD_TOKEN=...] node examples/quickstart.mjs
import { SandholdClient, SandholdError } from "@sandhold/client";

const sandhold = new SandholdClient({
  baseUrl: process.env.SANDHOLD_URL ?? "http://127.0.0.1:7443",
  token: process.env.SANDHOLD_TOKEN, // none on a single-user server
});

await sandhold.sandboxes.putDefinition({
  definition: { id: "quickstart", provider: { provider: { case: "local", value: {} } } },
});
const run = sandhold.startRun({
  threadId: "quickstart",
  definitionId: "quickstart",
  harness: "command",
  durable: true,
  options: { command: ["sh", "-c", "for i in 1 2 3; do echo step $i; sleep 0.2; done"] },
});
for await (const item of run) {
  if (item.kind !== "chunk") continue;
  const chunk = item.chunk;
  if (chunk.type === "TEXT_MESSAGE_CONTENT") process.stdout.write(chunk.delta);
  if (chunk.type === "RUN_ERROR") console.error(`run failed: ${chunk.errorCode}`);
}
console.log(`run ${run.runId} ended; its last offset was ${run.lastOffset}`);

try {
  await sandhold.cancelRun("no-such-run");
} catch (e) {
  if (e instanceof SandholdError && e.reason === "NOT_FOUND") console.log("no such run (NOT_FOUND)");
  else throw e;
}
