"""The one process-group supervisor (runtime/supervisor.py) with real processes: a session of
its own, identity by creation time, and TERM -> grace -> KILL of a whole tree, including a
descendant that left the group and one that ignores SIGTERM."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import psutil

from runtime import supervisor


def test_spawn_starts_a_session_of_its_own_and_appends_to_the_log(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "child.log"
    log.parent.mkdir()
    log.write_text("the previous start\n")
    child = supervisor.spawn([sys.executable, "-c", "import os; print('hello', os.environ['X'])"],
                             log_path=log, env={**os.environ, "X": "42"}, header="start: test")
    assert child.popen.wait(timeout=60) == 0
    text = log.read_text()
    assert text.startswith("the previous start\n=== ")
    assert text.splitlines()[1].endswith(" start: test")
    assert text[child.log_offset:].splitlines()[-1] == "hello 42"
    assert supervisor.read_tail(log, child.log_offset, lines=1) == "hello 42"


def test_identity_is_pid_and_creation_time(tmp_path: Path) -> None:
    child = supervisor.spawn([sys.executable, "-c", "import time; time.sleep(60)"],
                             log_path=tmp_path / "sleep.log", env=dict(os.environ))
    try:
        assert os.getsid(child.pid) == child.pid  # leader of a new session and group
        assert supervisor.same_process(child.pid, child.create_time)
        # The same pid with another creation time is a recycled pid: not ours.
        assert not supervisor.same_process(child.pid, child.create_time - 10)
        assert supervisor.process_tree(child.pid, child.create_time - 10) == []
    finally:
        child.popen.kill()
        child.popen.wait(timeout=30)
    assert not supervisor.same_process(child.pid, child.create_time)


def test_terminate_ends_the_tree_even_what_left_the_group_or_ignores_term(
        tmp_path: Path) -> None:
    ready = tmp_path / "ignoring"
    script = textwrap.dedent("""
        import signal, subprocess, sys, time
        # A grandchild in a session of its own (as a Jupyter kernel is), ignoring SIGTERM.
        subprocess.Popen([sys.executable, "-c",
                          "import pathlib, signal, sys, time;"
                          " signal.signal(signal.SIGTERM, signal.SIG_IGN);"
                          " pathlib.Path(sys.argv[1]).touch(); time.sleep(600)", sys.argv[1]],
                         start_new_session=True)
        time.sleep(600)
    """)
    child = supervisor.spawn([sys.executable, "-c", script, str(ready)],
                             log_path=tmp_path / "tree.log", env=dict(os.environ))

    def tree() -> list[psutil.Process]:
        return supervisor.process_tree(child.pid, child.create_time)

    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline, "the grandchild did not start"
        time.sleep(0.05)
    found = tree()
    escaped = [p for p in found if supervisor.pgid_of(p.pid) != child.pid]
    assert escaped, "the grandchild should have left the group"
    assert supervisor.terminate(tree, grace=1.0) == []
    # The grandchild ignores SIGTERM: it is gone only because SIGKILL followed.
    assert not any(supervisor.is_live(p) for p in found)
    child.popen.wait(timeout=30)
    assert supervisor.terminate(tree, grace=1.0) == []  # idempotent
