"""Crash points: the places in the flows where the fault harness (``bench/chaos.py``) may
kill a process on purpose, to show that a crash exactly there loses nothing.

Off unless ``STASIS_CRASH_POINTS`` names a directory; nothing sets it in a deployment or in
``stasis up``, only the harness, in the environment of the stack it starts. The harness
*arms* a point by creating the empty file ``<dir>/<point>``; the first process that reaches
an armed point claims it (an atomic rename to ``<point>.fired.<pid>``, so one arming kills
one process) and dies at once with SIGKILL: no ``finally``, no flush, as a power cut.

It sits beside the event contract because both sides of that contract crash here: the
control plane's pipeline and the node agent.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

ENV = "STASIS_CRASH_POINTS"

#: point -> where it is
POINTS = {
    "snapshot.manifest_written": "node agent: a kernel snapshot's manifest is written, its "
                                 "snapshot.finished not yet published",
    "restore.server_started": "node agent: a restore's server is up, the kernels not yet "
                              "restored",
    "server.spawned": "node agent: a server's process is started, not yet recorded in the "
                      "state file",
    "agent.operation_ended": "node agent: an operation's end is saved with its report "
                             "(workspace.ready, snapshot.finished, ...), not yet published",
    "sandbox.result_uploaded": "node agent: a sandbox's result is stored, its "
                               "sandbox.finished not yet published",
    "pipeline.committed": "function: a decision is committed, its outbox (commands such as "
                          "the release, events) not yet sent",
}


def reach(point: str, *, detail: str = "") -> None:
    """Die here if the harness armed ``point`` (or ``point:detail``, e.g.
    ``pipeline.committed:snapshot.finished``, the event's name); otherwise return at once."""
    root = os.environ.get(ENV)
    if not root:
        return
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}; known: {', '.join(sorted(POINTS))}")
    for name in ([f"{point}:{detail}"] if detail else []) + [point]:
        armed = Path(root) / name
        try:
            armed.rename(armed.with_name(f"{name}.fired.{os.getpid()}"))
        except FileNotFoundError:
            continue  # not armed, or another process claimed it first
        os.kill(os.getpid(), signal.SIGKILL)


def arm(root: Path, point: str, *, detail: str = "") -> Path:
    """Arm ``point`` under ``root`` (the harness's side)."""
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}; known: {', '.join(sorted(POINTS))}")
    root.mkdir(parents=True, exist_ok=True)
    armed = root / (f"{point}:{detail}" if detail else point)
    armed.touch()
    return armed


def fired(root: Path) -> list[str]:
    """The points that fired under ``root`` (one entry per process killed)."""
    if not root.is_dir():
        return []
    return sorted(p.name.split(".fired.")[0] for p in root.iterdir() if ".fired." in p.name)
