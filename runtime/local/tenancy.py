"""One OS user per workspace: whether this agent can give them, which uid is whose, homes.

A node agent that runs as root gives each workspace a uid of its own from a reserved range
(``UID_BASE`` + n, beside the sandboxes' 200000 + n): its server, terminals and kernels run
as that uid and gid with no supplementary groups (``runtime.local.launch --user``, or the
warm server's ``become``), its home is owned by it with mode 0700, and the agent's own
files (``agent/``: the token, the state with every Jupyter token) stay root's, 0700/0600.

Why a reserved range and not ``useradd``: nothing on the host changes (no ``/etc/passwd``
entry to add, lock or clean up after a destroy, no ``useradd`` binary needed in a
container), a uid is just a number the kernel checks, and the sandboxes already work this
way. What a user entry would give (a name) is set in the environment instead (``USER``,
``LOGNAME``), which is where ``getpass`` and pip look first.

The uid is recorded in the agent's state (``WorkspaceRecord.uid``) and reused on every
start of the workspace: resume, an agent restart, a destroy that kept the home (the home's
owner is taken again when no other workspace holds it).

Whether isolation is possible is probed, never assumed (:func:`detect`, once at start):
root, and a child that really drops to a uid of the range. A workspace is then isolated
when its environment's interpreter can run as a workspace user and reach the homes
(:meth:`Tenancy.refusal`, probed once per interpreter): an interpreter under a directory
only root may enter (``/root/.pyenv``) cannot. Otherwise the workspace runs as the agent's
user (single-tenant, as an agent that is not root runs every workspace), its status says
why, and a team, environment or profile with ``isolation: required`` is refused with that
reason.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

UID_BASE = 300_000
UID_COUNT = 50_000
#: The uid the probes drop to (never a workspace's).
PROBE_UID = UID_BASE + UID_COUNT - 1


def trampoline(uid: int) -> list[str]:
    """The start of a command line that drops to ``uid`` (its own gid, no groups)."""
    return [sys.executable, "-m", "runtime.local.launch", "--user", str(uid), "--"]


@dataclass
class Tenancy:
    """Whether this agent gives workspaces users of their own; ``reason`` says why not."""

    users: bool
    reason: str | None = None
    repo_root: Path = Path(__file__).resolve().parents[2]
    _runnable: dict[tuple[str, str], str | None] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def refusal(self, python: str, homes: Path) -> str | None:
        """Why a workspace on ``python`` with its home under ``homes`` cannot run as a user
        of its own here, or None (probed once per interpreter)."""
        if not self.users:
            return self.reason
        key = (python, str(homes))
        with self._lock:
            if key not in self._runnable:
                self._runnable[key] = _probe_interpreter(python, homes, self.repo_root)
            return self._runnable[key]

    def describe(self) -> dict[str, Any]:
        """``mode`` and its ``reason``; with users, ``single_tenant``: the interpreters
        probed so far whose workspaces share the agent's user, and why."""
        with self._lock:
            shared = {python: why for (python, _), why in self._runnable.items() if why}
        return {"mode": "per-workspace-users" if self.users else "single-tenant",
                "reason": self.reason, "single_tenant": shared}


def detect(repo_root: Path | None = None) -> Tenancy:
    """This agent's tenancy: per-workspace users when it is root and a child really drops
    to a uid of the range; single-tenant otherwise, with the reason."""
    root = repo_root or Path(__file__).resolve().parents[2]
    euid = os.geteuid()
    if euid != 0:
        return Tenancy(False, f"the node agent runs as uid {euid}, not root, so it cannot "
                              "give workspaces OS users of their own (single-tenant: every "
                              "workspace runs as the agent's user)", root)
    why = _run_as(PROBE_UID, ["/bin/true"], root)
    if why is not None:
        return Tenancy(False, f"the node agent could not drop a process to uid {PROBE_UID} "
                              f"({why}), so workspaces share its user (single-tenant)", root)
    return Tenancy(True, None, root)


def required_by(spec: Mapping[str, Any]) -> list[str]:
    """What requires that this workspace run as a user of its own ("team t", "profile p"):
    the control plane names them in the spec (``extra.isolation_required_by``, from the
    catalog's ``isolation: required``)."""
    extra = spec.get("extra")
    found = extra.get("isolation_required_by") if isinstance(extra, Mapping) else None
    return [str(item) for item in found] if isinstance(found, list) else []


def candidates(home: Path, taken: Iterable[int]) -> Iterator[int]:
    """The uids a workspace that has none recorded may get, best first: its home's owner
    when that is a uid of the range no other workspace holds (a home kept across a
    destroy), then every free one from the lowest. ``taken``: the uids of the other
    workspaces and of every home. The agent claims the first one no other agent on the
    host holds (``runtime.local.uids``)."""
    held = set(taken)
    owner = None
    with contextlib.suppress(OSError):
        owner = home.stat().st_uid
        if UID_BASE <= owner < PROBE_UID and owner not in held:
            yield owner
    for uid in range(UID_BASE, PROBE_UID):
        if uid not in held and uid != owner:
            yield uid


def allocate(workspace_id: str, home: Path, taken: Iterable[int]) -> int:
    """The first of :func:`candidates` (what this agent alone would give)."""
    for uid in candidates(home, taken):
        return uid
    raise RuntimeError(f"{workspace_id}: every uid from {UID_BASE} to {PROBE_UID} is taken")


def home_owners(homes: Path) -> set[int]:
    """The owners of the homes under ``homes`` (kept homes hold their uid)."""
    owners = set()
    with contextlib.suppress(OSError):
        for entry in os.scandir(homes):
            with contextlib.suppress(OSError):
                owners.add(entry.stat(follow_symlinks=False).st_uid)
    return owners


def own(path: Path, uid: int) -> None:
    """``path`` (a home, a runtime dir) owned by ``uid`` with mode 0700; the whole tree is
    walked only when the top is not yet the user's (a first start, a home made before)."""
    path.mkdir(parents=True, exist_ok=True)
    if path.stat().st_uid != uid:
        os.lchown(path, uid, uid)
        for dirpath, dirnames, filenames in os.walk(path):
            for name in (*dirnames, *filenames):
                os.lchown(os.path.join(dirpath, name), uid, uid)
    os.chmod(path, 0o700)


def user_env(uid: int) -> dict[str, str]:
    """What a user entry would have said: the name ``getpass`` and pip read."""
    name = f"ws{uid}"
    return {"USER": name, "LOGNAME": name}


def _probe_interpreter(python: str, homes: Path, repo_root: Path) -> str | None:
    code = f"import os; os.chdir({str(homes)!r})"
    why = _run_as(PROBE_UID, [python, "-I", "-S", "-c", code], repo_root)
    if why is None:
        return None
    return (f"a workspace user cannot run {python} and reach {homes} ({why}); install "
            "environments, and keep the data dir, where other users may read them")


def _run_as(uid: int, argv: list[str], repo_root: Path) -> str | None:
    try:
        done = subprocess.run([*trampoline(uid), *argv], capture_output=True,
                              text=True, timeout=60, check=False, cwd="/",
                              env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(repo_root)})
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][-300:]
    return None
