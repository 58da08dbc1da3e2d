"""A durable run from Python, with a dropped connection in the middle.

Uses the `sandhold` package (clients/python: `pip install ./clients/python`).
This script stores a sandbox definition (local provider), ensures the
sandbox, starts a DURABLE run of a command that prints numbered lines,
closes its connection halfway through, then opens a new one and attaches
after the last offset it received: the run went on without it, and the
attach delivers exactly what came after that offset. (The package's run
streams resume by themselves after a dropped connection; this shows the
offsets underneath.)

    pip install ./clients/python
    python examples/python/durable_run.py --server 127.0.0.1:7443 --lines 40

Prints each text line of the run as it arrives, then a JSON summary line.
"""

import argparse
import json
import sys
import time
import uuid

from sandhold import Sandhold, definition

DEFINITION_ID = "python-example"


def ensure_sandbox(server, token, thread_id):
    """PutDefinition + EnsureSandbox; returns the sandbox (sandhold.Ready)."""
    with Sandhold(server, token=token) as client:
        client.definitions.put(definition(DEFINITION_ID, local=True, setup=["echo workspace ready"]))
        return client.sandboxes.ensure(
            DEFINITION_ID, thread_id,
            on_progress=lambda p: print(f"[ensure] {p.message or p.output_line}", file=sys.stderr),
        )


def counting_command(lines, delay):
    script = f'i=1; while [ "$i" -le {lines} ]; do echo "line $i"; i=$((i + 1)); sleep {delay}; done'
    return ["sh", "-c", script]


def durable_run(server, token, lines=40, drop_after=None, delay=0.05, out=sys.stdout):
    """Run `lines` numbered lines durably, dropping the connection after
    `drop_after` of them (default: half), and return what was received:
    {"run_id", "texts", "offsets", "types", "dropped_after_offset", "status"}."""
    drop_after = lines // 2 if drop_after is None else drop_after
    thread_id = f"py-{uuid.uuid4().hex[:12]}"
    ready = ensure_sandbox(server, token, thread_id)
    print(f"[sandbox] {ready.sandbox_id} ({ready.outcome})", file=sys.stderr)

    received = {"run_id": None, "texts": [], "offsets": [], "types": [], "dropped_after_offset": None}

    def take(chunk):
        received["offsets"].append(chunk.offset)
        received["types"].append(chunk.type.value)
        if chunk.text:
            received["texts"].append(chunk.text)
            out.write(chunk.text)
            out.flush()

    # First connection: start the run and read until halfway, then close the
    # client. Closing cancels the call: the server sees a disconnect, which
    # for a durable run means detach, never cancel.
    with Sandhold(server, token=token) as first:
        run = first.runs.start(thread_id=thread_id, definition_id=DEFINITION_ID,
                               command=counting_command(lines, delay), durable=True)
        received["run_id"] = run.run_id
        for chunk in run:
            take(chunk)
            if len(received["texts"]) >= drop_after:
                break
        run.close()
    last_offset = run.last_offset
    received["dropped_after_offset"] = last_offset
    print(f"\n[dropped the connection after offset {last_offset!r}]", file=sys.stderr)

    # Second connection: attach after the last offset and read to the end.
    with Sandhold(server, token=token) as second:
        for chunk in second.runs.stream(run.run_id, after_offset=last_offset, thread_id=thread_id):
            take(chunk)
        # The terminal chunk is appended first and the record's status right
        # after it, so a GetRun at the stream's end may still say RUNNING.
        deadline = time.monotonic() + 60
        while True:
            record = second.runs.get(run.run_id)
            if not record.status.value == "RUNNING" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    received["status"] = record.status.value
    return received


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default="127.0.0.1:7443")
    parser.add_argument("--token", default=None, help="API token (default: SANDHOLD_TOKEN)")
    parser.add_argument("--lines", type=int, default=40)
    parser.add_argument("--drop-after", type=int, default=None, help="lines before the drop (default: half)")
    args = parser.parse_args()
    received = durable_run(args.server, args.token, args.lines, args.drop_after)
    summary = {k: received[k] for k in ("run_id", "status", "dropped_after_offset")}
    summary["lines"] = len(received["texts"])
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
