// The TypeScript quickstart of docs/api.md (examples/quickstart.mjs) against a real server.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { startServer } from "./support.mjs";

const pkg = join(dirname(fileURLToPath(import.meta.url)), "..");

test("the quickstart runs and prints what docs/api.md says", async (t) => {
  const server = await startServer(t);
  const { stdout } = await promisify(execFile)(process.execPath, [join(pkg, "examples/quickstart.mjs")], {
    env: { ...process.env, SANDHOLD_URL: server.url, SANDHOLD_TOKEN: server.token },
  });
  assert.match(stdout, /^step 1\nstep 2\nstep 3\nrun run-[0-9a-f]{32} ended; its last offset was \d+\nno such run \(NOT_FOUND\)\n$/);
});
