"""A command run: a local sandbox whose setup writes a file, a `command`
run that prints it, its text as it arrives, and the run's outcome as the
exit code (0 completed, 1 not).

    SANDHOLD_SERVER=127.0.0.1:7443 SANDHOLD_TOKEN=... python command_run.py -- sh -c 'cat made.txt; ls'
"""

from __future__ import annotations

import argparse
import sys
import uuid

from sandhold import Progress, Sandhold, definition


def show_progress(p: Progress) -> None:
    print(f"[{p.phase.lower()}] {p.message or p.output_line}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--thread", default=f"example-{uuid.uuid4().hex[:8]}")
    parser.add_argument("command", nargs="+", help="the argv to run in the sandbox")
    args = parser.parse_args(argv)
    with Sandhold() as client:  # SANDHOLD_SERVER, SANDHOLD_TOKEN
        client.definitions.put(definition("example-command", local=True, setup=['echo "made by setup" > made.txt']))
        run = client.runs.start(thread_id=args.thread, definition_id="example-command", command=args.command,
                                on_progress=show_progress)
        for chunk in run:
            print(chunk.text, end="", flush=True)
        if run.terminal is not None and not run.completed:
            print(f"run failed: {run.terminal.error_code} {run.terminal.error_message}", file=sys.stderr)
        return 0 if run.completed else 1


if __name__ == "__main__":
    sys.exit(main())
