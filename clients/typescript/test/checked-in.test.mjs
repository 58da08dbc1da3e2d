// What is checked in is what its sources build: the generated code
// (src/gen, from proto/) and the console bundle the server embeds
// (control-plane/console/console.js, from control-plane/console/src).

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const pkg = join(dirname(fileURLToPath(import.meta.url)), "..");
const run = promisify(execFile);

test("src/gen is what protoc-gen-es makes of proto/", async () => {
  const { stdout } = await run(join(pkg, "scripts/generate.sh"), ["--check"], { cwd: pkg });
  assert.equal(stdout.trim(), "");
});

test("the embedded console bundle is built from its sources", async () => {
  const { stdout } = await run(process.execPath, [join(pkg, "scripts/build-console.mjs"), "--check"], { cwd: pkg });
  assert.match(stdout, /is up to date/);
});
