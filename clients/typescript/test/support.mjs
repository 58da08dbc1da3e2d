// Test support: a real `sandhold serve` on a free loopback port with a
// temporary data dir and one API token, a TCP proxy in front of it whose
// connections a test can cut, and a local sandbox definition. Everything
// started is stopped by the test's `after` hooks.

import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { SandholdClient } from "../dist/index.js";

const here = dirname(fileURLToPath(import.meta.url));
export const repo = resolve(here, "../../..");

/** The sandhold binary: $SANDHOLD_BIN, else the debug build in $CARGO_TARGET_DIR or target/. */
export function sandholdBinary() {
  const candidates = [
    process.env.SANDHOLD_BIN,
    process.env.CARGO_TARGET_DIR && join(process.env.CARGO_TARGET_DIR, "debug/sandhold"),
    join(repo, "target/debug/sandhold"),
  ].filter(Boolean);
  const found = candidates.find((c) => existsSync(c));
  if (!found) throw new Error(`no sandhold binary (tried ${candidates.join(", ")}); set SANDHOLD_BIN`);
  return found;
}

function freePort() {
  return new Promise((ok, fail) => {
    const s = net.createServer();
    s.once("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Start `sandhold serve` (tenant `ts`, a random token; the local provider
 * kept on with tokens) and wait until its stores are open. Stopped with
 * SIGTERM after the test, which must exit 0.
 */
export async function startServer(t, { tokens = true, extraArgs = [] } = {}) {
  const binary = sandholdBinary(); // before anything is made that would need cleaning up
  const dataDir = mkdtempSync(join(tmpdir(), "sandhold-ts-"));
  const port = await freePort();
  const token = `ts-token-${Math.random().toString(16).slice(2)}`;
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("SANDHOLD_")));
  if (tokens) env.SANDHOLD_TOKENS = `ts=${token}`;
  if (process.env.SANDHOLD_AGENT_BIN) env.SANDHOLD_AGENT_BINARY = process.env.SANDHOLD_AGENT_BIN;
  const logPath = join(dataDir, "server.log");
  const log = openSync(logPath, "w");
  const child = spawn(
    binary,
    ["serve", "--listen", `127.0.0.1:${port}`, "--data-dir", join(dataDir, "data"), "--shutdown-grace-ms", "3000",
      ...(tokens ? ["--allow-local-with-tokens"] : []), ...extraArgs],
    { env, stdio: ["ignore", log, log] },
  );
  let exited = null;
  const exit = new Promise((ok) => child.once("exit", (code, signal) => ok((exited = { code, signal }))));
  const server = {
    port,
    url: `http://127.0.0.1:${port}`,
    // Without API tokens the server writes its local token (mode 600) into
    // its data dir once it is ready; every call needs it.
    get token() {
      if (tokens) return token;
      try {
        return readFileSync(join(dataDir, "data", "local-token"), "utf8").trim();
      } catch {
        return undefined;
      }
    },
    dataDir,
    log: () => readFileSync(logPath, "utf8"),
    client: (options = {}) => new SandholdClient({ baseUrl: server.url, token: server.token, ...options }),
  };
  t.after(async () => {
    if (!exited) {
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
      await exit;
      clearTimeout(timer);
    }
    // Local sandboxes outlive their server by design: destroy what is left.
    killSandboxes(dataDir);
    rmSync(dataDir, { recursive: true, force: true });
    if (exited.code !== 0) {
      throw new Error(`sandhold exited with ${JSON.stringify(exited)}:\n${server.log()}`);
    }
  });
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (exited) throw new Error(`sandhold exited with ${JSON.stringify(exited)}:\n${server.log()}`);
    try {
      await server.client().serverInfo();
      return server;
    } catch (e) {
      if (Date.now() > deadline) throw new Error(`sandhold did not become ready: ${e}\n${server.log()}`);
      await sleep(100);
    }
  }
}

/** Kill every process whose command line names `dataDir` (the local sandboxes' agents and shims). */
function killSandboxes(dataDir) {
  for (const pid of readdirSync("/proc").filter((p) => /^\d+$/.test(p))) {
    try {
      const cmd = readFileSync(`/proc/${pid}/cmdline`, "utf8");
      if (cmd.includes(dataDir)) process.kill(Number(pid), "SIGKILL");
    } catch {
      // gone already, or not ours to read
    }
  }
}

/**
 * A TCP proxy to `port` on loopback; `cut()` destroys every open
 * connection (a dropped network), new ones are accepted as before.
 */
export async function startProxy(t, port) {
  const sockets = new Set();
  const server = net.createServer((client) => {
    const upstream = net.connect(port, "127.0.0.1");
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on("close", () => sockets.delete(s));
      s.on("error", () => {});
    }
    client.pipe(upstream).pipe(client);
  });
  await new Promise((ok) => server.listen(0, "127.0.0.1", ok));
  const proxy = {
    url: `http://127.0.0.1:${server.address().port}`,
    cuts: 0,
    cut() {
      proxy.cuts += 1;
      for (const s of sockets) s.destroy();
    },
  };
  t.after(() => {
    for (const s of sockets) s.destroy();
    return new Promise((ok) => server.close(ok));
  });
  return proxy;
}

/** A definition of local sandboxes with no source. */
export async function putLocalDefinition(client, id) {
  await client.sandboxes.putDefinition({
    definition: { id, provider: { provider: { case: "local", value: {} } }, workspace: { source: { source: { case: "none", value: {} } } } },
  });
  return id;
}

/** A shell command printing `line-1` .. `line-N`, one every `everyMs`. */
export function numberedLines(n, everyMs) {
  return ["sh", "-c", `i=1; while [ $i -le ${n} ]; do echo line-$i; i=$((i+1)); sleep ${everyMs / 1000}; done`];
}
