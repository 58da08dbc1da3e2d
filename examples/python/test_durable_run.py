"""The example client against a real server: ensure, and a durable run whose
connection drops halfway and is resumed from the last offset received."""

import io

from conftest import TOKEN
from durable_run import durable_run, ensure_sandbox

LINES = 40


def test_ensure_creates_then_resumes(server):
    first = ensure_sandbox(server, TOKEN, "ensure-thread")
    again = ensure_sandbox(server, TOKEN, "ensure-thread")
    assert first.outcome == "CREATED"
    assert again.outcome == "RESUMED"
    assert again.sandbox_id == first.sandbox_id


def test_durable_run_resumes_after_a_dropped_connection(server):
    out = io.StringIO()
    got = durable_run(server, TOKEN, lines=LINES, drop_after=LINES // 2, out=out)

    # Every line once, in order: nothing lost across the drop, nothing twice.
    assert got["texts"] == [f"line {i}\n" for i in range(1, LINES + 1)]
    assert out.getvalue() == "".join(f"line {i}\n" for i in range(1, LINES + 1))
    assert len(set(got["offsets"])) == len(got["offsets"]), "an offset was delivered twice"
    # RUN_STARTED once, before any text (out-of-band CUSTOM chunks such as
    # the sandbox's may come first); RUN_FINISHED once, last.
    assert got["types"].count("RUN_STARTED") == 1
    assert got["types"].index("RUN_STARTED") < got["types"].index("TEXT_MESSAGE_CONTENT")
    assert got["types"].count("RUN_FINISHED") == 1
    assert got["types"][-1] == "RUN_FINISHED"
    # The drop really happened mid-run: chunks came on both connections.
    dropped = got["offsets"].index(got["dropped_after_offset"])
    assert 0 < dropped < len(got["offsets"]) - 1
    assert got["status"] == "COMPLETED"
