"""A Claude Code run under a policy that asks before every command, and a
handler in this program that answers: commands that delete are denied, the
rest allowed. The run is started detached from the handler, as a service
would: the handler follows the run from any replica (resuming after a
dropped connection) and answers each request as it comes.

    export ANTHROPIC_API_KEY=...   # sent as a secret: never stored, never in the sandbox
    python claude_code_asks.py 'Write hello.txt saying hello'

``--program`` names the claude binary (default: the server's toolchain,
`sandhold harness install claude-code`), ``--env KEY=VALUE`` adds to the
CLI's environment (e.g. ANTHROPIC_BASE_URL for a model proxy).
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid

from sandhold import Chunk, Policy, Rule, Sandhold, definition
from sandhold.v1 import run_pb2


def decide(chunk: Chunk) -> tuple[bool, str]:
    """Allow a command unless it deletes something."""
    tool_input = chunk.request.input if chunk.request is not None else {}
    command = str(tool_input.get("command", "")) if isinstance(tool_input, dict) else ""
    if "rm " in command:
        print(f"denied: {command}", file=sys.stderr)
        return False, "deleting is not allowed here"
    print(f"allowed: {chunk.tool_name} {command}", file=sys.stderr)
    return True, ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prompt")
    parser.add_argument("--program", default="", help="the claude binary (default: the server's toolchain)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--secret", action="append", default=[], metavar="NAME",
                        help="a secret whose value is this environment variable's (default: ANTHROPIC_API_KEY when set)")
    args = parser.parse_args(argv)
    names = args.secret or (["ANTHROPIC_API_KEY"] if os.environ.get("ANTHROPIC_API_KEY") else [])
    secrets = {name: os.environ[name] for name in names}
    options = run_pb2.HarnessOptions(program=args.program, env=dict(e.split("=", 1) for e in args.env))
    with Sandhold() as client:
        client.definitions.put(definition("example-claude", local=True, secret_names=list(secrets)))
        run = client.runs.start(
            thread_id=f"example-{uuid.uuid4().hex[:8]}",
            definition_id="example-claude",
            harness="claude-code",
            prompt=args.prompt,
            options=options,
            secrets=secrets,
            policy=Policy(default="allow", rules=[Rule("command", "*", "ask")]),
        )
        next(iter(run))  # accepted: the run goes on without this stream
        run.close()
        answered = client.requests.handle(run.run_id, permission=decide)
        print(f"answered {len(answered)} request(s)", file=sys.stderr)
        chunks = list(client.runs.stream(run.run_id))
        print("".join(c.text for c in chunks))
        return 0 if chunks and chunks[-1].type.value == "RUN_FINISHED" else 1


if __name__ == "__main__":
    sys.exit(main())
