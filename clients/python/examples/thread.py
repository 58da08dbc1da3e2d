"""A thread continued: runs of one thread share a sandbox (and, with an
agent harness, the conversation: the next run continues the CLI session
the last one ended with). The first run writes a note; the second, on the
same thread, finds it.

    SANDHOLD_SERVER=... python thread.py
"""

from __future__ import annotations

import argparse
import sys
import uuid

from sandhold import Sandhold, definition


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--thread", default=f"example-{uuid.uuid4().hex[:8]}")
    args = parser.parse_args(argv)
    with Sandhold() as client:
        client.definitions.put(definition("example-thread", local=True))
        first = client.runs.start(thread_id=args.thread, definition_id="example-thread",
                                  command=["sh", "-c", "echo 'from the first run' > note.txt"])
        first.text()
        # No definition: the thread's, so the run gets the thread's sandbox.
        second = client.runs.start(thread_id=args.thread, command=["cat", "note.txt"])
        print(second.text(), end="")
        runs = client.runs.list(thread_id=args.thread)
        same = len({r.sandbox_id for r in runs}) == 1
        print(f"{len(runs)} runs on thread {args.thread}, {'one sandbox' if same else 'several sandboxes'}")
        return 0 if first.completed and second.completed and same else 1


if __name__ == "__main__":
    sys.exit(main())
