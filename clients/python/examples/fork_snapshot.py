"""A snapshot forked: a thread with portable snapshots runs a command that
writes a file; its end saves a checkpoint; a new thread forked from that
checkpoint starts from the same files (and a copy of the runs before it).

    SANDHOLD_SERVER=... python fork_snapshot.py
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

from sandhold import Sandhold, definition


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--thread", default=f"example-{uuid.uuid4().hex[:8]}")
    args = parser.parse_args(argv)
    with Sandhold() as client:
        client.definitions.put(definition("example-snapshots", local=True, portable_snapshots=True))
        client.runs.start(thread_id=args.thread, definition_id="example-snapshots",
                          command=["sh", "-c", "echo 'before the fork' > state.txt"]).text()
        # A run's end saves the thread's workspace as a checkpoint.
        deadline = time.monotonic() + 30
        while not (checkpoints := client.snapshots.list(args.thread)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not checkpoints:
            print("no checkpoint was saved", file=sys.stderr)
            return 1
        fork = client.snapshots.fork(args.thread, checkpoints[-1].checkpoint_id, f"{args.thread}-fork")
        print(f"forked {checkpoints[-1].checkpoint_id} into {fork.checkpoint.thread_id} "
              f"with {len(fork.run_ids)} run(s)")
        run = client.runs.start(thread_id=fork.checkpoint.thread_id, command=["cat", "state.txt"])
        print(run.text(), end="")
        return 0 if run.completed else 1


if __name__ == "__main__":
    sys.exit(main())
