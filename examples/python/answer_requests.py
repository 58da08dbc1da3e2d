"""Answering a run's requests from Python.

A run whose policy says `ask` waits on its client: each permission request
is a PERMISSION_REQUESTED chunk in the run's log, each call of a client tool
a TOOL_CALL_START marked `awaiting_client`. This example follows a run
(AttachRun, from any replica, after any offset) and answers each request as
it arrives with RespondToRequest: permissions by a rule of its own, client
tools by running a Python function. The answer reaches the sandbox once; a
second answer to the same request (from another client, or after a
reconnect) is FAILED_PRECONDITION, which this client takes as "answered
already".

    examples/python/generate.sh /tmp/sandhold-py && export PYTHONPATH=/tmp/sandhold-py
    python examples/python/answer_requests.py --server 127.0.0.1:7443 --run RUN_ID
"""

import argparse
import json
import sys

import grpc

from sandhold.v1 import events_pb2, run_pb2, run_pb2_grpc


def metadata(token):
    return [("authorization", f"Bearer {token}")] if token else []


def allow_safe_commands(tool, tool_input):
    """The example's rule: allow commands that do not delete, deny the rest."""
    command = tool_input.get("command", "")
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
    tools = tools or {}
    answered = []
    with grpc.insecure_channel(server) as ch:
        runs = run_pb2_grpc.RunServiceStub(ch)
        attach = run_pb2.AttachRunRequest(run_id=run_id, after_offset=after_offset)
        for event in runs.AttachRun(attach, metadata=metadata(token)):
            if not event.HasField("chunk"):
                continue
            chunk = event.chunk.chunk
            request = chunk.request if chunk.HasField("request") else None
            if chunk.type == events_pb2.CHUNK_TYPE_PERMISSION_REQUESTED:
                allow, message = decide(chunk.tool_name, json.loads(request.input_json or "{}"))
                answer = run_pb2.RespondToRequestRequest(
                    run_id=run_id,
                    request_id=request.request_id,
                    permission=run_pb2.PermissionAnswer(allow=allow, message=message),
                )
            elif chunk.type == events_pb2.CHUNK_TYPE_TOOL_CALL_START and request and request.awaiting_client:
                result, is_error = run_tool(tools, chunk.tool_name, request.input_json)
                answer = run_pb2.RespondToRequestRequest(
                    run_id=run_id,
                    request_id=request.request_id,
                    tool_result=run_pb2.ToolResult(content=result, is_error=is_error),
                )
            else:
                if chunk.type in (events_pb2.CHUNK_TYPE_RUN_FINISHED, events_pb2.CHUNK_TYPE_RUN_ERROR):
                    break
                continue
            try:
                runs.RespondToRequest(answer, metadata=metadata(token))
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                print(f"request {request.request_id}: answered already", file=out)
                continue
            allowed = answer.permission.allow if answer.HasField("permission") else not answer.tool_result.is_error
            print(f"request {request.request_id} ({request.kind} {chunk.tool_name}): "
                  f"{'allowed' if allowed else 'denied'}", file=out)
            answered.append((request.request_id, request.kind, allowed))
    return answered


def run_tool(tools, name, input_json):
    """(result text, is_error) of client tool `name`."""
    fn = tools.get(name)
    if fn is None:
        return f"no client tool {name}", True
    try:
        return str(fn(json.loads(input_json or "{}"))), False
    except Exception as e:  # the model is told, the run goes on
        return f"{name} failed: {e}", True


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default="127.0.0.1:7443")
    p.add_argument("--token", default="")
    p.add_argument("--run", required=True)
    args = p.parse_args()
    answers = answer_requests(args.server, args.token, args.run)
    print(json.dumps({"run_id": args.run, "answered": answers}))


if __name__ == "__main__":
    main()
