"""The pure parts of the one process-group supervisor (runtime/supervisor.py): its atomic JSON
records, log tails and the readiness poll (driven here by fakes, never by the clock)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from runtime import supervisor


def test_write_json_replaces_the_file_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    supervisor.write_json(path, {"v": 1})
    supervisor.write_json(path, {"v": 2, "list": [1, 2]})
    assert json.loads(path.read_text()) == {"v": 2, "list": [1, 2]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_write_json_sets_the_mode_before_the_file_appears(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    supervisor.write_json(path, {"token": "secret"}, mode=0o600)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_exclusive_write_json_lets_one_writer_of_a_name_win(tmp_path: Path) -> None:
    path = tmp_path / "x.pid"
    supervisor.write_json(path, {"pid": 1}, exclusive=True)
    with pytest.raises(FileExistsError):
        supervisor.write_json(path, {"pid": 2}, exclusive=True)
    assert json.loads(path.read_text()) == {"pid": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.pid"]


def test_read_tail_shows_only_this_start_and_says_when_there_is_nothing(
        tmp_path: Path) -> None:
    log = tmp_path / "svc.log"
    log.write_text("old start\nold crash\n")
    offset = log.stat().st_size
    with open(log, "a") as f:
        f.writelines(f"line {i}\n" for i in range(50))
    assert supervisor.read_tail(log, offset, lines=3) == "line 47\nline 48\nline 49"
    assert "old" not in supervisor.read_tail(log, offset, lines=100)
    assert supervisor.read_tail(log, log.stat().st_size) == "(the log is empty)"
    assert supervisor.read_tail(tmp_path / "none.log").startswith("(log unreadable:")


class _Child:
    """A fake child that answers after ``answers_after`` probes, or exits after
    ``exits_after`` checks."""

    def __init__(self, name: str, answers_after: int | None = None,
                 exits_after: int | None = None) -> None:
        self.name, self.answers_after, self.exits_after = name, answers_after, exits_after
        self.probes = self.checks = 0

    def answers(self, seconds: float) -> bool:
        assert 0 < seconds <= 1.0
        self.probes += 1
        return self.answers_after is not None and self.probes >= self.answers_after

    def gone(self) -> str | None:
        self.checks += 1
        if self.exits_after is not None and self.checks >= self.exits_after:
            return "exited with code 3"
        return None


def _poll(children: list[_Child], timeout: float = 30.0
          ) -> tuple[list[tuple[_Child, float]], list[tuple[_Child, str | None]]]:
    return supervisor.await_ready(children, answers=lambda c, s: c.answers(s),
                                  gone=lambda c: c.gone(), timeout=timeout, interval=0)


def test_await_ready_waits_for_every_child() -> None:
    fast, slow = _Child("fast", answers_after=1), _Child("slow", answers_after=4)
    ready, failed = _poll([fast, slow])
    assert [c.name for c, _ in ready] == ["fast", "slow"] and failed == []
    assert (fast.probes, slow.probes) == (1, 4)
    assert ready[0][1] <= ready[1][1]


def test_await_ready_fails_at_once_when_a_child_exits() -> None:
    dying, silent = _Child("dying", exits_after=2), _Child("silent")
    ready, failed = _poll([dying, silent])
    assert ready == []
    assert [(c.name, why) for c, why in failed] == [("dying", "exited with code 3")]
    # The round in which it exited was the last: the others were asked once per round.
    assert (dying.checks, silent.probes) == (2, 2)


def test_await_ready_reports_the_silent_at_the_deadline() -> None:
    ok, silent = _Child("ok", answers_after=1), _Child("silent")
    ready, failed = _poll([ok, silent], timeout=0)
    assert [c.name for c, _ in ready] == ["ok"]
    assert [(c.name, why) for c, why in failed] == [("silent", None)]
