"""One supervisor of process groups on this host, shared by the local stack's services
(``stack.processes``), the node agent's workspace servers (``runtime.local.servers``) and the
sandbox monitors (``runtime.local.sandboxes``).

Owns the mechanics every long-lived child of Stasis needs; the callers own what they start
and what they record about it. Promises:

- **A session of its own** (:func:`spawn`): the child leads a new session and process group
  (``start_new_session``), so it outlives its starter if need be and can be stopped as a
  group; its stdout and stderr are appended to a log after a header line per start.
- **Identity by creation time** (:func:`same_process`): a pid is only taken for the child
  if the process behind it was created when the child was, so a recycled pid is never
  signalled or mistaken for a live child.
- **Readiness is polled** (:func:`await_ready`), never slept for: a child that exits first
  fails at once, one that never answers fails at the deadline.
- **TERM, grace, KILL** (:func:`terminate`): SIGTERM to every process the caller collects
  and to their process groups, a grace period, then SIGKILL to whatever is left, found
  again (a kernel may have started meanwhile); what survives SIGKILL is returned, never
  hidden.
- **Log tails** (:func:`read_tail`) for error messages: only what this start wrote.
- **Atomic JSON records** (:func:`write_json`): the pid files, state files and results
  that processes leave for each other are replaced whole or not at all.

Standard library and psutil only: ``runtime.local`` stays independent of the control plane,
and the local stack imports this too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil

HOST = "127.0.0.1"
POLL_INTERVAL = 0.05
_FIRST_LOOK = 0.005
#: After SIGKILL the kernel needs a moment to tear a JVM down; past this, something is wrong.
KILL_WAIT = 10.0
#: psutil reads a process's creation time from the same clock every time; a recycled pid
#: gets another one. The slack only absorbs float rounding.
CREATE_TIME_SLACK = 0.5
TAIL_LINES = 40
TAIL_BYTES = 64 * 1024

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Spawned:
    """A child just started by :func:`spawn`."""

    popen: subprocess.Popen[bytes]
    create_time: float
    #: Where this start's output begins in the log (error tails show only this start).
    log_offset: int
    #: ``time.monotonic()`` right after the start, for start-up times.
    at: float

    @property
    def pid(self) -> int:
        return self.popen.pid


def spawn(argv: Sequence[str], *, log_path: Path, env: Mapping[str, str],
          cwd: Path | None = None, header: str | None = None,
          stdin: int = subprocess.DEVNULL) -> Spawned:
    """Start ``argv`` as the leader of a new session and process group, stdin from
    /dev/null (or ``subprocess.PIPE``: the caller's to write), stdout and stderr appended
    to ``log_path`` after the line ``=== <time> <header>`` (no line without a header).
    Raises OSError when ``argv`` cannot be run."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        offset = log_file.tell()
        if header is not None:
            log_file.write(f"=== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} {header}\n".encode())
            log_file.flush()
        popen = subprocess.Popen(
            list(argv),
            stdin=stdin,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
            close_fds=True,
        )
    at = time.monotonic()
    return Spawned(popen=popen, create_time=create_time_of(popen.pid), log_offset=offset, at=at)


def create_time_of(pid: int) -> float:
    """The creation time psutil reports for ``pid``; now, if it has exited already (the
    record is then only needed until its exit is noticed)."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.NoSuchProcess:
        return time.time()


# -- identity -----------------------------------------------------------------------------


def same_process(pid: int, create_time: float) -> bool:
    """Whether ``pid`` still names the live (non-zombie) process created at
    ``create_time``, not a process that got the pid later."""
    try:
        proc = psutil.Process(pid)
        return bool(
            abs(proc.create_time() - create_time) <= CREATE_TIME_SLACK
            and proc.status() != psutil.STATUS_ZOMBIE
        )
    except psutil.Error:
        return False


def is_live(proc: psutil.Process) -> bool:
    """Whether ``proc`` runs and is not a zombie (``is_running`` also checks its creation
    time, so a recycled pid reads as gone)."""
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if pgid_of(proc.pid) == pgid:
                members.append(proc)
        except (psutil.Error, ProcessLookupError):
            continue
    return members


def process_tree(pid: int, create_time: float) -> list[psutil.Process]:
    """Every live process of a child that leads its own group: the group's members and
    the leader's descendants, also those that left the group. Empty when the pid names
    another process now: a pid stays reserved while a group of that id lives, so the
    child's group is gone with it."""
    leader: psutil.Process | None
    try:
        leader = psutil.Process(pid)
        if abs(leader.create_time() - create_time) > CREATE_TIME_SLACK:
            return []
    except psutil.NoSuchProcess:
        leader = None
    found = group_members(pid)
    if leader is not None:
        with contextlib.suppress(psutil.Error):
            found.extend(leader.children(recursive=True))
    return merge(found)


def merge(*groups: Iterable[psutil.Process]) -> list[psutil.Process]:
    """The live processes of ``groups``, each once."""
    found: dict[int, psutil.Process] = {}
    for group in groups:
        for proc in group:
            found.setdefault(proc.pid, proc)
    return [p for p in found.values() if is_live(p)]


# -- readiness ----------------------------------------------------------------------------


def await_ready(
    children: Sequence[T],
    *,
    answers: Callable[[T, float], bool],
    gone: Callable[[T], str | None],
    timeout: float,
    interval: float = POLL_INTERVAL,
    probe_timeout: float = 1.0,
) -> tuple[list[tuple[T, float]], list[tuple[T, str | None]]]:
    """Poll every child until it answers: ``answers(child, seconds)`` asks it once, within
    ``seconds``; ``gone(child)`` says why it never will (it exited), None while it runs.
    Stops at the first round in which a child is gone, or at the deadline. Returns the
    children that answered, each with the ``time.monotonic()`` at which it did, and the
    failures: each with why it is gone, or None if it was still silent at the deadline."""
    deadline = time.monotonic() + timeout
    pending = list(children)
    ready: list[tuple[T, float]] = []
    failed: list[tuple[T, str | None]] = []
    while pending:
        for child in list(pending):
            why = gone(child)
            if why is not None:
                failed.append((child, why))
                pending.remove(child)
            elif answers(child, min(probe_timeout, max(0.05, deadline - time.monotonic()))):
                ready.append((child, time.monotonic()))
                pending.remove(child)
        if failed:
            break
        if pending and time.monotonic() >= deadline:
            failed.extend((child, None) for child in pending)
            break
        if pending:
            time.sleep(interval)
    return ready, failed


# -- stop ---------------------------------------------------------------------------------


def terminate(collect: Callable[[], list[psutil.Process]], *, grace: float) -> list[psutil.Process]:
    """Stop every process ``collect()`` finds: SIGTERM to each and to its process group,
    up to ``grace`` seconds for all of them to go, then SIGKILL to whatever is left (found
    again, since a process may have been started meanwhile) and up to :data:`KILL_WAIT`
    more. Returns the processes that survived SIGKILL (normally none). Idempotent."""
    targets = collect()
    if not targets:
        return []
    signal_all(targets, signal.SIGTERM)
    left = _wait_gone(targets, collect, grace)
    if left:
        log.info("%d processes still alive %gs after SIGTERM, killing: pids %s", len(left),
                 grace, sorted(p.pid for p in left))
        signal_all(left, signal.SIGKILL)
        left = _wait_gone(left, collect, KILL_WAIT)
    return left


def signal_all(procs: Iterable[psutil.Process], sig: signal.Signals) -> None:
    """Send ``sig`` to each process and to each of their process groups (never to this
    process's own group, nor to groups 0 and 1)."""
    own_group = os.getpgrp()
    groups: set[int] = set()
    for proc in procs:
        pgid = pgid_of(proc.pid)
        if pgid is not None:
            groups.add(pgid)
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)
    for pgid in groups - {own_group, 0, 1}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def _wait_gone(known: list[psutil.Process], collect: Callable[[], list[psutil.Process]],
               timeout: float) -> list[psutil.Process]:
    """Wait until none of ``known`` lives and ``collect()`` finds nothing new; what is
    left at the deadline otherwise. Zombies count as gone: their parent reaps them. Looks
    again after 5 ms, then less often up to :data:`POLL_INTERVAL`: a SIGKILLed server is
    gone within milliseconds, and a release (a pause's last step before PAUSED) waited a
    whole interval for it."""
    deadline = time.monotonic() + timeout
    delay = _FIRST_LOOK
    while True:
        left = [p for p in known if is_live(p)]
        if not left:
            left = merge(collect())
            if not left:
                return []
            known = left
        if time.monotonic() >= deadline:
            return merge(left, collect())
        time.sleep(delay)
        delay = min(delay * 2, POLL_INTERVAL)


# -- logs, ports and records --------------------------------------------------------------


def read_tail(path: Path, offset: int = 0, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of ``path`` written after ``offset`` (at most the last
    64 KiB), for an error message; says so when the log is empty or unreadable."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(offset, size - TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError as exc:
        return f"(log unreadable: {exc})"
    tail = text.splitlines()[-lines:]
    return "\n".join(tail) if tail else "(the log is empty)"


def free_port() -> int:
    """A loopback port free right now (another process may take it before the caller binds
    it: callers that care retry)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def write_json(path: Path, data: Any, *, mode: int | None = None,
               exclusive: bool = False) -> None:
    """Write ``data`` as JSON to ``path`` so that a reader sees the old file or the new one,
    never a part: written under a temporary name beside it (one per process and thread),
    flushed to disk, then renamed over ``path``. ``mode`` sets its permission bits before
    it appears under its name. With ``exclusive`` it is hard-linked into place instead,
    which raises FileExistsError if ``path`` exists: of two writers of one name, one wins."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        if exclusive:
            os.link(tmp, path)
        else:
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
