"""A durable run from Python, with a dropped connection in the middle.

The client is generated from proto/ with grpcio-tools (generate.sh). This
script stores a sandbox definition (local provider), ensures the sandbox,
starts a DURABLE run of a command that prints numbered lines, closes its
connection halfway through, then opens a new one and attaches after the last
offset it received: the run went on without it, and the attach delivers
exactly what came after that offset.

    examples/python/generate.sh /tmp/sandhold-py && export PYTHONPATH=/tmp/sandhold-py
    python examples/python/durable_run.py --server 127.0.0.1:7443 --lines 40

Prints each text line of the run as it arrives, then a JSON summary line.
"""

import argparse
import json
import sys
import time
import uuid

import grpc

from sandhold.v1 import events_pb2, run_pb2, run_pb2_grpc, sandbox_pb2, sandbox_pb2_grpc

DEFINITION_ID = "python-example"


def channel(server):
    return grpc.insecure_channel(server)


def metadata(token):
    return [("authorization", f"Bearer {token}")] if token else []


def ensure_sandbox(server, token, thread_id):
    """PutDefinition + EnsureSandbox; returns the EnsureReady message."""
    with channel(server) as ch:
        sandboxes = sandbox_pb2_grpc.SandboxServiceStub(ch)
        definition = sandbox_pb2.SandboxDefinition(
            id=DEFINITION_ID,
            provider=sandbox_pb2.ProviderSpec(local=sandbox_pb2.LocalProvider()),
            workspace=sandbox_pb2.WorkspaceDefinition(
                setup=[sandbox_pb2.SetupStep(serial="echo workspace ready")]
            ),
        )
        sandboxes.PutDefinition(
            sandbox_pb2.PutDefinitionRequest(definition=definition), metadata=metadata(token)
        )
        request = sandbox_pb2.EnsureSandboxRequest(definition_id=DEFINITION_ID, thread_id=thread_id)
        for response in sandboxes.EnsureSandbox(request, metadata=metadata(token), timeout=300):
            if response.HasField("progress"):
                progress = response.progress
                print(f"[ensure] {progress.message or progress.output_line}", file=sys.stderr)
            elif response.HasField("ready"):
                return response.ready
    raise RuntimeError("EnsureSandbox ended without ready")


def counting_command(lines, delay):
    script = f'i=1; while [ "$i" -le {lines} ]; do echo "line $i"; i=$((i + 1)); sleep {delay}; done'
    return ["sh", "-c", script]


def text_of(event):
    """The text of a RunEvent's chunk, or None."""
    if not event.HasField("chunk"):
        return None
    chunk = event.chunk.chunk
    if chunk.type == events_pb2.CHUNK_TYPE_TEXT_MESSAGE_CONTENT:
        return chunk.delta
    return None


def durable_run(server, token, lines=40, drop_after=None, delay=0.05, out=sys.stdout):
    """Run `lines` numbered lines durably, dropping the connection after
    `drop_after` of them (default: half), and return what was received:
    {"run_id", "texts", "offsets", "types", "dropped_after_offset"}."""
    drop_after = lines // 2 if drop_after is None else drop_after
    thread_id = f"py-{uuid.uuid4().hex[:12]}"
    run_id = f"py-run-{uuid.uuid4().hex}"
    ready = ensure_sandbox(server, token, thread_id)
    print(f"[sandbox] {ready.sandbox_id} ({sandbox_pb2.EnsureOutcome.Name(ready.outcome)})", file=sys.stderr)

    received = {"run_id": run_id, "texts": [], "offsets": [], "types": [], "dropped_after_offset": None}

    def take(event):
        if not event.HasField("chunk"):
            return
        received["offsets"].append(event.chunk.offset)
        received["types"].append(events_pb2.ChunkType.Name(event.chunk.chunk.type))
        text = text_of(event)
        if text is not None:
            received["texts"].append(text)
            out.write(text)
            out.flush()

    # First connection: start the run and read until halfway, then close the
    # channel. Closing cancels the call: the server sees a disconnect, which
    # for a durable run means detach, never cancel.
    start = run_pb2.StartRunRequest(
        thread_id=thread_id,
        run_id=run_id,
        definition_id=DEFINITION_ID,
        harness="command",
        options=run_pb2.HarnessOptions(command=counting_command(lines, delay)),
        durable=True,
    )
    first = channel(server)
    try:
        for event in run_pb2_grpc.RunServiceStub(first).StartRun(start, metadata=metadata(token), timeout=300):
            take(event)
            if len(received["texts"]) >= drop_after:
                break
    finally:
        first.close()
    last_offset = received["offsets"][-1] if received["offsets"] else ""
    received["dropped_after_offset"] = last_offset
    print(f"\n[dropped the connection after offset {last_offset!r}]", file=sys.stderr)

    # Second connection: attach after the last offset and read to the end.
    with channel(server) as second:
        attach = run_pb2.AttachRunRequest(run_id=run_id, after_offset=last_offset, thread_id=thread_id)
        for event in run_pb2_grpc.RunServiceStub(second).AttachRun(attach, metadata=metadata(token), timeout=300):
            take(event)
        # The terminal chunk is appended first and the record's status right
        # after it, so a GetRun at the stream's end may still say RUNNING.
        stub = run_pb2_grpc.RunServiceStub(second)
        deadline = time.monotonic() + 60
        while True:
            run = stub.GetRun(run_pb2.GetRunRequest(run_id=run_id), metadata=metadata(token)).run
            if run.status != run_pb2.RUN_STATUS_RUNNING or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    received["status"] = run_pb2.RunStatus.Name(run.status)
    return received


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default="127.0.0.1:7443")
    parser.add_argument("--token", default="", help="API token (single-user servers need none)")
    parser.add_argument("--lines", type=int, default=40)
    parser.add_argument("--drop-after", type=int, default=None, help="lines before the drop (default: half)")
    args = parser.parse_args()
    received = durable_run(args.server, args.token, args.lines, args.drop_after)
    summary = {k: received[k] for k in ("run_id", "status", "dropped_after_offset")}
    summary["lines"] = len(received["texts"])
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
