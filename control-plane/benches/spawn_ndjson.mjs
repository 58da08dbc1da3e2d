// The cli_run bench's baseline: TanStack AI sandbox's `spawnNdjson` reading
// a command's NDJSON lines through a plain pipe (not durable), in a minimal
// local-process SandboxHandle (only `process.spawn`, which is all it uses).
//
//   node spawn_ndjson.mjs PACKAGE_DIR COMMAND
//
// PACKAGE_DIR holds node_modules/@tanstack/ai-sandbox. Prints
// {"lines": N, "seconds": S}, timed from the spawn to the last line.
import { spawn } from 'node:child_process'
import { join } from 'node:path'

const [dir, command] = process.argv.slice(2)
const { spawnNdjson } = await import(join(dir, 'node_modules/@tanstack/ai-sandbox/dist/esm/index.js'))

const handle = {
  process: {
    spawn: async (cmd, options = {}) => {
      const child = spawn('sh', ['-c', cmd], { cwd: options.cwd, env: { ...process.env, ...options.env } })
      child.stdout.setEncoding('utf8')
      child.stderr.setEncoding('utf8')
      const exited = new Promise((resolve) => child.on('close', (code) => resolve(code ?? 1)))
      return {
        pid: child.pid,
        stdout: child.stdout,
        stderr: child.stderr,
        stdin: {
          write: (data) => new Promise((resolve) => child.stdin.write(data, () => resolve())),
          end: async () => child.stdin.end(),
        },
        wait: () => exited,
        kill: async (signal) => void child.kill(signal),
      }
    },
  },
}

const started = process.hrtime.bigint()
let lines = 0
for await (const _event of spawnNdjson(handle, command)) lines++
const seconds = Number(process.hrtime.bigint() - started) / 1e9
console.log(JSON.stringify({ lines, seconds }))
