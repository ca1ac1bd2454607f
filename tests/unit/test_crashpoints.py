"""Crash points (``events.crashpoints``): off unless armed, one arming kills one process."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from events import crashpoints

REACH = "from events import crashpoints; crashpoints.reach({!r}, detail={!r}); print('passed')"


def _reach(root, point: str, detail: str = "", *, env: bool = True) -> subprocess.CompletedProcess:
    environ = {"PATH": "/usr/bin:/bin", **({crashpoints.ENV: str(root)} if env else {})}
    return subprocess.run([sys.executable, "-c", REACH.format(point, detail)], env=environ,
                          capture_output=True, text=True, timeout=60, cwd=crashpoints.__file__
                          .rsplit("/events/", 1)[0])


def test_an_armed_point_kills_the_first_process_to_reach_it_and_only_that_one(tmp_path):
    crashpoints.arm(tmp_path, "pipeline.committed")
    first = _reach(tmp_path, "pipeline.committed", "snapshot.finished")
    assert first.returncode == -signal.SIGKILL and "passed" not in first.stdout
    second = _reach(tmp_path, "pipeline.committed", "snapshot.finished")
    assert second.returncode == 0 and "passed" in second.stdout
    assert crashpoints.fired(tmp_path) == ["pipeline.committed"]


def test_a_point_armed_for_one_event_spares_the_others(tmp_path):
    crashpoints.arm(tmp_path, "pipeline.committed", detail="snapshot.finished")
    assert _reach(tmp_path, "pipeline.committed", "workspace.requested").returncode == 0
    assert _reach(tmp_path, "pipeline.committed", "snapshot.finished").returncode == -9


def test_without_the_variable_nothing_is_armed(tmp_path):
    crashpoints.arm(tmp_path, "snapshot.manifest_written")
    assert _reach(tmp_path, "snapshot.manifest_written", env=False).returncode == 0
    assert crashpoints.fired(tmp_path) == []


def test_an_unknown_point_is_a_clear_error(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown crash point 'nowhere'; known: "):
        crashpoints.arm(tmp_path, "nowhere")
    monkeypatch.setenv(crashpoints.ENV, str(tmp_path))
    with pytest.raises(ValueError, match="unknown crash point"):
        crashpoints.reach("nowhere")
