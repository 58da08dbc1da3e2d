"""Answering a run's requests from Python.

A run whose policy says `ask` waits on its client: each permission request
is a PERMISSION_REQUESTED chunk in the run's log, each call of a client tool
a TOOL_CALL_START marked `awaiting_client`. This example follows a run
(from any replica, after any offset, resuming after a dropped connection)
and answers each request as it arrives, with the `sandhold` package's
`requests.handle`: permissions by a rule of its own, client tools by
running a Python function. The answer reaches the sandbox once; a second
answer to the same request (from another client, or after a reconnect) is
`sandhold.FailedPrecondition`, which `handle` takes as "answered already".

    pip install ./clients/python
    python examples/python/answer_requests.py --server 127.0.0.1:7443 --run RUN_ID
"""

import argparse
import json
import sys

from sandhold import Sandhold


def allow_safe_commands(tool, tool_input):
    """The example's rule: allow commands that do not delete, deny the rest."""
    command = tool_input.get("command", "") if isinstance(tool_input, dict) else ""
    if isinstance(command, list):
        command = " ".join(command)
    if "rm " in command:
        return False, "deleting is not allowed here"
    return True, ""


def answer_requests(server, token, run_id, decide=allow_safe_commands, tools=None, after_offset="", out=sys.stderr):
    """Follow `run_id` until it ends, answering its requests. `decide(tool,
    input) -> (allow, message)` answers permissions; `tools[name](input) ->
    str` runs client tools (a missing tool, or one that raises, is an error
    result). Returns the answers given: [(request_id, kind, allowed)]."""

    def permission(chunk):
        allow, message = decide(chunk.tool_name, chunk.request.input)
        print(f"request {chunk.request.request_id} ({chunk.request.kind} {chunk.tool_name}): "
              f"{'allowed' if allow else 'denied'}", file=out)
        return allow, message

    with Sandhold(server, token=token) as client:
        answers = client.requests.handle(run_id, permission=permission, tools=tools or {}, after_offset=after_offset)
    return [(a.request_id, a.kind, a.allowed if a.kind == "permission" else not a.raw.answer.is_error)
            for a in answers]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default="127.0.0.1:7443")
    p.add_argument("--token", default=None, help="API token (default: SANDHOLD_TOKEN)")
    p.add_argument("--run", required=True)
    args = p.parse_args()
    answers = answer_requests(args.server, args.token, args.run)
    print(json.dumps({"run_id": args.run, "answered": answers}))


if __name__ == "__main__":
    main()
